"""What a tool call item keeps of peerd's own task tools' answers (pure).

`delegate_task` and `task_cancel` answer the whole task (its title, lineage, remote child,
placement, times: about a kilobyte), which the task itself holds and `task_status` reads. Their
tool call item keeps a reference instead, `{"taskId": ..., "status": ...}` (the status as the call
answered it), so a delegating thread's items stay small (its first page within the 3.8 KiB a peer
product reads at once). The same shape either way the provider reported the answer: a mapping (the
scripted provider) stays a mapping, JSON text (Codex, Claude, Gemini: MCP content) stays JSON
text. An answer that is neither (an error, a clipped text) is kept as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["REFERENCED_TOOLS", "task_reference"]

REFERENCED_TOOLS = frozenset({"delegate_task", "task_cancel"})
SERVER = "peerd"  # the name peerd's MCP server has in every provider's configuration


def task_reference(kind: str, text: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The item's data, with a task tool's echoed answer replaced by a reference to the task."""
    if kind != "tool_call":
        return data
    tool = data.get("tool", text)  # the scripted provider names it in the text
    if tool not in REFERENCED_TOOLS or data.get("server") not in (None, SERVER):
        return data
    result = data.get("result")
    answer = result
    if isinstance(result, str):
        try:
            answer = json.loads(result)
        except ValueError:
            return data
    if not isinstance(answer, dict) or not isinstance(answer.get("taskId"), str):
        return data
    reference = {"taskId": answer["taskId"], "status": answer.get("status")}
    kept = json.dumps(reference, separators=(",", ":")) if isinstance(result, str) else reference
    return {**data, "result": kept}
