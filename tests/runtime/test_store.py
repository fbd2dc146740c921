"""The durable store: turn lifecycle, judgements, sample claims and crash recovery."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from openclaw_rl.config import TrainingConfig
from openclaw_rl.judge.sample_rules import build_samples, guarantee_sample
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import JudgeResult, NextState, Sample, Turn

from ..helpers import one_token_sample


def turn(session: str, index: int, version: int = 0, turn_type: str = "main") -> Turn:
    return Turn(
        session_id=session,
        turn_index=index,
        turn_type=turn_type,
        messages=[{"role": "user", "content": f"q{index}"}],
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        response_logprobs=[-0.5, -0.25],
        policy_version=version,
    )


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
    store.save_judgement(
        again[0], JudgeResult(score=1), build_samples(again[0], JudgeResult(score=1), TrainingConfig())
    )
    assert store.turn_status("s", 0) == "judged"
    assert store.counters().samples_ready == 1


def test_sample_rules():
    tc = TrainingConfig()
    t = turn("s", 0)
    assert build_samples(t, JudgeResult(score=0), tc) == []  # score 0, no hint: masked out
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
        store.record_turn(
            turn("s", i), next_state_for_previous=NextState(role="user", content="hm") if i else None
        )
    store.close_session("s")
    t0 = store.turns_to_judge()[0]
    store.save_judgement(t0, JudgeResult(score=0), build_samples(t0, JudgeResult(score=0), tc))
    assert store.sessions_needing_guarantee() == ["s"]
    sample = guarantee_sample(store.session_turns("s"), {0: store.judgement("s", 0)}, tc)
    store.apply_guarantee("s", sample)
    assert store.sessions_needing_guarantee() == []
    assert store.counters().samples_ready == 1 and sample.reward == 0.0 and sample.turn_index == 0


def _sample(i: int, version: int = 0) -> Sample:
    return one_token_sample(f"x{i}", "s", turn_index=i, version=version)


def test_claims_survive_a_crash_without_loss_or_double_training(store):
    store.add_samples([_sample(i) for i in range(6)])
    first = store.claim_samples(2, step=1, current_version=0)
    second = store.claim_samples(2, step=2, current_version=0)
    assert {s.sample_id for s in first}.isdisjoint({s.sample_id for s in second})
    store.commit_checkpoint(step=1, policy_version=0)  # checkpoint after step 1, then a crash in step 2
    released = store.recover_claims(checkpoint_step=1)
    assert released == 2
    c = store.counters()
    assert (c.samples_trained, c.samples_ready, c.samples_claimed) == (2, 4, 0)
    again = store.claim_samples(10, step=2, current_version=0)
    assert {s.sample_id for s in again} == {f"x{i}" for i in range(2, 6)}


def test_an_abandoned_updates_claims_return_in_their_order_and_no_other_steps_do(store):
    store.add_samples([_sample(i) for i in range(6)])
    store.claim_samples(2, step=1, current_version=0)  # trained, not yet checkpointed
    abandoned = store.claim_samples(2, step=2, current_version=0)
    assert store.release_sample_claims(step=2) == 2
    c = store.counters()
    assert (c.samples_claimed, c.samples_ready) == (2, 4)  # step 1's claims are untouched
    again = store.claim_samples(2, step=2, current_version=0)
    assert [s.sample_id for s in again] == [s.sample_id for s in abandoned]


def test_stale_samples_dropped_and_counted(store):
    store.add_samples([_sample(0, version=0), _sample(1, version=5)])
    batch = store.claim_samples(10, step=1, current_version=6, max_staleness=2)
    assert [s.sample_id for s in batch] == ["x1"]
    assert store.counters().samples_dropped == 1


def test_samples_reads_back_every_sample_or_those_of_one_status(store):
    store.add_samples([_sample(i) for i in range(3)])
    store.claim_samples(1, step=1, current_version=0)
    store.commit_checkpoint(step=1, policy_version=0)
    assert [s.sample_id for s in store.samples()] == ["x0", "x1", "x2"]
    assert [s.sample_id for s in store.samples("trained")] == ["x0"]
    assert [s.sample_id for s in store.samples("ready")] == ["x1", "x2"]


def test_the_newest_policy_versions_samples_are_claimed_first(store):
    # a burst of base-policy rollouts, then a few of the version serving now
    store.add_samples([_sample(i, version=0) for i in range(6)])
    store.add_samples([_sample(i, version=1) for i in range(6, 9)])
    assert store.ready_count() == 9
    batch = store.claim_samples(4, step=1, current_version=1)
    # the three fresh ones, then the oldest old one to fill the batch
    assert [(s.sample_id, s.policy_version) for s in batch] == [("x6", 1), ("x7", 1), ("x8", 1), ("x0", 0)]
    assert store.ready_count() == 5


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


# ---------------------------------------------------------------- several judges on one store


def _ready_turns(store: Store, n: int, session: str = "j") -> None:
    """``n`` main turns, each ready for judging (the next turn's user message is its next state)."""
    for i in range(n + 1):
        store.record_turn(
            turn(session, i), next_state_for_previous=NextState(role="user", content="ok") if i else None
        )


def _judge_process(path: str, worker: str, barrier, out) -> None:
    """A judge in its own process: claim a few, "judge" them, save each with samples, until nothing
    is due. Reports the keys it saved, or the first refusal / error."""
    try:
        s = Store(path)
        tc = TrainingConfig()
        barrier.wait(60)  # every judge process begins claiming at the same moment
        got = []
        while batch := s.claim_turns(worker, limit=3, lease_s=600):
            for t in batch:
                time.sleep(
                    0.02
                )  # judging takes a moment: the other process claims meanwhile (even on a busy machine)
                result = JudgeResult(score=1)
                if not s.save_judgement(t, result, build_samples(t, result, tc), worker=worker):
                    raise AssertionError(f"{worker}: save of its own claimed turn {t.key} was refused")
                got.append(t.key)
        s.close()
        out.put((worker, got, None))
    except Exception as exc:  # reported to the test instead of leaving it waiting on the queue
        out.put((worker, [], repr(exc)))


def test_concurrent_judge_processes_claim_disjoint_turns_covering_all(tmp_path):
    path = str(tmp_path / "store.sqlite")
    s = Store(path)
    _ready_turns(s, 60)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_judge_process, args=(path, f"judge-{i}", barrier, out)) for i in range(2)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert [r[2] for r in reports] == [None, None], reports
    got = {r[0]: r[1] for r in reports}
    a, b = got["judge-0"], got["judge-1"]
    assert a and b, "both judges should have judged some turns"
    assert set(a).isdisjoint(b)
    assert sorted(a + b) == sorted(f"j:{i}" for i in range(60))  # all covered, none twice
    c = s.counters()
    assert (c.judged, c.waiting, c.samples_ready) == (60, 0, 60)
    s.close()


