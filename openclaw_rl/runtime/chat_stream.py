"""Reading an OpenAI chat-completions stream: the pieces of a tool call, added up, and the error
body an endpoint answers instead.

A streamed reply sends each tool call in pieces (``delta.tool_calls``: an ``index``, then the id,
name and argument text in any number of chunks). The policy service reads such streams from a
forwarding engine (vLLM / SGLang) and the environment workers read them from the policy service;
both add the pieces up here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ErrorReply:
    """What an OpenAI-style error body (``{"error": {"message", "code", ...}}``) says; for a body of
    another shape, ``message`` is its text and ``code`` is None."""

    message: str
    code: str | None = None


def read_error(text: str) -> ErrorReply:
    """The error an endpoint answered, read from its body text (never raises)."""
    try:
        err = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return ErrorReply(text)
    if not isinstance(err, dict):
        return ErrorReply(str(err))

    def field(name: str) -> str | None:
        value = err.get(name)
        return value if isinstance(value, str) else None

    return ErrorReply(field("message") or text, field("code"))
