"""PRM / judge service: turns a next state into reward, hints and teacher log-probs.

Public entry points::

    judge = make_judge(cfg)                       # backend from [prm_service] backend
    result = await judge.judge(turn)              # JudgeResult: score, votes, hint, teacher log-probs
    result = await judge.score(response, state)   # no teacher part (debug command, bench)

Backends: ``minilm`` (embedded default: embedding classifier, extractive hints), ``local`` (an LLM in
this process, scored by answer-word probabilities), anything else (``api``, ``taotoken``, any channel
name) = the OpenAI-compatible API in ``[api]``. The service loop is :mod:`openclaw_rl.judge.loop`.
"""

from __future__ import annotations

from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.judge.base import Judge
from openclaw_rl.judge.errors import JudgeUnavailable, TeacherUnavailable
from openclaw_rl.judge.teacher import ApiTeacher, LocalTeacher

__all__ = ["Judge", "JudgeUnavailable", "TeacherUnavailable", "make_judge", "make_teacher"]


def make_judge(cfg: Config, teacher: Any | None = None) -> Judge:
    """The judge named by ``cfg.prm_service.backend``.

    ``teacher`` (optional) is an object with ``async score(turn, hint) -> TeacherOutput``, e.g. a
    :class:`LocalTeacher` around a model already in memory; by default one is built on first need
    by :func:`make_teacher`.
    """
    backend = cfg.prm_service.backend
    if backend == "minilm":
        from openclaw_rl.judge.minilm import MiniLMJudge

        return MiniLMJudge(cfg, teacher)
    if backend == "local":
        from openclaw_rl.judge.local import LocalJudge

        return LocalJudge(cfg, teacher)
    from openclaw_rl.judge.api import ApiJudge

    return ApiJudge(cfg, teacher)


def make_teacher(cfg: Config) -> LocalTeacher | ApiTeacher:
    """The OPD teacher named by ``[prm_service] teacher``.

    * ``policy_base`` (default): the policy's frozen base model, ``[policy_service] model``;
    * ``api``: prompt log-probs from the ``[api]`` endpoint (``/v1/completions`` with echo), the
      judge's model name, the policy's tokenizer for the chat template;
    * anything else: a local model directory.

    Raises :class:`TeacherUnavailable` when the teacher cannot exist in this setup.
    """
    from openclaw_rl.runtime.models import ModelNotFoundError, load_tokenizer

    prm, pol = cfg.prm_service, cfg.policy_service
    if prm.teacher == "api":
        from openclaw_rl.judge.api import make_client

        if not cfg.api.base_url:
            raise TeacherUnavailable('[prm_service] teacher = "api" needs [api] base_url')
        try:
            tok = load_tokenizer(pol.model)
        except (ModelNotFoundError, OSError) as exc:
            raise TeacherUnavailable(f"the API teacher needs the policy's tokenizer locally: {exc}") from None
        return ApiTeacher(
            make_client(cfg), prm.model, tok, topk=prm.teacher_topk, placement=prm.hint_placement
        )
    from openclaw_rl.judge.teacher import shared_model

    name = pol.model if prm.teacher == "policy_base" else prm.teacher
    try:
        model, tok = shared_model(name, device=pol.device, dtype=pol.dtype)
    except (ModelNotFoundError, OSError) as exc:
        raise TeacherUnavailable(
            f"the OPD teacher model {name!r} cannot be loaded in this process ({exc}); OPD needs a local "
            'teacher or a log-prob-capable API ([prm_service] teacher = "api")'
        ) from None
    return LocalTeacher(
        model,
        tok,
        topk=prm.teacher_topk,
        chunk_size=cfg.training.logprob_chunk_size,
        placement=prm.hint_placement,
    )
