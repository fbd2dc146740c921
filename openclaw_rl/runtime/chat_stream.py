"""Reading an OpenAI chat-completions stream: the pieces of a tool call, added up.

A streamed reply sends each tool call in pieces (``delta.tool_calls``: an ``index``, then the id,
name and argument text in any number of chunks). The policy service reads such streams from a
forwarding engine (vLLM / SGLang) and the environment workers read them from the policy service;
both add the pieces up here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def add_tool_call_deltas(
    calls: dict[int, dict[str, Any]], deltas: Iterable[Mapping[str, Any]] | None
) -> None:
    """Fold one chunk's ``delta.tool_calls`` into ``calls`` (index -> an OpenAI tool call)."""
    for tc in deltas or []:
        slot = calls.setdefault(
            int(tc.get("index", 0)),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        slot["id"] = tc.get("id") or slot["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""


def tool_calls_in_order(calls: dict[int, dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The added-up calls in index order; None if there were none."""
    return [calls[i] for i in sorted(calls)] or None