def test_claims_are_exclusive_until_the_lease_runs_out(tmp_path):
    path = tmp_path / "store.sqlite"
    a, b = Store(path), Store(path)  # two handles (two connections), as two judges would have
    _ready_turns(a, 1)
    [ta] = a.claim_turns("A", limit=5, lease_s=0.2)
    assert b.claim_turns("B", limit=5, lease_s=600) == []
    assert a.turn_status("j", 0) == "ready" and a.counters().waiting == 1  # status unchanged while leased
    assert a.claimed_by("j", 0) == "A"
    time.sleep(0.3)
    [tb] = b.claim_turns("B", limit=5, lease_s=600)  # A's lease ran out: B takes the turn over
    assert tb.key == ta.key and b.claimed_by("j", 0) == "B"
    # A's late result is refused while B holds the turn, and inserts no sample.
    late = JudgeResult(score=-1)
    assert not a.save_judgement(ta, late, build_samples(ta, late, TrainingConfig()), worker="A")
    assert a.turn_status("j", 0) == "ready" and a.counters().samples_ready == 0
    ok = JudgeResult(score=1)
    assert b.save_judgement(tb, ok, build_samples(tb, ok, TrainingConfig()), worker="B")
    assert b.claimed_by("j", 0) is None and b.judgement("j", 0).score == 1
    # ...and still refused once B's judgement is in: the turn is judged, by B, once.
    assert not a.save_judgement(ta, late, build_samples(ta, late, TrainingConfig()), worker="A")
    c = a.counters()
    assert (c.judged, c.samples_ready, c.reward_mean) == (1, 1, 1.0)
    a.close()
    b.close()


def test_failed_judgement_frees_the_lease_for_the_retry(store):
    _ready_turns(store, 1)
    [t] = store.claim_turns("A", limit=1, lease_s=600)
    assert store.save_judgement(t, JudgeResult(error="API down"), retry_after_s=0.0, worker="A")
    assert store.turn_status("j", 0) == "failed" and store.claimed_by("j", 0) is None
    [again] = store.claim_turns("B", limit=1, lease_s=600)  # retry due, lease free: any judge may take it
    assert again.key == "j:0"


