"""Packets that share files without depending on each other: their merges will likely conflict.

Found at plan time (`shared_files`), reported as warnings, and with `--serialize-overlaps` turned
into dependencies (`serialize_overlaps`: the later packet of each pair waits for the earlier).
Pure."""

from __future__ import annotations

from collections.abc import Sequence

from peerd.orchestrate.models import PacketSpec


def _norm(path: str) -> str:
    return "/".join(part for part in path.replace("\\", "/").split("/") if part not in ("", "."))


def files_overlap(a: Sequence[str], b: Sequence[str]) -> list[str]:
    """The entries of `a` that overlap an entry of `b`: the same path, or one a directory of the
    other."""
    shared: list[str] = []
    for x in a:
        nx = _norm(x)
        for y in b:
            ny = _norm(y)
            if nx == ny or nx.startswith(ny + "/") or ny.startswith(nx + "/"):
                shared.append(x if len(nx) >= len(ny) else y)
    return sorted(set(shared))


def _reaches(packets: Sequence[PacketSpec]) -> dict[str, set[str]]:
    deps = {p.id: set(p.depends_on) for p in packets}
    closure: dict[str, set[str]] = {}

    def visit(node: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if node in closure:
            return closure[node]
        out: set[str] = set()
        for dep in deps.get(node, set()):
            if dep not in seen:
                out |= {dep, *visit(dep, seen | {node})}
        closure[node] = out
        return out

    for packet in packets:
        visit(packet.id)
    return closure


def shared_files(packets: Sequence[PacketSpec]) -> list[tuple[str, str, list[str]]]:
    """Pairs of packets (plan order) that share files and do not depend on each other, with the
    shared paths: their merges will likely conflict."""
    reach = _reaches(packets)
    pairs: list[tuple[str, str, list[str]]] = []
    for i, first in enumerate(packets):
        for second in packets[i + 1 :]:
            if first.id in reach[second.id] or second.id in reach[first.id]:
                continue
            if shared := files_overlap(first.files, second.files):
                pairs.append((first.id, second.id, shared))
    return pairs


def overlap_warnings(pairs: Sequence[tuple[str, str, list[str]]], *, serialized: bool) -> list[str]:
    lines = []
    for first, second, shared in pairs:
        if serialized:
            lines.append(
                f"Packets {first} and {second} share {', '.join(shared)}: {second} runs after {first} "
                "(--serialize-overlaps)."
            )
        else:
            lines.append(
                f"Packets {first} and {second} both touch {', '.join(shared)} and do not depend on each "
                "other: their merges will likely conflict. Pass --serialize-overlaps to run "
                f"{second} after {first}."
            )
    return lines


def serialize_overlaps(packets: Sequence[PacketSpec]) -> list[PacketSpec]:
    """The plan with each later packet of a sharing pair depending on the earlier one (plan order:
    no cycle can appear)."""
    extra: dict[str, list[str]] = {}
    for first, second, _ in shared_files(packets):
        extra.setdefault(second, []).append(first)
    return [
        p.model_copy(
            update={"depends_on": [*p.depends_on, *[d for d in extra[p.id] if d not in p.depends_on]]}
        )
        if p.id in extra
        else p
        for p in packets
    ]
