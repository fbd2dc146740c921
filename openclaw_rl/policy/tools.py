"""Tools in, tool calls out: how a model without native tool support takes part in function calling.

The embedded chat template (ChatML) knows nothing about tools, so the service renders them itself:

* the ``tools`` list becomes a block appended to the system message, listing each function's JSON
  schema and asking for calls in the form ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* an assistant message that carried ``tool_calls`` is rendered back into that same markup, and a
  ``tool`` message keeps its role (ChatML accepts any role name), so a multi-step conversation
  round-trips exactly;
* after generation :func:`parse_tool_calls` finds the markup in the sampled text and returns OpenAI
  ``tool_calls`` plus the remaining content. The token ids recorded for training are the sampled ones,
  markup included — the text transformation never touches them.

``developer`` is mapped to ``system`` and ``environment`` keeps its own role, for the same reason.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from openclaw_rl.policy.protocol import ChatMessage, ToolDef

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
DEFAULT_SYSTEM = "You are a helpful AI assistant."


def tools_block(tools: list[ToolDef]) -> str:
    """The instruction text that describes the available functions to the model."""
    lines = ["# Tools", "", "You may call one or more of these functions. Their JSON schemas:"]
    for t in tools:
        spec = {
            "name": t.function.name,
            "description": t.function.description or "",
            "parameters": t.function.parameters or {"type": "object", "properties": {}},
        }
        lines.append(json.dumps(spec, ensure_ascii=False))
    lines += [
        "",
        "To call a function, reply with one block per call, exactly:",
        f'{OPEN}{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}{CLOSE}',
    ]
    return "\n".join(lines)


def _render_calls(msg: ChatMessage) -> str:
    parts = [msg.text] if msg.text else []
    for call in msg.tool_calls or []:
        try:
            args: Any = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            args = call.function.arguments  # keep what the client sent; the model saw it that way
        parts.append(
            OPEN + json.dumps({"name": call.function.name, "arguments": args}, ensure_ascii=False) + CLOSE
        )
    return "\n".join(parts)


def template_messages(messages: list[ChatMessage], tools: list[ToolDef] | None) -> list[dict[str, str]]:
    """``{role, content}`` string messages ready for ``apply_chat_template``."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        content = _render_calls(m) if m.role == "assistant" and m.tool_calls else m.text
        out.append({"role": role, "content": content})
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + block})
    return out


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