def test_release_claims_frees_only_that_workers_leases(store):
    _ready_turns(store, 4)
    mine = store.claim_turns("judge-0", limit=3, lease_s=600)
    theirs = store.claim_turns("judge-1", limit=3, lease_s=600)
    assert len(mine) == 3 and len(theirs) == 1
    assert store.turns_to_judge() == []  # everything is leased
    assert store.release_claims("judge-0") == 3  # judge-0 restarted: its old leases go at once
    assert store.release_claims("judge-0") == 0
    assert {t.key for t in store.claim_turns("judge-2", limit=10, lease_s=600)} == {t.key for t in mine}
    assert store.claimed_by("j", theirs[0].turn_index) == "judge-1"


def test_claim_turns_rejects_bad_arguments(store):
    with pytest.raises(ValueError, match="worker"):
        store.claim_turns("", limit=1, lease_s=1)
    with pytest.raises(ValueError, match="limit"):
        store.claim_turns("A", limit=0, lease_s=1)
    with pytest.raises(ValueError, match="lease_s"):
        store.claim_turns("A", limit=1, lease_s=0)


OLD_TURNS_SCHEMA = """
CREATE TABLE turns (
    session_id TEXT NOT NULL, turn_index INTEGER NOT NULL, turn_type TEXT NOT NULL, status TEXT NOT NULL,
    data TEXT NOT NULL, judge TEXT, score INTEGER, judge_attempts INTEGER NOT NULL DEFAULT 0,
    retry_at REAL NOT NULL DEFAULT 0, error TEXT, updated_at REAL NOT NULL,
    PRIMARY KEY (session_id, turn_index));
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, created_at REAL NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, guaranteed INTEGER NOT NULL DEFAULT 0);
INSERT INTO sessions VALUES ('old', 0, 1, 0);
"""


def test_store_file_from_an_older_version_is_migrated_on_open(tmp_path):
    import sqlite3

    path = tmp_path / "store.sqlite"
    t = turn("old", 0)
    t.next_state = NextState(role="user", content="thanks")
    db = sqlite3.connect(path)
    db.executescript(OLD_TURNS_SCHEMA)
    db.execute(
        "INSERT INTO turns(session_id, turn_index, turn_type, status, data, updated_at) "
        "VALUES ('old', 0, 'main', 'ready', ?, 0)",
        (t.model_dump_json(),),
    )
    db.commit()
    db.close()
    s = Store(path)
    cols = {r[1] for r in s._db.execute("PRAGMA table_info(turns)").fetchall()}
    assert {"claimed_by", "lease_until"} <= cols
    cols = {r[1] for r in s._db.execute("PRAGMA table_info(sessions)").fetchall()}
    assert {"group_id", "group_size", "outcome", "grouped", "user"} <= cols
    assert "user" in {r[1] for r in s._db.execute("PRAGMA table_info(samples)").fetchall()}
    assert "response" in {r[1] for r in s._db.execute("PRAGMA table_info(chains)").fetchall()}
    assert s.session_group("old") is None and s.groups_ready() == []
    [claimed] = s.claim_turns("judge-0", limit=5, lease_s=600)  # the old ready turn is judged as before
    assert claimed.key == "old:0" and claimed.next_state.content == "thanks"
    s.close()
    Store(path).close()  # opening a migrated file again changes nothing


def test_guarantee_applies_once_when_two_judges_race(tmp_path):
    path = tmp_path / "store.sqlite"
    a, b = Store(path), Store(path)
    tc = TrainingConfig()
    _ready_turns(a, 1, session="g")
    a.close_session("g")
    [t] = a.claim_turns("A", limit=1, lease_s=600)
    assert a.save_judgement(t, JudgeResult(score=0), [], worker="A")
    # Both judges saw the session needing its guarantee before either applied it.
    assert a.sessions_needing_guarantee() == b.sessions_needing_guarantee() == ["g"]
    sample = guarantee_sample(a.session_turns("g"), {0: a.judgement("g", 0)}, tc)
    assert b.apply_guarantee("g", sample) is True
    twin = sample.model_copy(update={"sample_id": sample.sample_id + "-twin"})
    assert a.apply_guarantee("g", twin) is False  # a distinct id would have been a second sample
    assert a.counters().samples_ready == 1
    a.close()
    b.close()


