"""The rules for turning judged turns into training samples, and their advantages, in one place.

* a judged turn with score ±1 yields an RL part (``reward`` = score, every response token masked in);
  its ``advantage`` is the score minus a running mean of the scores of its turn kind (the role of
  its next state: a user's reply, a tool's output, a terminal's result), so that an agent that
  mostly fails is not pushed away from everything it samples (``[training] advantage_baseline``);
* a positive hint with teacher log-probs yields an OPD part (``teacher_logprobs``), whatever the score;
* both parts of one turn travel in one :class:`Sample` (the combined loss adds them), a missing part
  is ``None`` and contributes zero;
* a score-0 turn with no hint yields nothing (loss mask 0 everywhere is the same as no sample);
* a session whose judged turns all scored 0 still contributes one turn (the at-least-one
  guarantee): :func:`guarantee_sample` picks it once the session is done;
* episodes played as a group (``[env_service] group_size``) wait until the whole group is judged;
  then :func:`group_samples` takes every reward relative to the group (below).

Group-relative advantages. The G episodes of a group play the same task under (nearly) the same
policy, so the group's mean reward is an estimate of the task's value and ``r - mean`` says whether
*this* attempt did better or worse than the policy usually does. A group whose rewards are all equal
(every attempt failed, or every one succeeded) says nothing about which behaviour to prefer, and
its advantages are exactly 0: it gives no policy-gradient push. The advantages are mean-centred
only, by default: dividing by the group's spread (GRPO's choice, ``group_std_normalize``) turns a
group of nearly equal rewards into full-size pushes and weights easy and hard tasks alike, which
with ±1 judge scores mostly amplifies judge noise.

What a group trains on (``[env_service] reward``) when its environment reports outcomes:

* ``judge``: each turn's score, relative to the scores of the group's turns at the same position;
* ``outcome``: the episode's verified outcome, relative to the group's outcomes, on every turn;
* ``both``: the judge's per-turn advantage, plus the outcome's at the episode's last turn;
* ``truth``: each turn's own truth (the simulated environment's score of it, 0..1, as -1..+1) in
  place of the judge's score, where the turn has one (:func:`turn_score`): an oracle for diagnosis.

Chat episodes have no verified outcome, so they are always judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from openclaw_rl.config import OUTCOME_REWARDS, RewardMode, TrainingConfig
from openclaw_rl.types import JudgeResult, Sample, Turn

#: Advantages smaller than this are zero: no policy-gradient part.
ZERO = 1e-9


@dataclass
class RunningBaseline:
    """A running mean of rewards per kind: the baseline of responses with no group to compare to.

    An exponential mean with bias correction (as Adam's moments): ``S <- m S + (1 - m) r``,
    ``W <- m W + (1 - m)``, ``b = S / W``; before the first reward of a kind ``b = 0``. Usage::

        baseline = RunningBaseline(momentum=0.9)
        a = baseline.advantage("user", -1.0)   # -1.0: nothing seen yet
        a = baseline.advantage("user", -1.0)   #  0.0: failing is what this kind usually does
        a = baseline.advantage("user", +1.0)   # +2.0
    """

    momentum: float = 0.9
    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def mean(self, kind: str) -> float:
        w = self.weights.get(kind, 0.0)
        return self.sums.get(kind, 0.0) / w if w > 0 else 0.0

    def advantage(self, kind: str, reward: float) -> float:
        """``reward - b(kind)``, then fold ``reward`` into ``b(kind)``."""
        adv = reward - self.mean(kind)
        m = self.momentum
        self.sums[kind] = m * self.sums.get(kind, 0.0) + (1 - m) * reward
        self.weights[kind] = m * self.weights.get(kind, 0.0) + (1 - m)
        return adv

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {"sums": dict(self.sums), "weights": dict(self.weights)}

    @classmethod
    def from_dict(cls, data: object, momentum: float) -> RunningBaseline:
        """From :meth:`to_dict`'s output (as kept in the store); anything else starts afresh."""
        if (
            isinstance(data, dict)
            and isinstance(data.get("sums"), dict)
            and isinstance(data.get("weights"), dict)
        ):
            return cls(
                momentum,
                {str(k): float(v) for k, v in data["sums"].items()},
                {str(k): float(v) for k, v in data["weights"].items()},
            )
        return cls(momentum)


def turn_kind(turn: Turn) -> str:
    """What kind of next state judged this turn: ``user``, ``tool``, ``environment`` (or ``none``)."""
    return turn.next_state.role if turn.next_state is not None else "none"


def turn_score(turn: Turn, result: JudgeResult, reward_mode: RewardMode) -> float:
    """The score a judged turn trains on: the judge's, or with ``reward_mode = "truth"`` the turn's
    truth mapped onto the judge's range (0 -> -1, 1 -> +1) when its next state carries one."""
    truth = turn.next_state.truth if turn.next_state is not None else None
    if reward_mode == "truth" and truth is not None:
        return 2.0 * truth - 1.0
    return float(result.score)


def build_samples(
    turn: Turn,
    result: JudgeResult,
    training: TrainingConfig,
    baseline: RunningBaseline | None = None,
    reward_mode: RewardMode = "judge",
) -> list[Sample]:
    """Samples for one successfully judged main turn (empty when it carries no signal).

    With ``baseline`` (and ``advantage_baseline = "mean"``) the RL part's advantage is the score
    minus the running mean of its turn kind, and the score is folded into that mean. ``reward_mode``
    is ``[env_service] reward`` (:func:`turn_score`)."""
    if not result.ok or not turn.response_ids:
        return []
    score = turn_score(turn, result, reward_mode)
    reward = score if abs(score) > ZERO and training.binary_rl_weight > 0 else None
    advantage = None
    if reward is not None and baseline is not None and training.advantage_baseline == "mean":
        advantage = baseline.advantage(turn_kind(turn), reward)
    has_opd = _has_opd(result, training)
    if reward is None and not has_opd:
        return []
    return [_sample(turn, reward, result if has_opd else None, training, advantage=advantage)]


@dataclass
class Episode:
    """One finished member of a group, as the judge loop hands it to :func:`group_samples`."""

    session_id: str
    turns: list[Turn]  # its judged main turns, in order
    results: dict[int, JudgeResult]  # turn_index -> successful judgement
    outcome: float | None = None  # the environment's verified outcome, when it reported one


@dataclass(frozen=True)
class GroupStats:
    """Signal health of one group: episode rewards' mean and spread, and whether it said nothing."""

    episodes: int
    reward_mean: float
    reward_spread: float
    zero_advantage: bool


def _relative(values: list[float], std_normalize: bool) -> list[float]:
    """``v - mean`` (divided by the spread when ``std_normalize`` and the spread is not 0)."""
    mean = sum(values) / len(values)
    out = [v - mean for v in values]
    if std_normalize:
        spread = math.sqrt(sum(d * d for d in out) / len(out))
        if spread > ZERO:
            out = [d / spread for d in out]
    return out


def group_samples(
    group_id: str,
    episodes: list[Episode],
    training: TrainingConfig,
    reward_mode: RewardMode,
    baseline: RunningBaseline | None = None,
) -> tuple[list[Sample], GroupStats]:
    """The samples of one finished group, with group-relative advantages (see the module docstring).

    ``reward_mode`` is ``[env_service] reward``; an episode without an outcome is judged whatever it
    says. A group of one episode has nobody to compare with and falls back to ``baseline``."""
    rl = training.binary_rl_weight > 0
    use_outcome = reward_mode in OUTCOME_REWARDS and all(e.outcome is not None for e in episodes)
    use_judge = reward_mode in ("judge", "both") or not use_outcome
    turns = [[t for t in e.turns if t.turn_index in e.results and t.response_ids] for e in episodes]
    score = {
        (i, p): turn_score(t, e.results[t.turn_index], reward_mode)
        for i, e in enumerate(episodes)
        for p, t in enumerate(turns[i])
    }
    adv: dict[tuple[int, int], float] = dict.fromkeys(score, 0.0)
    reward: dict[tuple[int, int], float] = dict.fromkeys(score, 0.0)
    alone = len(episodes) < 2 or training.advantage_baseline == "none"
    if use_judge:
        for p in {p for _, p in score}:
            keys = [k for k in score if k[1] == p]
            values = [score[k] for k in keys]
            if training.advantage_baseline == "none":
                rel = values
            elif alone or len(keys) < 2:
                # Nobody at this position to compare with: the running mean of the turn's kind.
                rel = [
                    baseline.advantage(turn_kind(turns[i][q]), score[(i, q)]) if baseline else score[(i, q)]
                    for i, q in keys
                ]
            else:
                rel = _relative(values, training.group_std_normalize)
            for k, v, a in zip(keys, values, rel, strict=True):
                reward[k] += v
                adv[k] += a
    returns = [
        sum(score[(i, p)] for p in range(len(turns[i]))) / max(1, len(turns[i])) if use_judge else 0.0
        for i in range(len(episodes))
    ]
    if use_outcome:
        outcomes = [float(e.outcome) for e in episodes]  # type: ignore[arg-type]
        if training.advantage_baseline == "none":
            rel_o = outcomes
        elif alone:
            rel_o = [baseline.advantage("outcome", o) if baseline else o for o in outcomes]
        else:
            rel_o = _relative(outcomes, training.group_std_normalize)
        for i, (o, a) in enumerate(zip(outcomes, rel_o, strict=True)):
            returns[i] += o
            # outcome only: every turn of the episode shares it; both: it lands on the last turn
            positions = (
                range(len(turns[i])) if reward_mode == "outcome" else range(len(turns[i]) - 1, len(turns[i]))
            )
            for p in positions:
                if p >= 0:
                    reward[(i, p)] += o
                    adv[(i, p)] += a
    samples: list[Sample] = []
    for (i, p), a in sorted(adv.items()):
        turn = turns[i][p]
        result = episodes[i].results[turn.turn_index]
        has_opd = _has_opd(result, training)
        has_rl = rl and abs(a) > ZERO
        if not has_rl and not has_opd:
            continue
        samples.append(
            _sample(
                turn,
                reward[(i, p)] if has_rl else None,
                result if has_opd else None,
                training,
                advantage=a if has_rl else None,
                group_id=group_id,
            )
        )
    # an episode with no judged turn (closed before its first answer) has no return, not a return of 0
    scored = [r for i, r in enumerate(returns) if turns[i] or use_outcome]
    mean = sum(scored) / len(scored) if scored else 0.0
    spread = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored)) if scored else 0.0
    stats = GroupStats(len(episodes), mean, spread, zero_advantage=all(abs(a) <= ZERO for a in adv.values()))
    return samples, stats


