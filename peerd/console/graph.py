"""An orchestration's packets as a dependency graph, laid out for a server-rendered SVG (pure).

Each packet is a node in the column of its depth (the longest chain of dependencies before it),
in plan order within the column; each dependency is an edge from the packet it waits for. A
dependency on an unknown packet, or a cycle, never loops: depth is bounded by the packet count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NODE_W, NODE_H = 168, 48
GAP_X, GAP_Y, PAD = 56, 20, 12


@dataclass(frozen=True)
class Node:
    id: str
    state: str
    x: int
    y: int
    depth: int


@dataclass(frozen=True)
class Edge:
    source: str  # the packet depended on
    target: str  # the packet that waits for it
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Graph:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


def depths(deps: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Longest dependency chain before each packet (0 for one that waits for none)."""
    depth = dict.fromkeys(deps, 0)
    for _ in range(len(deps)):  # at most n rounds: a cycle stops growing here instead of forever
        changed = False
        for node, before in deps.items():
            for dep in before:
                if dep in depth and dep != node and depth[dep] + 1 > depth[node]:
                    depth[node] = min(depth[dep] + 1, len(deps))
                    changed = True
        if not changed:
            break
    return depth


def layout(packets: Sequence[Mapping[str, Any]]) -> Graph:
    deps = {str(p["id"]): [str(d) for d in (p.get("dependsOn") or [])] for p in packets}
    state = {str(p["id"]): str(p.get("state") or "queued") for p in packets}
    depth = depths(deps)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for pid in deps:  # plan order within each column
        d = depth[pid]
        row = rows.get(d, 0)
        rows[d] = row + 1
        x = PAD + d * (NODE_W + GAP_X)
        y = PAD + row * (NODE_H + GAP_Y)
        nodes[pid] = Node(pid, state[pid], x, y, d)
    edges = [
        Edge(
            dep,
            pid,
            nodes[dep].x + NODE_W,
            nodes[dep].y + NODE_H // 2,
            nodes[pid].x,
            nodes[pid].y + NODE_H // 2,
        )
        for pid, before in deps.items()
        for dep in before
        if dep in nodes and dep != pid
    ]
    columns = max(depth.values(), default=-1) + 1
    height_rows = max(rows.values(), default=0)
    width = PAD * 2 + max(columns, 1) * NODE_W + max(columns - 1, 0) * GAP_X
    height = PAD * 2 + max(height_rows, 1) * NODE_H + max(height_rows - 1, 0) * GAP_Y
    return Graph(list(nodes.values()), edges, width, height)