def test_progress_line_shows_updates_ahead_of_their_checkpoint(store):
    from openclaw_rl.launcher.status import progress_line

    store.add_samples([_sample(i) for i in range(3)])
    store.claim_samples(2, step=5, current_version=0)
    store.commit_checkpoint(step=4, policy_version=1)
    store.set_meta("trainer_updates", 5)
    line = progress_line(store.counters())
    assert "samples ready=1 training=2 trained=0" in line and "step=5 checkpointed=4 version=" in line


# ------------------------------------------------------------------ users and explicit feedback
def _served(
    store: Store, session: str, index: int, user: str, response_id: str, state: str | None = None
) -> Turn:
    t = turn(session, index)
    t.user, t.response_id = user, response_id
    store.record_turn(t, next_state_for_previous=NextState(role="user", content=state) if state else None)
    return t


def _feedback(store: Store, response_id: str, user: str, rating: int, comment: str | None = None):
    from openclaw_rl.runtime.users import Feedback

    return store.record_feedback(Feedback(response_id, user, rating, comment, time.time()))


def test_user_keys_are_kept_as_digests_and_names_are_unique(store):
    from openclaw_rl.runtime.users import UserError, issue_key, key_matches, split_key

    key = issue_key()
    store.add_user("alice", key)
    key_id, secret = split_key(key.text)
    name, salt, digest = store.user_key(key_id)
    assert name == "alice" and key_matches(secret, salt, digest)
    assert not key_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), salt, digest)
    assert secret not in store.path.read_bytes().decode("latin-1")  # only the digest is stored
    with pytest.raises(UserError, match="already exists"):
        store.add_user("alice", issue_key())
    assert store.user_names() == ["alice"]


def test_feedback_reopens_the_turn_and_withdraws_its_untrained_samples(store):
    t = _served(store, "s", 0, "alice", "chatcmpl-a")
    _served(store, "s", 1, "alice", "chatcmpl-b", state="thanks, perfect")
    [due] = store.claim_turns("judge-0", limit=5, lease_s=600)
    result = JudgeResult(score=1)
    assert store.save_judgement(due, result, build_samples(due, result, TrainingConfig()), worker="judge-0")
    assert store.ready_count() == 1
    outcome = _feedback(store, "chatcmpl-a", "alice", -1, "no, that was the wrong city")
    assert (
        outcome.will_train
        and outcome.replaced_next_state
        and (outcome.session_id, outcome.turn_index) == ("s", 0)
    )
    assert store.ready_count() == 0  # the +1 sample of the reply it contradicts is withdrawn
    [again] = store.claim_turns("judge-0", limit=5, lease_s=600)
    assert again.key == t.key and again.next_state.rating == -1
    assert again.next_state.content == "no, that was the wrong city"
    stats = store.user_stats("alice", "shared v0")
    assert (stats.turns, stats.feedback_up, stats.feedback_down) == (2, 0, 1)
    # rated again (changed their mind twice): one response, counted once with its latest rating
    _feedback(store, "chatcmpl-a", "alice", 1)
    _feedback(store, "chatcmpl-a", "alice", -1)
    _feedback(store, "chatcmpl-b", "alice", 1)
    stats = store.user_stats("alice", "shared v0")
    assert (stats.feedback_up, stats.feedback_down) == (1, 1)


def test_feedback_wins_over_a_judge_still_working_on_the_old_next_state(store):
    _served(store, "s", 0, "alice", "chatcmpl-a")
    _served(store, "s", 1, "alice", "chatcmpl-b", state="thanks")
    [stale] = store.claim_turns("judge-0", limit=5, lease_s=600)
    _feedback(store, "chatcmpl-a", "alice", -1)
    # The slow judge's verdict on "thanks" is refused; the turn is due again with the rating.
    assert not store.save_judgement(stale, JudgeResult(score=1), worker="judge-0")
    [due] = store.claim_turns("judge-1", limit=5, lease_s=600)
    assert due.next_state.rating == -1
    assert store.save_judgement(due, JudgeResult(score=-1), worker="judge-1")
    assert store.turn_status("s", 0) == "judged"


def _judge(store: Store, score: int) -> None:
    """The judge takes the waiting turn and saves ``score`` with the samples it makes."""
    [due] = store.claim_turns("judge-0", limit=5, lease_s=600)
    result = JudgeResult(score=score)
    store.save_judgement(due, result, build_samples(due, result, TrainingConfig()), worker="judge-0")