def truth_counts(turns: list[Turn], results: dict[int, JudgeResult]) -> dict[str, float]:
    """Judge–truth agreement counters of judged turns alone (not in a group), for the signal-health
    counters: a turn's truth says +1 when the simulated user was satisfied (truth 1), else -1.

    ``truth_*`` keys: turns with a truth, the sum of their truths; pairs where the judge gave ±1 and
    how many of them agree; and, per judge sign, the count and truth sum (do the turns judged +1
    satisfy the user more than those judged -1?)."""
    items: list[_TruthItem] = []
    for t in turns:
        if t.turn_index in results and t.next_state is not None and t.next_state.truth is not None:
            score, truth = float(results[t.turn_index].score), t.next_state.truth
            items.append(_TruthItem(score, _satisfied(truth), truth, score))
    return _truth_counters(items)


def _satisfied(truth: float) -> int:
    return 1 if truth >= 1.0 else -1


def group_truth_counts(episodes: list[Episode]) -> dict[str, float]:
    """:func:`truth_counts` of a group's turns, relative to the group: at each position a turn's
    truth says +1 when it satisfied the user more than the group's attempts there on average, -1
    when less, and the judge's sign is its score's relative to the group's mean score. A position
    with one attempt falls back to the absolute rule of :func:`truth_counts`."""
    at: dict[int, list[tuple[float, float]]] = {}
    for e in episodes:
        judged = [t for t in e.turns if t.turn_index in e.results and t.response_ids]
        for p, t in enumerate(judged):
            if t.next_state is not None and t.next_state.truth is not None:
                at.setdefault(p, []).append((float(e.results[t.turn_index].score), t.next_state.truth))
    items: list[_TruthItem] = []
    for members in at.values():
        if len(members) < 2:
            items.extend(_TruthItem(s, _satisfied(truth), truth, s) for s, truth in members)
            continue
        mean_s = sum(s for s, _ in members) / len(members)
        mean_t = sum(truth for _, truth in members) / len(members)
        for s, truth in members:
            rel = truth - mean_t
            items.append(_TruthItem(s - mean_s, 0 if abs(rel) <= ZERO else (1 if rel > 0 else -1), truth, s))
    return _truth_counters(items)


