"""Advantages where samples are made: group-relative for environment groups, a running baseline for
single responses, and what each ``[env_service] reward`` mode trains on."""

from __future__ import annotations

import pytest

from openclaw_rl.config import TrainingConfig
from openclaw_rl.judge.sample_rules import (
    Episode,
    RunningBaseline,
    build_samples,
    group_samples,
    group_truth_counts,
    truth_counts,
)
from openclaw_rl.types import JudgeResult, NextState, Turn


def turn(sid: str, idx: int, role: str = "user") -> Turn:
    return Turn(
        session_id=sid,
        turn_index=idx,
        messages=[{"role": "user", "content": "q"}],
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        response_logprobs=[-1.0, -1.0, -1.0],
        next_state=NextState(role=role, content="next"),
    )


def episode(sid: str, scores: list[int], outcome: float | None = None, hint_at: int | None = None) -> Episode:
    turns = [turn(sid, i) for i in range(len(scores))]
    results = {}
    for i, s in enumerate(scores):
        hinted = i == hint_at
        results[i] = JudgeResult(
            score=s,
            hint="Show the working." if hinted else None,
            teacher_logprobs=[-0.5, -0.5, -0.5] if hinted else None,
        )
    return Episode(sid, turns, results, outcome)


def by_turn(samples):
    return {(s.session_id, s.turn_index): s for s in samples}


def test_a_group_of_identical_rewards_gives_no_push():
    tc = TrainingConfig()
    eps = [episode(f"e{i}", [-1, -1]) for i in range(4)]
    samples, stats = group_samples("g", eps, tc, "judge", RunningBaseline())
    assert samples == []  # every advantage is 0: no policy-gradient part, and no hint to distil
    assert stats.zero_advantage and stats.reward_mean == -1.0 and stats.reward_spread == 0.0
    # With a hint the turn still distils, but its RL part is absent (advantage 0 is no signal).
    eps[0] = episode("e0", [-1, -1], hint_at=1)
    samples, stats = group_samples("g", eps, tc, "judge")
    assert [(s.session_id, s.turn_index, s.reward, s.advantage) for s in samples] == [("e0", 1, None, None)]
    assert samples[0].teacher_logprobs is not None and stats.zero_advantage


def test_an_episode_closed_before_its_first_answer_is_not_a_reward_of_0_in_the_groups_figures():
    """A stop cancels a group while a member starts: that member has no judged turn. The group's
    mean and spread (its log line, the run's metrics) are of the members that have a return."""
    eps = [episode(f"e{i}", [-1]) for i in range(3)] + [episode("e3", [])]
    samples, stats = group_samples("g", eps, TrainingConfig(), "judge", RunningBaseline())
    assert samples == [] and stats.zero_advantage
    assert (stats.episodes, stats.reward_mean, stats.reward_spread) == (4, -1.0, 0.0)


def test_judge_scores_are_taken_relative_to_the_group_at_each_position():
    tc = TrainingConfig()
    eps = [episode("a", [1, -1]), episode("b", [-1, -1]), episode("c", [-1, 1]), episode("d", [-1, -1])]
    samples, stats = group_samples("g", eps, tc, "judge")
    got = by_turn(samples)
    # position 0: scores 1,-1,-1,-1 (mean -0.5); position 1: -1,-1,1,-1 (mean -0.5)
    assert got[("a", 0)].advantage == pytest.approx(1.5) and got[("a", 0)].reward == 1.0
    assert got[("b", 0)].advantage == pytest.approx(-0.5)
    assert got[("c", 1)].advantage == pytest.approx(1.5)
    assert sum(s.advantage for s in samples if s.turn_index == 0) == pytest.approx(0.0)
    assert all(s.group_id == "g" for s in samples) and len(samples) == 8
    assert not stats.zero_advantage and stats.episodes == 4
    # GRPO's spread normalisation, when asked for: unit spread within each position.
    norm, _ = group_samples("g", eps, TrainingConfig(group_std_normalize=True), "judge")
    values = [s.advantage for s in norm if s.turn_index == 0]
    assert sum(v * v for v in values) / len(values) == pytest.approx(1.0)


def test_outcome_mode_gives_every_turn_its_episodes_outcome_advantage():
    tc = TrainingConfig()
    eps = [episode("win", [0, 0, 0], outcome=1.0), episode("lose", [1, 1], outcome=-1.0)]
    samples, stats = group_samples("g", eps, tc, "outcome")
    got = by_turn(samples)
    assert {k: (s.reward, s.advantage) for k, s in got.items()} == {
        ("win", 0): (1.0, 1.0),
        ("win", 1): (1.0, 1.0),
        ("win", 2): (1.0, 1.0),
        ("lose", 0): (-1.0, -1.0),
        ("lose", 1): (-1.0, -1.0),
    }  # the judge's +1s are not used
    assert stats.reward_mean == 0.0 and stats.reward_spread == 1.0


def test_both_adds_the_outcome_at_the_last_turn():
    tc = TrainingConfig()
    eps = [episode("win", [1, 1], outcome=1.0), episode("lose", [-1, 1], outcome=-1.0)]
    got = by_turn(group_samples("g", eps, tc, "both")[0])
    assert got[("win", 0)].advantage == pytest.approx(1.0)  # judge only: 1 - mean(1, -1)
    assert got[("win", 1)].advantage == pytest.approx(0.0 + 1.0)  # judge 0 + outcome +1
    assert got[("lose", 1)].advantage == pytest.approx(0.0 - 1.0)
    assert got[("lose", 1)].reward == pytest.approx(1.0 - 1.0)


