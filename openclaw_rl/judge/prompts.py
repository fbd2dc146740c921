"""The judge prompts, each written once, and the parsers for their answers.

Two judges read the same (response, next state) pair:

* the *evaluative* judge answers a score in {+1, -1, 0} on a final ``SCORE:`` line;
* the *hint* judge answers ``VERDICT: +1`` with a concrete 1–3 sentence hint between
  ``[HINT_START]`` and ``[HINT_END]``, or ``VERDICT: -1`` with none.

The local LLM backend does not generate free text for the evaluative judge: it reads the
probabilities of the three answer words (``GOOD`` / ``BAD`` / ``UNCLEAR``) after
:func:`evaluative_messages` with ``short_answer=True`` — so the answer words live here too.
"""

from __future__ import annotations

import re
import unicodedata

from openclaw_rl.types import NextState

HINT_START = "[HINT_START]"
HINT_END = "[HINT_END]"
#: Heading under which a hint is appended to the last user message for the teacher.
HINT_HEADING = "[Hint / instruction from hindsight]"
#: Minimum length of a kept hint.
MIN_HINT_CHARS = 10
#: A hint longer than this is no hint (they are 1-3 sentences): not selected.
MAX_HINT_CHARS = 2000

# Answer words for probability-scored judging: one word per score, each a distinct first token.
ANSWER_WORDS: dict[int, str] = {1: "GOOD", -1: "BAD", 0: "UNCLEAR"}

_ROLE_NAMES = {
    "user": "the user's next message",
    "tool": "the tool / terminal output returned after the action",
    "environment": "the environment's change after the action (e.g. a web page)",
    "system": "a system message that followed",
}

EVALUATIVE_SYSTEM = """You grade one turn of an AI assistant by looking at what happened NEXT.
You see the assistant's response and the next state that followed it: the user's reply, a tool's
or terminal's output, or a change in an environment such as a web page. Judge the response only by
the evidence in the next state.

Score +1 (the response moved things forward) when the next state shows progress, for example:
- the user thanks the assistant, confirms it is right, or moves on to a new step or request;
- a tool or terminal returned a successful result (exit code 0, valid data, "saved", "ok");
- the page changed in the way the action intended.

Score -1 (the response fell short) when the next state shows a problem caused by the response:
- the user asks for a redo or retry, corrects it, rephrases the same request, or complains;
- the user asks to change something about the response ("no bold please", "shorter", "less formal")
  — a change request is negative feedback on this response, not a neutral new instruction;
- a tool or terminal returned an error, a traceback, a non-zero exit code or "command not found";
- the page shows an error, or did not change when it should have.

Score 0 only when the next state carries no evidence either way (small talk, an unrelated topic,
"ok", a page still loading).

Think briefly, then end with exactly one line: SCORE: +1, SCORE: -1 or SCORE: 0"""

EVALUATIVE_SHORT_SYSTEM = EVALUATIVE_SYSTEM.rsplit("\n\n", 1)[0] + (
    "\n\nAnswer with exactly one word: GOOD (score +1), BAD (score -1) or UNCLEAR (score 0)."
)

# With ``reward_space = [1, -1]`` a 0 answer is an invalid vote: the judge is not offered one.
_NO_NEUTRAL = """There is no neutral score: when the evidence is weak, choose the closer of +1 and -1.

Think briefly, then end with exactly one line: SCORE: +1 or SCORE: -1"""
_NO_NEUTRAL_SHORT = (
    "There is no neutral score: when the evidence is weak, choose the closer of +1 and -1.\n\n"
    "Answer with exactly one word: GOOD (score +1) or BAD (score -1)."
)


def evaluative_system(reward_space: list[int], short_answer: bool = False) -> str:
    """The evaluative judge's instructions, offering only the scores ``reward_space`` counts."""
    if 0 in reward_space:
        return EVALUATIVE_SHORT_SYSTEM if short_answer else EVALUATIVE_SYSTEM
    without_zero = EVALUATIVE_SYSTEM.rsplit("\n\n", 2)[0]  # drop the "Score 0" paragraph and the format
    return f"{without_zero}\n\n{_NO_NEUTRAL_SHORT if short_answer else _NO_NEUTRAL}"


HINT_SYSTEM = f"""You read one turn of an AI assistant and what happened NEXT (the user's reply, a tool's
or terminal's output, or an environment's change). Decide whether the next state tells us how the
response SHOULD have been different — a correction, a stated preference, an error that reveals the
right action.

If it does, answer "VERDICT: +1" and write a concrete hint of 1 to 3 sentences, addressed to the
assistant, that would have produced a better response. Put the hint between {HINT_START} and
{HINT_END}. State the instruction itself (e.g. "Write plain prose without bold text or numbered
lists."), not a description of the conversation.

If the next state gives no such direction (thanks, success, an unrelated question), answer
"VERDICT: -1" and write no hint.

Format:
VERDICT: +1
{HINT_START}your hint{HINT_END}
or
VERDICT: -1"""


#: What a judge request quotes of a response or a next state, at most: an 80,000-character log is
#: not judged better whole, and an endpoint's window would refuse it on every retry.
MAX_QUOTED_CHARS = 12_000


#: What the store keeps of one vote's raw reply: an endpoint that ignores the reply budget must
#: not grow every judgement by megabytes (its answer is parsed from the whole reply first).
MAX_VOTE_CHARS = 4_000


