"""The rules for turning a judged turn into training samples, in one place.

* a judged turn with score ±1 yields an RL part (``reward`` = score, every response token masked in);
* a positive hint with teacher log-probs yields an OPD part (``teacher_logprobs``), whatever the score;
* both parts of one turn travel in one :class:`Sample` (the combined loss adds them), a missing part
  is ``None`` and contributes zero;
* a score-0 turn with no hint yields nothing (loss mask 0 everywhere is the same as no sample);
* a session whose judged turns all scored 0 still contributes one turn (the at-least-one
  guarantee): :func:`guarantee_sample` picks it once the session is done.
"""

from __future__ import annotations

from openclaw_rl.config import TrainingConfig
from openclaw_rl.types import JudgeResult, Sample, Turn


def build_samples(turn: Turn, result: JudgeResult, training: TrainingConfig) -> list[Sample]:
    """Samples for one successfully judged main turn (empty when it carries no signal)."""
    if not result.ok or not turn.response_ids:
        return []
    reward = float(result.score) if result.score != 0 and training.binary_rl_weight > 0 else None
    has_opd = training.opd_enabled and result.teacher_logprobs is not None and result.hint is not None
    if reward is None and not has_opd:
        return []
    return [_sample(turn, reward, result if has_opd else None, training)]


def guarantee_sample(turns: list[Turn], results: dict[int, JudgeResult], training: TrainingConfig) -> Sample | None:
    """The at-least-one rule: the latest judged main turn of a session that produced no sample,
    kept with reward 0 (so only its OPD part, KL and entropy terms act on it)."""
    judged = [t for t in turns if t.turn_type == "main" and t.turn_index in results and t.response_ids]
    if not judged:
        return None
    turn = judged[-1]
    result = results[turn.turn_index]
    has_opd = training.opd_enabled and result.teacher_logprobs is not None and result.hint is not None
    return _sample(turn, 0.0, result if has_opd else None, training, suffix="guarantee")


def _sample(turn: Turn, reward: float | None, opd: JudgeResult | None, training: TrainingConfig,
            suffix: str = "") -> Sample:
    use_topk = training.topk_distill and opd is not None and opd.teacher_topk_ids is not None
    return Sample(
        sample_id=f"{turn.session_id}:{turn.turn_index}{':' + suffix if suffix else ''}",
        session_id=turn.session_id,
        turn_index=turn.turn_index,
        policy_version=turn.policy_version,
        prompt_ids=turn.prompt_ids,
        response_ids=turn.response_ids,
        rollout_logprobs=turn.response_logprobs,
        loss_mask=[1] * len(turn.response_ids),
        reward=reward,
        teacher_logprobs=opd.teacher_logprobs if opd is not None else None,
        teacher_topk_ids=opd.teacher_topk_ids if use_topk else None,
        teacher_topk_logprobs=opd.teacher_topk_logprobs if use_topk else None,
    )
