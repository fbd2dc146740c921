"""What every judge backend shares: votes → verdict, hints, teacher log-probs, failure handling.

A backend implements two coroutines, :meth:`Judge.score_votes` and :meth:`Judge.hint_votes`; this
class runs them concurrently, applies the voting rules of :mod:`openclaw_rl.judge.voting`, and —
when a hint was kept and OPD is on — asks the teacher for log-probs of the turn's response tokens.

Failure rule: an outage (API timeout, refused key, rate limit after retries) is
raised by a backend as :class:`JudgeUnavailable` and comes back as ``JudgeResult(error=...)`` — never
as a score of 0, which would silently feed the at-least-one rule with noise. An unparsable reply is
not an outage: it is an invalid vote (``score=None``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from openclaw_rl.config import Config
from openclaw_rl.judge.errors import JudgeUnavailable, TeacherUnavailable
from openclaw_rl.judge.hindsight import mask_unseen_figures, seen_text, with_earlier_hints
from openclaw_rl.judge.voting import majority, select_hint
from openclaw_rl.types import JudgeResult, NextState, Turn, Vote

log = logging.getLogger("openclaw_rl.judge")


def response_text(turn: Turn) -> str:
    """What the judge reads as the assistant's response: its text plus any tool calls."""
    text = turn.response_text or ""
    if turn.tool_calls:
        calls = []
        for c in turn.tool_calls:
            fn = c.get("function", c) if isinstance(c, dict) else {}
            calls.append(f"{fn.get('name', '?')}({fn.get('arguments', '')})")
        text = (text + "\n" if text else "") + "[tool calls] " + "; ".join(calls)
    return text


class Judge(ABC):
    """A PRM judge: ``await judge(turn)`` for the service, ``await score(response, state)`` for debugging."""

    #: Backend name shown in logs and the debug command.
    name: str = "judge"

    def __init__(self, cfg: Config, teacher: object | None = None):
        self.cfg = cfg
        self.prm = cfg.prm_service
        self._teacher = teacher
        self._teacher_error: str | None = None

    # ------------------------------------------------------------------ backend hooks
    @abstractmethod
    async def score_votes(self, response: str, next_state: NextState) -> list[Vote]:
        """``vote_count`` evaluative votes (invalid ones with ``score=None``).
        Raise :class:`JudgeUnavailable` on an outage."""

    @abstractmethod
    async def hint_votes(self, response: str, next_state: NextState) -> list[Vote]:
        """``vote_count`` hint votes: ``score=1`` with ``hint`` or ``score=-1``."""

    def make_teacher(self) -> object:
        """The teacher for OPD; see :func:`openclaw_rl.judge.make_teacher`. Overridable."""
        from openclaw_rl.judge import make_teacher

        return make_teacher(self.cfg)

    # ------------------------------------------------------------------ public API
    async def score(self, response: str, next_state: NextState) -> JudgeResult:
        """Evaluative score and (when ``extract_instruction``) the hint; no teacher part."""
        start = time.perf_counter()
        try:
            result = await self._verdict(response, next_state)
        except JudgeUnavailable as exc:
            return JudgeResult(error=str(exc), elapsed_s=time.perf_counter() - start)
        result.elapsed_s = time.perf_counter() - start
        return result

    async def judge(self, turn: Turn, earlier_hints: Sequence[str] = ()) -> JudgeResult:
        """Judge a stored turn: score, hint, and teacher log-probs when a hint was kept and
        ``training.opd_enabled``. ``earlier_hints``: what the turn's user asked for before (newest
        first; the judge loop reads them for user replies when ``hint_memory`` is on); the teacher
        reads them before this turn's hint (:func:`with_earlier_hints`). Never
        raises for an outage; returns ``JudgeResult(error=...)``."""
        start = time.perf_counter()
        if turn.next_state is None:
            return JudgeResult(error=f"turn {turn.key} has no next state yet; nothing to judge")
        try:
            response = response_text(turn)
            result = await self._verdict(response, turn.next_state)
            if result.hint and self.prm.hint_facts == "mask" and turn.next_state.role == "user":
                result.hint = mask_unseen_figures(result.hint, seen_text(turn.messages, response))
            if result.hint and self.cfg.training.opd_enabled and turn.response_ids:
                seen = seen_text(turn.messages, response)
                await self._add_teacher(turn, result, with_earlier_hints(result.hint, earlier_hints, seen))
        except JudgeUnavailable as exc:
            return JudgeResult(error=str(exc), elapsed_s=time.perf_counter() - start)
        result.elapsed_s = time.perf_counter() - start
        return result

    async def close(self) -> None:
        """Release network clients; models stay cached for the process."""
        return None

    # ------------------------------------------------------------------ internals
    async def _verdict(self, response: str, next_state: NextState) -> JudgeResult:
        if next_state.rating is not None:
            return await self._explicit(response, next_state, next_state.rating)
        if self.prm.extract_instruction:
            votes, hint_votes = await asyncio.gather(
                self.score_votes(response, next_state), self.hint_votes(response, next_state)
            )
        else:
            votes, hint_votes = await self.score_votes(response, next_state), []
        return JudgeResult(
            score=majority(votes, self.prm.reward_space),
            votes=votes,
            hint=select_hint(hint_votes) if hint_votes else None,
            hint_votes=hint_votes,
        )

    async def _explicit(self, response: str, state: NextState, rating: int) -> JudgeResult:
        """The user's own rating (``POST /v1/feedback``) is decisive: every vote is the rating. Its
        comment, when there is one, is the next state the backend draws a hint from."""
        votes = [
            Vote(raw=f"explicit feedback: the user rated this response {rating:+d}", score=rating)
            for _ in range(self.prm.vote_count)
        ]
        hint_votes: list[Vote] = []
        if self.prm.extract_instruction and state.content.strip():
            comment = NextState(role="user", content=state.content)
            hint_votes = await self.hint_votes(response, comment)
        return JudgeResult(
            score=rating,
            votes=votes,
            hint=select_hint(hint_votes) if hint_votes else None,
            hint_votes=hint_votes,
        )

    async def _add_teacher(self, turn: Turn, result: JudgeResult, hint: str) -> None:
        if self._teacher_error is not None:
            return  # already reported once: the RL part still trains, OPD is off for this setup
        try:
            if self._teacher is None:
                self._teacher = await asyncio.to_thread(self.make_teacher)
            out = await self._teacher.score(turn, hint)  # type: ignore[attr-defined]
        except TeacherUnavailable as exc:
            self._teacher_error = str(exc)
            log.error("[opd] teacher unavailable, OPD samples disabled: %s", exc)
            return
        if len(out.logprobs) != len(turn.response_ids):
            raise JudgeUnavailable(
                f"teacher returned {len(out.logprobs)} log-probs for "
                f"{len(turn.response_ids)} response tokens of turn {turn.key}"
            )
        result.teacher_hint = hint
        result.teacher_logprobs = out.logprobs
        result.teacher_topk_ids = out.topk_ids
        result.teacher_topk_logprobs = out.topk_logprobs
        result.teacher_context_len = out.context_len
