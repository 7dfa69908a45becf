"""peerd: the daemon that links coding-agent machines."""

__version__ = "0.1.0"