def test_feedback_on_a_trained_turn_is_recorded_but_trains_nothing_twice(store):
    _served(store, "s", 0, "alice", "chatcmpl-a")
    _served(store, "s", 1, "alice", "chatcmpl-b", state="great")
    _judge(store, 1)
    assert len(store.claim_samples(8, step=1, current_version=0)) == 1
    store.commit_checkpoint(1, 1)
    outcome = _feedback(store, "chatcmpl-a", "alice", -1)
    assert not outcome.will_train
    _judge(store, -1)
    assert store.ready_count() == 0  # same sample id as the trained one: not inserted again
    assert store.user_stats("alice", "shared v1").updates == 1


@pytest.mark.parametrize("taken_back", ["abandoned", "trainer restarted"])
def test_a_rating_sent_during_an_update_that_is_taken_back_is_what_trains(store, taken_back):
    """The update holding the turn's sample is abandoned (Ctrl-C) or lost (the trainer restarts
    from an older checkpoint): its sample must not go back to the queue with the old verdict."""
    _served(store, "s", 0, "alice", "chatcmpl-a")
    _served(store, "s", 1, "alice", "chatcmpl-b", state="great")
    _judge(store, 1)
    assert len(store.claim_samples(8, step=3, current_version=0)) == 1
    time.sleep(0.01)  # the rating comes after the sample was made
    assert not _feedback(store, "chatcmpl-a", "alice", -1, "wrong").will_train
    _judge(store, -1)
    if taken_back == "abandoned":
        store.release_sample_claims(step=3)
    else:
        store.recover_claims(checkpoint_step=2)
    assert store.ready_count() == 0  # the old +1 sample is not back in the queue
    assert store.turns_waiting() == 1  # the turn waits to be judged again, from the rating
    _judge(store, -1)
    assert [s.reward for s in store.claim_samples(8, step=3, current_version=0)] == [-1.0]


def test_feedback_for_an_unknown_response_writes_nothing(store):
    _served(store, "s", 0, "alice", "chatcmpl-a")
    assert _feedback(store, "chatcmpl-zzz", "alice", 1) is None
    assert store._db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 0
    assert store.turn_status("s", 0) == "open"