def test_chat_episodes_without_an_outcome_stay_judged_in_outcome_mode():
    eps = [episode("a", [1]), episode("b", [-1])]
    got = by_turn(group_samples("g", eps, TrainingConfig(), "outcome")[0])
    assert got[("a", 0)].advantage == pytest.approx(1.0) and got[("b", 0)].advantage == pytest.approx(-1.0)


def test_running_baseline_per_turn_kind():
    b = RunningBaseline(momentum=0.5)
    assert b.advantage("user", -1.0) == -1.0  # nothing seen yet: b = 0
    assert b.advantage("user", -1.0) == 0.0  # bias-corrected mean of one -1 is -1
    assert b.advantage("user", 1.0) == pytest.approx(2.0)
    assert b.advantage("tool", 1.0) == 1.0  # kinds keep their own baselines
    restored = RunningBaseline.from_dict(b.to_dict(), 0.5)
    assert restored.mean("user") == pytest.approx(b.mean("user"))
    assert RunningBaseline.from_dict("garbage", 0.9).mean("user") == 0.0


def test_single_responses_are_compared_with_the_running_baseline():
    tc = TrainingConfig()
    b = RunningBaseline(momentum=0.9)
    advs = [build_samples(turn("s", i), JudgeResult(score=-1), tc, b)[0].advantage for i in range(3)]
    assert advs[0] == -1.0 and advs[1] == pytest.approx(0.0) and advs[2] == pytest.approx(0.0)
    up = build_samples(turn("s", 3), JudgeResult(score=1), tc, b)[0]
    assert up.reward == 1.0 and up.advantage == pytest.approx(2.0)  # better than this agent usually does
    raw = build_samples(turn("s", 4), JudgeResult(score=1), TrainingConfig(advantage_baseline="none"), b)[0]
    assert raw.advantage is None and raw.rl_signal == 1.0


def test_a_group_of_one_uses_the_running_baseline():
    b = RunningBaseline(momentum=0.9)
    b.advantage("outcome", -1.0)
    got = group_samples("g", [episode("a", [0], outcome=1.0)], TrainingConfig(), "outcome", b)[0]
    assert got[0].advantage == pytest.approx(2.0)


def _with_truth(ep: Episode, truths: list[float]) -> Episode:
    for t, truth in zip(ep.turns, truths, strict=True):
        assert t.next_state is not None
        t.next_state.truth = truth
    return ep


def test_truth_counts_measure_how_often_the_judge_agrees_with_the_simulated_user():
    ep = _with_truth(episode("s", [1, -1, 1, 0]), [1.0, 0.25, 0.5, 0.75])
    c = truth_counts(ep.turns, ep.results)
    assert c["truth_turns"] == 4 and c["truth_sum"] == pytest.approx(2.5)
    # +1 on a satisfied turn agrees, -1 on an unsatisfied one agrees, +1 on 0.5 does not; 0 is no pair
    assert c["truth_pairs"] == 3 and c["truth_agree"] == 2
    assert (c["truth_pos"], c["truth_pos_sum"]) == (2, pytest.approx(1.5))
    assert (c["truth_neg"], c["truth_neg_sum"]) == (1, pytest.approx(0.25))
    plain = episode("p", [1])  # a real user's turn has no truth: nothing is counted
    assert truth_counts(plain.turns, plain.results)["truth_turns"] == 0


def test_group_truth_is_relative_to_the_groups_other_attempts():
    # two attempts at one task: nobody satisfied, but the first satisfied more (0.75 > 0.25)
    a = _with_truth(episode("a", [1]), [0.75])
    b = _with_truth(episode("b", [-1]), [0.25])
    c = group_truth_counts([a, b])
    assert c["truth_pairs"] == 2 and c["truth_agree"] == 2  # the judge ranked them right
    flipped = group_truth_counts(
        [_with_truth(episode("a", [-1]), [0.75]), _with_truth(episode("b", [1]), [0.25])]
    )
    assert flipped["truth_agree"] == 0
    same = group_truth_counts(
        [_with_truth(episode("a", [-1]), [0.5]), _with_truth(episode("b", [-1]), [0.5])]
    )
    assert same["truth_pairs"] == 0  # equal scores and equal truths: no push, no pair


def test_truth_mode_trains_a_group_on_the_simulated_users_own_score():
    # every attempt drew a complaint (-1), but they met 3, 1, 2 and 2 of four wishes
    eps = [
        _with_truth(episode(sid, [-1]), [t]) for sid, t in zip("abcd", [0.75, 0.25, 0.5, 0.5], strict=True)
    ]
    judged, stats = group_samples("g", eps, TrainingConfig(), "judge")
    assert judged == [] and stats.zero_advantage  # the judge alone says nothing here
    samples, stats = group_samples("g", eps, TrainingConfig(), "truth")
    got = by_turn(samples)
    # truth as -1..+1: 0.5, -0.5, 0, 0 (mean 0): a and b pushed, c and d at the mean give no push
    assert got[("a", 0)].advantage == pytest.approx(0.5) and got[("a", 0)].reward == pytest.approx(0.5)
    assert got[("b", 0)].advantage == pytest.approx(-0.5)
    assert set(got) == {("a", 0), ("b", 0)} and not stats.zero_advantage
    # a turn without a truth (a real user's) keeps the judge's score
    real = build_samples(turn("r", 0), JudgeResult(score=-1), TrainingConfig(), None, "truth")
    assert real[0].reward == -1.0
    simulated = _with_truth(episode("s", [-1]), [1.0])
    assert (
        build_samples(simulated.turns[0], simulated.results[0], TrainingConfig(), None, "truth")[0].reward
        == 1.0
    )
