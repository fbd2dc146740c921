"""What the other protocols (Responses, Messages) read from one chat-completion job.

Every protocol is served by the one chat path (:class:`~openclaw_rl.policy.serving.Serving`):
validation, admission, sessions, generation and recording happen there once. A protocol adapter
translates its request into a chat request, then renders the job's result in its own shape: the
finished ``chat.completion`` object (:meth:`Serving.complete`), or — streaming — the typed
:class:`ChatEvent` s below, read from the chat stream (so the tool-call hold-back and error events
are the chat path's own).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openclaw_rl.policy.serving import Job, Serving


@dataclass
class ChatEvent:
    """One step of a streamed chat job: new text, the tool calls (once, at the end), the finish
    reason (last), or an error (the job failed; nothing else follows)."""

    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # the text's entries, when asked for
    finish: str | None = None
    error: dict[str, Any] | None = None


async def chat_events(serving: Serving, job: Job) -> AsyncIterator[ChatEvent]:
    """The job's stream as :class:`ChatEvent` s."""
    async for chunk in serving.stream(job):
        for line in chunk.splitlines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                return
            obj = json.loads(data)
            if "error" in obj:
                yield ChatEvent(error=obj["error"])
                continue
            choices = obj.get("choices") or []
            if not choices:
                continue
            delta = choices[0].get("delta") or {}
            text, calls, finish = (
                delta.get("content") or "",
                delta.get("tool_calls"),
                choices[0].get("finish_reason"),
            )
            logprobs = (choices[0].get("logprobs") or {}).get("content") or []
            if text or calls or finish or logprobs:
                yield ChatEvent(text=text, tool_calls=calls, finish=finish, logprobs=logprobs)


def token_counts(job: Job) -> tuple[int, int]:
    """(prompt tokens, generated tokens) of a finished job."""
    final = job.final
    prompt = len(final.prompt_ids) if final is not None else len(job.gen.prompt_ids or [])
    return prompt, len(final.response_ids) if final is not None else 0
