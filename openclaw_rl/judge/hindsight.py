"""What a hint may carry to the teacher: how to answer, not this problem's answer.

A hint comes from the next state, so it can hold a fact the policy had no way to know when it
answered — "mention that the correct answer is 800", where 800 is the user's own knowledge. The
teacher that reads it prefers that number; on the next problem the policy has no such number, and
the pull towards "the correct answer is N" teaches a form it cannot fill (docs/training.md, "What
the checks showed"). With ``[prm_service] hint_facts = "mask"`` every number in a hint drawn from a
user's reply that appears nowhere in what the policy saw (the prompt's messages) or wrote (its
response) becomes ``...``, the placeholder users already write ("so the answer is ..."). A number
the conversation shows ("the question says 12 apples") stays, and so does every word: only the
figures a user brings from outside are hindsight.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from openclaw_rl.runtime.chat_format import message_text
from openclaw_rl.types import hint_words

#: A figure as people write it: "800", "1,250", "3.5", "-4"; "$800" keeps its sign outside the match.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?!\w)")
#: What stands in for a figure the policy could not have known.
PLACEHOLDER = "..."


def _value(figure: str) -> float:
    """The value of a :data:`_NUMBER` match (always a valid float once its commas are gone)."""
    return float(figure.replace(",", ""))


def figures(text: str) -> set[float]:
    """The numeric values written in ``text`` ("1,250" and "1250.0" are the same value)."""
    return {_value(m) for m in _NUMBER.findall(text)}


def seen_text(messages: list[dict[str, Any]], response: str) -> str:
    """Everything the policy saw or wrote in one turn: the prompt's messages and its response."""
    return "\n".join([*(message_text(m.get("content")) for m in messages), response])


def mask_unseen_figures(hint: str, seen: str) -> str:
    """``hint`` with each number whose value is not in ``seen`` replaced by :data:`PLACEHOLDER`.

    >>> mask_unseen_figures("Mention that the correct answer is 800.", "Lily has 12 apples")
    'Mention that the correct answer is ...'
    >>> mask_unseen_figures("You used 12 twice.", "Lily has 12 apples")
    'You used 12 twice.'
    """
    known = figures(seen)

    def swap(m: re.Match[str]) -> str:
        return m.group(0) if _value(m.group(0)) in known else PLACEHOLDER

    # "is 800." becomes "is ...", not "is ....": the placeholder's dots end the sentence too
    return re.sub(r"\.{3}\.+", PLACEHOLDER, _NUMBER.sub(swap, hint))


def with_earlier_hints(hint: str, earlier: Sequence[str], seen: str) -> str:
    """The teacher's hint for one turn: what the same user asked for before, then this turn's hint.

    A user states a wish once or twice, not on every turn ("no bullet points", then later "put the
    answer at the end"); a teacher that reads only this turn's hint pulls towards that one wish and
    leaves the others the user already named free to drift. ``earlier`` (newest first, as
    :meth:`~openclaw_rl.runtime.store.Store.recent_user_hints` gives them) is listed oldest first,
    and this turn's hint last, nearest the response. An earlier hint was drawn from another
    conversation, so its figures are about that problem: each one not in ``seen`` (this turn's
    prompt and response) becomes :data:`PLACEHOLDER`, whatever ``hint_facts`` says. One that says
    what this turn's hint says is left out; with none left the hint is this turn's alone.

    >>> with_earlier_hints("No bold please.", ["End with the answer, e.g. 800."], "Lily has 12")
    '- End with the answer, e.g. ...\\n- No bold please.'
    """
    now = hint_words(hint)
    kept = [mask_unseen_figures(h, seen) for h in reversed(earlier) if hint_words(h) not in (now, "")]
    if not kept:
        return hint
    return "\n".join(f"- {h.strip()}" for h in [*kept, hint])
