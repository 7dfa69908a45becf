"""The two-daemon fixtures of the durability tests (a laptop linked to a box, files the box's
confined runs can see), shared with the change-feed tests here."""

from tests.support.machines import m, signals

__all__ = ["m", "signals"]
