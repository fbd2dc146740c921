"""The durable store: turn lifecycle, judgements, sample claims and crash recovery (SPEC §1, §3)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from openclaw_rl.config import TrainingConfig
from openclaw_rl.runtime.samples import build_samples, guarantee_sample
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import JudgeResult, NextState, Sample, Turn


def turn(session: str, index: int, version: int = 0, turn_type: str = "main") -> Turn:
    return Turn(session_id=session, turn_index=index, turn_type=turn_type,
                messages=[{"role": "user", "content": f"q{index}"}], prompt_ids=[1, 2, 3],
                response_ids=[4, 5], response_logprobs=[-0.5, -0.25], policy_version=version)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.sqlite")
    yield s
    s.close()


def test_next_state_attaches_to_previous_main_turn(store):
    store.record_turn(turn("s", 0))
    store.record_turn(turn("s", 1, turn_type="side"))  # a title-generation side task
    store.record_turn(turn("s", 2), next_state_for_previous=NextState(role="user", content="thanks!"))
    pending = store.turns_to_judge()
    assert [t.turn_index for t in pending] == [0]
    assert pending[0].next_state.content == "thanks!"
    assert store.turn_status("s", 1) == "side"
    store.close_session("s")
    assert store.turn_status("s", 2) == "closed"  # last turn: no next state, not judged


def test_failed_judgement_is_an_error_not_a_zero_and_is_retried(store):
    store.record_turn(turn("s", 0))
    store.attach_next_state("s", NextState(role="tool", content="ok"))
    t = store.turns_to_judge()[0]
    store.save_judgement(t, JudgeResult(error="API timed out"), retry_after_s=0.0)
    assert store.turn_status("s", 0) == "failed"
    assert store.counters().judged == 0 and store.counters().reward_mean is None
    again = store.turns_to_judge()
    assert [x.key for x in again] == ["s:0"]
    store.save_judgement(again[0], JudgeResult(score=1), build_samples(again[0], JudgeResult(score=1), TrainingConfig()))
    assert store.turn_status("s", 0) == "judged"
    assert store.counters().samples_ready == 1


def test_sample_rules():
    tc = TrainingConfig()
    t = turn("s", 0)
    assert build_samples(t, JudgeResult(score=0), tc) == []           # score 0, no hint: masked out
    rl = build_samples(t, JudgeResult(score=-1), tc)[0]
    assert rl.reward == -1 and rl.teacher_logprobs is None and rl.loss_mask == [1, 1]
    opd = build_samples(t, JudgeResult(score=0, hint="Use plain text.", teacher_logprobs=[-0.1, -0.2]), tc)[0]
    assert opd.reward is None and opd.teacher_logprobs == [-0.1, -0.2]  # OPD part only
    both = build_samples(t, JudgeResult(score=1, hint="Be brief.", teacher_logprobs=[-0.1, -0.2]), tc)[0]
    assert both.reward == 1 and both.teacher_logprobs is not None
    no_opd = TrainingConfig(opd_enabled=False)
    assert build_samples(t, JudgeResult(score=0, hint="x" * 20, teacher_logprobs=[-1, -1]), no_opd) == []
    assert build_samples(t, JudgeResult(error="down"), tc) == []


def test_at_least_one_guarantee(store):
    tc = TrainingConfig()
    for i in range(2):
        store.record_turn(turn("s", i), next_state_for_previous=NextState(role="user", content="hm") if i else None)
    store.close_session("s")
    t0 = store.turns_to_judge()[0]
    store.save_judgement(t0, JudgeResult(score=0), build_samples(t0, JudgeResult(score=0), tc))
    assert store.sessions_needing_guarantee() == ["s"]
    sample = guarantee_sample(store.session_turns("s"), {0: store.judgement("s", 0)}, tc)
    store.apply_guarantee("s", sample)
    assert store.sessions_needing_guarantee() == []
    assert store.counters().samples_ready == 1 and sample.reward == 0.0 and sample.turn_index == 0


def _sample(i: int, version: int = 0) -> Sample:
    return Sample(sample_id=f"x{i}", session_id="s", turn_index=i, policy_version=version, prompt_ids=[1],
                  response_ids=[2], rollout_logprobs=[-1.0], loss_mask=[1], reward=1.0)


def test_claims_survive_a_crash_without_loss_or_double_training(store):
    store.add_samples([_sample(i) for i in range(6)])
    first = store.claim_samples(2, step=1, current_version=0)
    second = store.claim_samples(2, step=2, current_version=0)
    assert {s.sample_id for s in first}.isdisjoint({s.sample_id for s in second})
    store.commit_checkpoint(step=1, policy_version=0)   # checkpoint after step 1, then a crash in step 2
    released = store.recover_claims(checkpoint_step=1)
    assert released == 2
    c = store.counters()
    assert (c.samples_trained, c.samples_ready, c.samples_claimed) == (2, 4, 0)
    again = store.claim_samples(10, step=2, current_version=0)
    assert {s.sample_id for s in again} == {f"x{i}" for i in range(2, 6)}


def test_stale_samples_dropped_and_counted(store):
    store.add_samples([_sample(0, version=0), _sample(1, version=5)])
    batch = store.claim_samples(10, step=1, current_version=6, max_staleness=2)
    assert [s.sample_id for s in batch] == ["x1"]
    assert store.counters().samples_dropped == 1


def _writer(path: str, n: int) -> None:
    s = Store(path)
    for i in range(n):
        s.record_turn(turn(f"p{os.getpid()}", i))
        if i == n // 2:
            os.kill(os.getpid(), signal.SIGKILL)  # die mid-run: what was committed must survive


def test_kill_minus_9_loses_no_committed_turn(tmp_path):
    path = str(tmp_path / "store.sqlite")
    proc = mp.get_context("spawn").Process(target=_writer, args=(path, 40))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    s = Store(path)
    assert s.counters().turns == 21  # turns 0..20 were committed before the kill
    s.close()
