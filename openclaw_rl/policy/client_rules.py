"""What we know of particular clients' own traffic, so that only their users' turns are trained on.

An agent client sends the policy two kinds of request: turns of the conversation with its user, and
its own *housekeeping* — summarising a long history so it fits the window, flushing memories before
it does, and the like. Both arrive with the same provider headers, so both would be recorded as
``main`` turns and trained on: the policy would learn to write the client's summaries as if a user
had asked for them, and a housekeeping prompt would be judged as the user's reply to the turn before.

Each rule set below recognises one client's housekeeping from the request itself (the prompts it
writes, the shape of the request) and says how it decorates the user's messages. The serving layer
serves a recognised request as a ``side`` turn (answered, recorded, never trained on, and never the
next state of the turn before) and gives the judge the user's words without the decorations.
``[policy_service] client_rules`` names the rule sets in use (all by default; ``[]`` turns them off).

The OpenClaw rules come from recorded traffic of OpenClaw 2026.9.6 (``tests/fixtures/openclaw``):

* a compaction summary is a fresh two-message request whose system prompt begins "You are a
  context summarization assistant", with no tools;
  the same prompt serves the partial summaries, their merge and the summary of a turn's prefix;
* the pre-compaction memory flush is appended to the main conversation as a user message that
  begins "Pre-compaction memory flush.";
* after a context overflow, OpenClaw retries with a user message of its own that begins "Continue
  the current task from the existing transcript" — not the user's words, so not a next state;
* every user message is prefixed with a timestamp (``[Wed 2026-12-02 21:59 UTC] ``), and the first
  one carries a trailing ``Runtime: agent=... | session=... | ...`` line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openclaw_rl.policy.protocol import ChatMessage

_OPENCLAW_TIMESTAMP = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? [A-Z]{2,5}\] "
)
_OPENCLAW_RUNTIME = re.compile(r"\n+Runtime: agent=[^\n]*\s*$")


def _first_text(messages: Sequence[ChatMessage], role: str) -> str:
    for m in messages:
        if m.role == role:
            return m.text.lstrip()
    return ""


def _last_user_text(messages: Sequence[ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role == "user":
            return m.text.lstrip()
        if m.role == "assistant":
            return ""
    return ""


def _openclaw_housekeeping(messages: Sequence[ChatMessage], has_tools: bool) -> str | None:
    system = _first_text(messages, "system")
    if system.startswith("You are a context summarization assistant") and not has_tools:
        return "openclaw compaction summary"
    last = _openclaw_clean(_last_user_text(messages))
    if last.startswith("Pre-compaction memory flush."):
        return "openclaw memory flush"
    if last.startswith("Continue the current task from the existing transcript"):
        return "openclaw overflow retry"
    return None


def _openclaw_clean(text: str) -> str:
    return _OPENCLAW_RUNTIME.sub("", _OPENCLAW_TIMESTAMP.sub("", text, count=1)).strip()


@dataclass(frozen=True)
class ClientRules:
    """One client's housekeeping detector and user-message cleaner."""

    name: str
    housekeeping: Callable[[Sequence[ChatMessage], bool], str | None]
    clean_user_text: Callable[[str], str]


RULES: dict[str, ClientRules] = {
    "openclaw": ClientRules("openclaw", _openclaw_housekeeping, _openclaw_clean),
}


def housekeeping_reason(messages: Sequence[ChatMessage], has_tools: bool, rules: Sequence[str]) -> str | None:
    """Why this request is a client's own housekeeping (e.g. ``"openclaw compaction summary"``), or None."""
    for name in rules:
        reason = RULES[name].housekeeping(messages, has_tools)
        if reason:
            return reason
    return None


def clean_user_text(text: str, rules: Sequence[str]) -> str:
    """A user message without the decorations the named clients add (timestamps, runtime lines)."""
    for name in rules:
        text = RULES[name].clean_user_text(text)
    return text