@dataclass(frozen=True)
class _TruthItem:
    """One judged turn with a truth: the judge's value (score, or its advantage in a group), the
    truth's sign (+1 / -1; 0 when it says nothing), the truth itself and the judge's raw score."""

    judge: float
    truth_sign: int
    truth: float
    score: float


def _truth_counters(items: list[_TruthItem]) -> dict[str, float]:
    names = ("turns", "sum", "pairs", "agree", "pos", "pos_sum", "neg", "neg_sum")
    out = {f"truth_{n}": 0.0 for n in names}
    for it in items:
        out["truth_turns"] += 1
        out["truth_sum"] += it.truth
        if abs(it.judge) > ZERO and it.truth_sign != 0:
            out["truth_pairs"] += 1
            out["truth_agree"] += int((it.judge > 0) == (it.truth_sign > 0))
        side = "pos" if it.score > 0 else "neg" if it.score < 0 else None
        if side:
            out[f"truth_{side}"] += 1
            out[f"truth_{side}_sum"] += it.truth
    return out


def guarantee_sample(
    turns: list[Turn], results: dict[int, JudgeResult], training: TrainingConfig
) -> Sample | None:
    """The at-least-one rule: the latest judged main turn of a session that produced no sample,
    kept with reward 0 (so only its OPD part, KL and entropy terms act on it)."""
    judged = [t for t in turns if t.turn_type == "main" and t.turn_index in results and t.response_ids]
    if not judged:
        return None
    turn = judged[-1]
    result = results[turn.turn_index]
    has_opd = _has_opd(result, training)
    return _sample(turn, 0.0, result if has_opd else None, training, suffix="guarantee")


def _has_opd(result: JudgeResult, training: TrainingConfig) -> bool:
    """Whether a judgement carries an OPD part: a kept hint and the teacher's log-probs under it."""
    return training.opd_enabled and result.teacher_logprobs is not None and result.hint is not None


def _sample(
    turn: Turn,
    reward: float | None,
    opd: JudgeResult | None,
    training: TrainingConfig,
    suffix: str = "",
    advantage: float | None = None,
    group_id: str | None = None,
) -> Sample:
    # The judgement whose top-k the sample carries: with topk_distill, an OPD part that has one.
    topk = opd if training.topk_distill and opd is not None and opd.teacher_topk_ids is not None else None
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
        advantage=advantage,
        group_id=group_id,
        teacher_logprobs=opd.teacher_logprobs if opd is not None else None,
        teacher_topk_ids=topk.teacher_topk_ids if topk is not None else None,
        teacher_topk_logprobs=topk.teacher_topk_logprobs if topk is not None else None,
        user=turn.user,
    )