def shortened(text: str, limit: int) -> str:
    """``text`` with its middle left out past ``limit`` characters: a quarter of the head (a log's
    command), the rest of the tail (its outcome; a judge's answer line)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 4, limit - limit // 4
    return f"{text[:head]}\n[... {len(text) - head - tail} characters left out ...]\n{text[-tail:]}"


def _quoted(text: str) -> str:
    """``text`` stripped, its middle left out past :data:`MAX_QUOTED_CHARS`."""
    return shortened(text.strip(), MAX_QUOTED_CHARS)


def _pair_text(response: str, next_state: NextState) -> str:
    who = _ROLE_NAMES.get(next_state.role, next_state.role)
    return (
        f"Assistant response:\n<<<\n{_quoted(response)}\n>>>\n\n"
        f"Next state ({who}):\n<<<\n{_quoted(next_state.content)}\n>>>"
    )


def evaluative_messages(
    response: str,
    next_state: NextState,
    short_answer: bool = False,
    reward_space: list[int] | None = None,
) -> list[dict[str, str]]:
    """Chat messages for the evaluative judge; ``short_answer`` asks for one answer word, and
    ``reward_space`` (default: all three scores) decides whether 0 is offered."""
    system = evaluative_system(reward_space if reward_space is not None else [1, -1, 0], short_answer)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": _pair_text(response, next_state)},
    ]


def hint_messages(response: str, next_state: NextState) -> list[dict[str, str]]:
    """Chat messages for the hint (directive) judge."""
    return [
        {"role": "system", "content": HINT_SYSTEM},
        {"role": "user", "content": _pair_text(response, next_state)},
    ]


# The whole answer after the label is captured, then checked: "SCORE: 1/10", "1.5" or "VERDICT: 7"
# is an invalid vote, not a +1 read from its first digit. The full-width colon is how Chinese-tuned
# models often write it.
_SCORE_RE = re.compile(r"SCORE\s*[:=：]\s*\**\s*([+\-−–－＋]?\s*[^\s*]+)", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_VERDICT_RE = re.compile(r"VERDICT\s*[:=：]\s*\**\s*([+\-−–－＋]?\s*[^\s*\[]+)", re.IGNORECASE)
_UNIT = re.compile(r"[+-]?[01]")


# Signs as models and word processors write them: the minus sign, the en dash and the full-width
# forms ("SCORE: −1", "SCORE：－1") mean the same vote as ASCII.
_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0d": "-", "\uff0b": "+"})


_OPENERS, _CLOSERS = "([{\"'`「【（《", ")]}\"'`」】）》"


def _answer(token: str) -> int | None:
    """``+1`` / ``1`` / ``-1`` / ``0`` (full-width forms, a trailing full stop or comma, a closing
    bracket, or the whole answer in brackets or quotes allowed), else None. An opening bracket that
    does not close right after the answer is a list (``[-1, 0, +1]``: the options echoed), no vote."""
    token = unicodedata.normalize("NFKC", token).translate(_SIGNS).replace(" ", "").rstrip(".,;:!。")
    if token[:1] in _OPENERS:
        if token[-1:] not in _CLOSERS:
            return None
        token = token[1:-1]
    token = token.rstrip(_CLOSERS).rstrip(".,;:!。")
    return int(token) if _UNIT.fullmatch(token) else None


#: Spaces just inside a bracket around an answer, and an answer followed by another option.
_INNER_SPACE = re.compile(r"([(\[（【])\s+|\s+([)\]）】])")
_UNIT_AT = re.compile(r"[(\[（【\"'`]?\s*[+\-−–－＋]?\s*[01０１]")
_ALTERNATIVE = re.compile(
    r"[)\]）】\"'`]?\s*(?:or|/|\||,|，|或)\s*[(\[（【]?\s*[+\-−–－＋]?\s*[01０１]", re.IGNORECASE
)

_HINT_RE = re.compile(re.escape(HINT_START) + r"(.*?)" + re.escape(HINT_END), re.DOTALL)


def parse_score(text: str, reward_space: list[int]) -> int | None:
    """The score of an evaluative reply: its last ``SCORE:`` (or ``\\boxed{}``) answer.

    None (an invalid vote) when there is no answer or the answer is outside ``reward_space``.
    """
    text = _INNER_SPACE.sub(r"\1\2", text)  # "[ +1 ]" as "[+1]"
    found = _SCORE_RE.findall(text) or _BOXED_RE.findall(text)
    if not found:
        return None
    last = list(_SCORE_RE.finditer(text))
    if last:
        unit = _UNIT_AT.match(text, last[-1].start(1))
        if unit and _ALTERNATIVE.match(text, unit.end()):
            return None  # "SCORE: (+1) or (-1)", "SCORE: +1, -1": the options, not a vote
    score = _answer(found[-1])  # the last answer counts: a reply may think out loud before it
    return score if score in reward_space else None


def parse_hint_vote(text: str) -> tuple[int | None, str | None]:
    """``(verdict, hint)`` of a hint-judge reply; verdict None when unparsable.

    A ``+1`` verdict whose hint is missing keeps verdict +1 with hint None (it is then simply
    not eligible for selection); a ``-1`` verdict never carries a hint.
    """
    found = _VERDICT_RE.findall(text)
    hints = [h.strip() for h in _HINT_RE.findall(text) if h.strip()]
    if not found:
        # A reply that wrote a marked hint but forgot the verdict line still means +1.
        return (1, hints[-1]) if hints else (None, None)
    verdict = _answer(found[-1])
    if verdict not in (1, -1):
        return None, None  # "VERDICT: 7", "VERDICT: 0": an invalid vote, and its hint goes with it
    if verdict != 1:
        return -1, None
    return 1, (hints[-1] if hints else None)
