"""The data that flows between the four loops, one typed definition each.

A request served by the policy service becomes a :class:`Turn`. When the next turn of the same
session arrives, its newest message is the turn's :class:`NextState`. The judge reads
(turn, next state) and produces a :class:`JudgeResult`. The wiring in ``runtime/`` turns judged
turns into :class:`Sample` objects, which the trainer consumes. Every object round-trips through
JSON (``model_dump_json`` / ``model_validate_json``), which is how the durable store and the
offline ``samples.jsonl`` files hold them.

Token ids are never reconstructed from text: ``prompt_ids`` are the ids the engine was given and
``response_ids`` the ids it sampled, with ``response_logprobs`` the log-probs it sampled them at.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TurnType = Literal["main", "side"]
StateRole = Literal["user", "tool", "environment", "system"]
#: The user of a request that names no one, and of every turn recorded before users existed.
DEFAULT_USER = "default"


class NextState(BaseModel):
    """What followed an assistant turn: the user's reply, a tool's output, a terminal's result.

    ``truth``: in a simulated episode, the environment's own measure (0..1) of how well the turn met
    its user (a persona's preference score), sent as ``X-Turn-Truth`` with the next state. It is
    never shown to the judge nor used by the loss: it only measures how often the judge agrees with
    the truth (docs/training.md "Signal health"). None for real users.

    ``rating``: the user's own verdict (``POST /v1/feedback``): decisive for every judge, whose votes
    all agree with it; ``content`` is then the feedback's comment (a hint source for OPD), possibly
    empty.
    """

    role: StateRole
    content: str
    truth: float | None = Field(None, ge=0, le=1)
    rating: Literal[-1, 1] | None = None


class Turn(BaseModel):
    """One assistant response served by the policy service, with everything training needs."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    turn_index: int = Field(ge=0)
    turn_type: TurnType = "main"
    messages: list[dict[str, Any]] = Field(description="the chat messages of the prompt, as received")
    tools: list[dict[str, Any]] | None = Field(
        None, description="the function tools the prompt described, as received (the teacher reads them too)"
    )
    continues_final: bool = Field(
        False,
        description="the last message was the start of the reply (a prefill) that the response continues",
    )
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    response_text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str = "stop"
    policy_version: int = 0
    created_at: float = Field(default_factory=time.time)
    next_state: NextState | None = None
    user: str = DEFAULT_USER  # who was served (docs/users.md)
    response_id: str | None = None  # the completion's id as the client saw it (feedback names it)

    @model_validator(mode="after")
    def _aligned(self) -> Turn:
        if len(self.response_ids) != len(self.response_logprobs):
            raise ValueError(
                f"response_ids ({len(self.response_ids)}) and response_logprobs "
                f"({len(self.response_logprobs)}) must have one entry per sampled token"
            )
        return self

    @property
    def key(self) -> str:
        """Stable identifier of the turn inside the store."""
        return f"{self.session_id}:{self.turn_index}"


class Vote(BaseModel):
    """One judge vote. ``score`` is None when the reply had no parsable answer (invalid vote)."""

    raw: str
    score: int | None = None
    hint: str | None = None


def hint_words(text: str) -> str:
    """A hint's words, lower-cased and single-spaced: two hints with the same words are one wish
    said twice (the store's recent hints and the teacher's list both drop such repeats)."""
    return " ".join(text.lower().split())


class JudgeResult(BaseModel):
    """The judge's verdict on one turn.

    ``error`` set means the judgement *failed* (API down, key refused): the turn must be judged
    again later, and ``score`` is meaningless — a failure is never a score of 0.
    """

    score: int = 0
    votes: list[Vote] = Field(default_factory=list)
    hint: str | None = None
    hint_votes: list[Vote] = Field(default_factory=list)
    #: The hint the teacher read: ``hint``, or with the user's earlier hints before it
    #: (``[prm_service] hint_memory``); None when no teacher scored the turn.
    teacher_hint: str | None = None
    teacher_logprobs: list[float] | None = None
    teacher_topk_ids: list[list[int]] | None = None
    teacher_topk_logprobs: list[list[float]] | None = None
    teacher_context_len: int = 0
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class EpisodeTag(BaseModel):
    """What an environment says about the episode a session is: its group and, at the end, its outcome.

    Sent as ``X-Episode-Group`` / ``X-Episode-Group-Size`` on an episode's requests and
    ``X-Episode-Outcome`` on its closing one; kept on the session in the store.
    """

    group_id: str = Field(min_length=1, max_length=256)
    group_size: int = Field(1, ge=1, le=64)
    outcome: float | None = Field(None, ge=-1, le=1)


class Sample(BaseModel):
    """One training sample: a line of ``samples.jsonl`` and a row of the store.

    Lengths: ``rollout_logprobs``, ``loss_mask`` and (when present) ``teacher_logprobs`` have one
    entry per response token; ``teacher_topk_ids`` / ``teacher_topk_logprobs`` are
    ``[len(response_ids)][K]``. ``reward`` is the raw reward (the majority-vote score, an episode
    outcome, or both; None: no RL part) and ``advantage`` what the loss uses for it: the reward minus
    its baseline (group mean or running mean; None: the raw reward). ``group_id`` names the group of
    episodes the sample was compared within. ``teacher_logprobs`` None means no OPD part. ``weight``
    scales the sample's loss (staleness).
    """

    model_config = ConfigDict(extra="forbid")

    sample_id: str
    session_id: str
    turn_index: int
    policy_version: int = 0
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    loss_mask: list[int]
    reward: float | None = None
    advantage: float | None = None
    group_id: str | None = None
    teacher_logprobs: list[float] | None = None
    teacher_topk_ids: list[list[int]] | None = None
    teacher_topk_logprobs: list[list[float]] | None = None
    weight: float = 1.0
    user: str = DEFAULT_USER  # whose turn it is: per-user training trains only their adapter on it

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        n = len(self.response_ids)
        if n == 0:
            raise ValueError("response_ids is empty: a sample needs at least one response token")
        for name in (
            "rollout_logprobs",
            "loss_mask",
            "teacher_logprobs",
            "teacher_topk_ids",
            "teacher_topk_logprobs",
        ):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries, response_ids has {n}")
        if (self.teacher_topk_ids is None) != (self.teacher_topk_logprobs is None):
            raise ValueError("teacher_topk_ids and teacher_topk_logprobs come together")
        for name in ("reward", "advantage"):  # a NaN made its whole mini-batch's loss NaN, skipped
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(
                f"loss_mask holds {next(m for m in self.loss_mask if m not in (0, 1))}; each entry is 0 or 1"
            )
        if self.teacher_topk_ids is not None and len({len(row) for row in self.teacher_topk_ids}) > 1:
            raise ValueError("teacher_topk_ids rows have different lengths: one K for every token")
        return self

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def ended_by_itself(self, stop_ids: frozenset[int]) -> bool:
        """Whether the response ended with one of the policy's stop tokens, not cut at ``max_tokens``."""
        return self.response_ids[-1] in stop_ids

    @property
    def rl_signal(self) -> float | None:
        """The scalar the policy-gradient term uses (eq. 5): the advantage, else the raw reward."""
        return self.advantage if self.advantage is not None else self.reward
