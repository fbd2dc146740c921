"""Tool calls out: how a model without native tool support takes part in function calling.

The prompt side (the ``tools`` list as a system block, earlier calls rendered back into
``<tool_call>`` markup) is :mod:`openclaw_rl.runtime.chat_format`, which the OPD teacher shares.
After generation :func:`parse_tool_calls` finds that markup in the sampled text and returns OpenAI
``tool_calls`` plus the remaining content. The token ids recorded for training are the sampled ones,
markup included — the text transformation never touches them.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from openclaw_rl.policy.protocol import ToolDef
from openclaw_rl.runtime.chat_format import CLOSE, OPEN

__all__ = ["CLOSE", "OPEN", "parse_tool_calls"]

_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


def parse_tool_calls(
    text: str, tools: list[ToolDef] | None
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """Split sampled text into (content, tool_calls). Only well-formed calls of a declared function
    become ``tool_calls``; anything else stays in the content, so nothing the model said is lost."""
    if not tools or OPEN not in text:
        return text, None
    names = {t.function.name for t in tools}
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in names:
            continue
        args = obj.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": args},
            }
        )
        kept.append(text[pos : m.start()])
        pos = m.end()
    if not calls:
        return text, None
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None), calls


def call_markup_start(text: str) -> int | None:
    """Where our call markup begins in ``text``: a whole ``<tool_call>``, or the start of one at the
    very end (``"<tool_"``, which the next tokens may complete); None when there is neither."""
    at = text.find(OPEN)
    if at >= 0:
        return at
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return len(text) - k
    return None


def without_unfinished_call(content: str | None) -> str | None:
    """``content`` less a tool call the reply started but did not finish (cut by ``max_tokens``):
    our call markup, whole or begun, is never reply text for a client."""
    if not content:
        return content
    at = call_markup_start(content)
    return content if at is None else (content[:at].rstrip() or None)


def without_call_markup(content: str | None) -> str | None:
    """``content`` less every call block in it, whole or begun: for a reply with tools switched
    off (``tool_choice = "none"``, or no tools sent) whose prompt shows earlier calls as markup,
    which a small model copies; a client asked for no call and must not read our markup as text."""
    if not content or OPEN[:2] not in content:
        return content
    # nothing before the first call is touched: a stream has sent it already, and what the client
    # reads whole must be what it read streamed
    kept = without_unfinished_call(_CALL.sub("", content).rstrip())
    return kept if kept and kept.strip() else None