def test_threads_reading_while_another_process_writes_never_see_database_is_locked(tmp_path):
    """Reads on a shared handle must not hold a read snapshot that a BEGIN IMMEDIATE from another
    thread would then upgrade: once another handle has committed since, SQLite refuses that at once
    ("database is locked"), and a judge's thread died of it with two judges on one store."""
    import threading

    path = tmp_path / "s.sqlite"
    a, b = Store(path), Store(path)
    errors: list[str] = []
    stop = time.time() + 3

    def reads(s: Store) -> None:
        while time.time() < stop:
            try:
                s.ready_count()
                s.user_names()
                s.sessions_for_prefixes(["x"] * 50)
            except Exception as exc:  # the assertion below reports every one
                errors.append(repr(exc))

    def writes(s: Store, key: str) -> None:
        while time.time() < stop:
            try:
                s.add_to_meta(key, {"n": 1.0})
            except Exception as exc:
                errors.append(repr(exc))

    threads = [
        threading.Thread(target=reads, args=(a,)),
        threading.Thread(target=reads, args=(a,)),
        threading.Thread(target=writes, args=(a, "a")),
        threading.Thread(target=reads, args=(b,)),
        threading.Thread(target=writes, args=(b, "b")),
        threading.Thread(target=writes, args=(b, "c")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_group_ids_lists_every_group_once_in_arrival_order(store):
    from openclaw_rl.types import EpisodeTag

    for sid, group in (("a1", "g-b"), ("a2", "g-a"), ("a3", "g-b")):
        store.record_turn(turn(sid, 0))
        store.tag_session(sid, EpisodeTag(group_id=group, group_size=2))
    store.record_turn(turn("alone", 0))  # a session outside any group
    assert store.group_ids() == ["g-b", "g-a"]


def test_recent_user_hints_are_the_users_own_distinct_wishes_newest_first(store):
    def judged(session: str, user: str, role: str, hint: str | None) -> None:
        t = turn(session, 0).model_copy(update={"user": user})
        store.record_turn(t)
        store.attach_next_state(session, NextState(role=role, content="..."))
        [pending] = [x for x in store.turns_to_judge() if x.session_id == session]
        store.save_judgement(pending, JudgeResult(score=-1, hint=hint))

    judged("a1", "ann", "user", "No bold please.")
    judged("a2", "ann", "tool", "The file is missing; create it first.")  # about its turn, not ann
    judged("b1", "bob", "user", "Use headings.")
    judged("a3", "ann", "user", None)
    judged("a4", "ann", "user", "End with the answer.")
    judged("a5", "ann", "user", "no  BOLD please.")  # the same wish again, other case and spacing
    assert store.recent_user_hints("ann", 8) == ["no  BOLD please.", "End with the answer."]
    assert store.recent_user_hints("ann", 1) == ["no  BOLD please."]
    assert store.recent_user_hints("bob", 8) == ["Use headings."]
    assert store.recent_user_hints("carol", 8) == [] and store.recent_user_hints("ann", 0) == []
    store.delete_user("ann")
    assert store.recent_user_hints("ann", 8) == []  # forgotten with the turns


def test_a_new_run_folder_and_its_store_are_the_owners_alone(tmp_path):
    """The store holds people's words: a new log_dir is 0700 and the store (with its -wal / -shm) 0600,
    whatever the umask; another local account reads none of it."""
    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "logs" / "store.sqlite")
        store.set_meta("x", 1)
        files = [p for p in (tmp_path / "logs").iterdir() if p.name.startswith("store.sqlite")]
        assert {p.name for p in files} >= {"store.sqlite", "store.sqlite-wal"}
        assert all(p.stat().st_mode & 0o077 == 0 for p in files), [oct(p.stat().st_mode) for p in files]
        assert (tmp_path / "logs").stat().st_mode & 0o077 == 0
        store.close()
    finally:
        os.umask(old)


def test_a_loop_the_launcher_started_does_not_make_a_new_store_where_the_run_s_was_removed(tmp_path):
    from openclaw_rl.runtime.store import Store, StoreError

    path = tmp_path / "logs" / "store.sqlite"
    with pytest.raises(StoreError, match="is gone .*not starting an empty one"):
        Store(path, create=False)
    assert not path.exists() and not path.parent.exists()
    Store(path).close()  # made by whoever starts the run
    Store(path, create=False).close()


def test_a_deleted_users_words_leave_the_file_even_while_another_process_reads(tmp_path):
    """users delete while the run goes on: serving, the judge and the trainer each hold short reads,
    which a checkpoint waits out; afterwards no byte of their words is in the store's files, and the
    delete says the file was compacted."""
    import sqlite3
    import threading

    path = tmp_path / "store.sqlite"
    store = Store(path)
    words = "what ann said and took back"
    for i in range(40):
        t = turn(f"ann-{i}", 0).model_copy(
            update={"user": "ann", "messages": [{"role": "user", "content": f"{words} {i}"}]}
        )
        store.record_turn(t)
    store.record_turn(turn("bob-1", 0).model_copy(update={"user": "bob"}))
    reader = sqlite3.connect(path, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM turns").fetchone()  # a read in progress: its snapshot is held
    timer = threading.Timer(1.0, reader.commit)
    timer.start()
    try:
        counts = store.delete_user("ann")
    finally:
        timer.join()
        reader.close()
    assert counts["turns"] == 40 and counts["store_compacted"] == 1
    assert len(store.session_turns("bob-1")) == 1
    try:  # read while the store is still open, as the run keeps it (closing would checkpoint it anyway)
        for p in tmp_path.iterdir():
            assert words.encode() not in p.read_bytes(), p.name
    finally:
        store.close()


def test_a_next_state_never_answers_a_later_turn_of_its_session(store):
    """Two requests of one session sent at once, the later finishing first: the earlier one's own
    message was written before the later reply existed, so it is no next state of it; the next
    message answers the newest open turn before it."""
    store.record_turn(turn("s", 1), next_state_for_previous=NextState(role="user", content="q1"))
    store.record_turn(turn("s", 0), next_state_for_previous=NextState(role="user", content="q0"))
    assert [store.turn_status("s", i) for i in (0, 1)] == ["open", "open"]  # q0 answered no reply
    store.record_turn(turn("s", 2), next_state_for_previous=NextState(role="user", content="third"))
    turns = {t.turn_index: t for t in store.session_turns("s")}
    assert turns[1].next_state is not None and turns[1].next_state.content == "third"
    assert turns[0].next_state is None and store.turn_status("s", 0) == "open"
