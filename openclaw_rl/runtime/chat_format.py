"""The one way a conversation becomes the prompt the model reads: for the policy and its teacher.

The serving engine renders each request's messages and tools into a prompt here, and the OPD
teacher renders a recorded turn's messages and tools (plus the hint) the same way. Were the two to
differ, the teacher's log-probs would differ from the student's for reasons that have nothing to do
with the hint, and the distillation signal would carry that difference into every update (measured
before they shared this module: a tool turn's prompt was 181 tokens for the policy and 37 for the
teacher, which pushed every reply token down by 0.46 on average before any hint; docs/training.md
"The teacher reads what the policy read").

The embedded chat template (ChatML) knows nothing about tools, so they are rendered as text:

* the ``tools`` list becomes a block appended to the system message (or to a default one), listing
  each function's JSON schema and asking for calls in the form
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* an assistant message that carried ``tool_calls`` is rendered back into that same markup, and a
  ``tool`` message keeps its role (ChatML accepts any role name), so a multi-step conversation
  round-trips exactly;
* ``developer`` is mapped to ``system``; every other role is kept.

Messages and tools are the OpenAI wire format, as a request sends them and a
:class:`~openclaw_rl.types.Turn` records them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_SYSTEM = "You are a helpful AI assistant."


def message_text(content: Any) -> str:
    """Message content as text: OpenAI content-part lists are joined by their text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The instruction text that describes the available functions to the model."""
    lines = ["# Tools", "", "You may call one or more of these functions. Their JSON schemas:"]
    for tool in tools:
        fn = tool.get("function") or {}
        spec = {
            "name": fn.get("name", ""),
            "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        lines.append(json.dumps(spec, ensure_ascii=False))
    lines += [
        "",
        "To call a function, reply with one block per call, exactly:",
        f'{OPEN}{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}{CLOSE}',
    ]
    return "\n".join(lines)


def _with_calls(text: str, calls: Sequence[Mapping[str, Any]]) -> str:
    parts = [text] if text else []
    for call in calls:
        fn = call.get("function") or {}
        raw = fn.get("arguments") or "{}"
        try:
            args: Any = json.loads(raw)
        except (json.JSONDecodeError, TypeError):
            args = raw  # keep what the client sent; the model saw it that way
        parts.append(
            OPEN + json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False) + CLOSE
        )
    return "\n".join(parts)


def template_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, str]]:
    """``{role, content}`` string messages ready for ``apply_chat_template``."""
    out: list[dict[str, str]] = []
    for m in messages:
        role = str(m.get("role", ""))
        text = message_text(m.get("content"))
        calls = m.get("tool_calls") if role == "assistant" else None
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _with_calls(text, calls) if calls else text,
            }
        )
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + block})
    return out


def prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    continue_final: bool = False,
) -> list[int]:
    """The token ids of the prompt awaiting the assistant's reply to ``messages`` (with ``tools``).

    ``continue_final``: the last message is the start of the assistant's reply (a prefill), which the
    model continues rather than answering after it."""
    text = tokenizer.apply_chat_template(
        template_messages(messages, tools),
        add_generation_prompt=not continue_final,
        continue_final_message=continue_final,
        tokenize=False,
    )
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
