"""The judge service loop over a real Store, judged by the loopback API server (the remote judge)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from openclaw_rl.judge import make_judge
from openclaw_rl.judge.loop import JudgeLoop
from openclaw_rl.judge.teacher import LocalTeacher
from openclaw_rl.runtime.chat_format import prompt_ids
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import EpisodeTag, NextState, Turn

from ..helpers import start_module
from .conftest import api_config


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from openclaw_rl.runtime.models import load_model

    return load_model(str(tiny_model_dir))


def record(
    store: Store,
    tok,
    sid: str,
    idx: int,
    user: str,
    previous_next_state: str | None = None,
    who: str = "default",
) -> Turn:
    messages = [{"role": "user", "content": user}]
    ids = tok.encode(f"**Answer {idx}:** forty-two", add_special_tokens=False)
    turn = Turn(
        session_id=sid,
        turn_index=idx,
        messages=messages,
        prompt_ids=prompt_ids(tok, messages),
        response_ids=ids,
        response_logprobs=[-0.5] * len(ids),
        response_text=f"**Answer {idx}:** 42",
        user=who,
    )
    state = NextState(role="user", content=previous_next_state) if previous_next_state else None
    store.record_turn(turn, next_state_for_previous=state)
    return turn


def test_judged_turns_become_samples_with_teacher_logprobs(remote, tiny, tmp_path, caplog):
    model, tok = tiny
    remote.eval_reply = "SCORE: -1"
    remote.hint_reply = "VERDICT: +1\n[HINT_START]Answer in plain prose without bold text.[HINT_END]"
    cfg = api_config(remote, training={"opd_enabled": True})
    store = Store(tmp_path / "store.sqlite")
    record(store, tok, "a", 0, "what is 6 * 7?")
    record(store, tok, "a", 1, "no bold please", previous_next_state="no bold please")
    judge = make_judge(cfg, teacher=LocalTeacher(model, tok, topk=2))
    service = JudgeLoop(cfg, store, judge=judge)
    with caplog.at_level(logging.INFO, logger="openclaw_rl.judge"):
        results = asyncio.run(service.run_once())
    assert len(results) == 1 and results[0].score == -1
    assert store.turn_status("a", 0) == "judged" and store.turn_status("a", 1) == "open"
    stored = store.judgement("a", 0)
    assert stored.score == -1 and [v.raw for v in stored.votes] == ["SCORE: -1"] * 3
    assert stored.hint == "Answer in plain prose without bold text."
    samples = store.claim_samples(10, step=1, current_version=0)
    assert len(samples) == 1
    s = samples[0]
    assert s.reward == -1.0 and len(s.teacher_logprobs) == len(s.response_ids)
    assert stored.teacher_context_len > 0
    text = caplog.text
    assert "[rollout] step=1 reward=-1 instruction_extracted=true" in text
    assert f"[opd] token_level_advantage applied, teacher_context_len={stored.teacher_context_len}" in text
    assert service.start_line() == "[prm_service] backend=taotoken, vote_count=3, extract_instruction=true"


def test_outage_is_stored_as_error_and_retried(remote, tiny, tmp_path):
    _, tok = tiny
    remote.fail_next = [500] * 100
    cfg = api_config(remote, api={"max_retries": 0}, extract_instruction=False, retry_interval_sec=0.5)
    store = Store(tmp_path / "store.sqlite")
    record(store, tok, "b", 0, "hi")
    record(store, tok, "b", 1, "thanks!", previous_next_state="thanks!")
    service = JudgeLoop(cfg, store)
    results = asyncio.run(service.run_once())
    assert len(results) == 1 and not results[0].ok and "HTTP 500" in results[0].error
    assert store.turn_status("b", 0) == "failed"
    assert store.judgement("b", 0).error is not None
    assert store.ready_count() == 0  # no sample from a failed judgement — and no score of 0
    assert store.counters().judged == 0 and store.counters().failed == 1
    # Not due yet: nothing to judge until retry_interval_sec has passed.
    remote.fail_next = []
    assert asyncio.run(service.run_once()) == [] and store.turn_status("b", 0) == "failed"
    time.sleep(0.6)
    results = asyncio.run(service.run_once())
    assert [r.score for r in results] == [1]
    assert store.turn_status("b", 0) == "judged"
    assert [s.reward for s in store.claim_samples(10, step=1, current_version=0)] == [1.0]


def test_all_zero_session_gets_its_guarantee_sample(remote, tiny, tmp_path):
    _, tok = tiny
    remote.eval_reply = "SCORE: 0"
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    record(store, tok, "c", 0, "hello")
    record(store, tok, "c", 1, "what's the weather?", previous_next_state="what's the weather?")
    store.close_session("c")
    service = JudgeLoop(cfg, store)
    asyncio.run(service.run_once())
    samples = store.claim_samples(10, step=1, current_version=0)
    assert [(s.turn_index, s.reward) for s in samples] == [(0, 0.0)]
    assert store.sessions_needing_guarantee() == []


def test_background_loop_judges_while_running(remote, tiny, tmp_path):
    _, tok = tiny
    cfg = api_config(remote, extract_instruction=False, num_workers=2)
    store = Store(tmp_path / "store.sqlite")
    service = JudgeLoop(cfg, store)
    service.start()
    try:
        for sid in ("d1", "d2", "d3"):
            record(store, tok, sid, 0, "q")
            record(store, tok, sid, 1, "great, thanks", previous_next_state="great, thanks")
        deadline = time.time() + 30
        while store.counters().judged < 3 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        service.stop()
    assert store.counters().judged == 3 and service.step == 3
    assert JudgeLoop(cfg, store).step == 3  # a restarted judge goes on counting the run's judged turns


def test_service_runs_as_its_own_process(remote, tmp_path):
    """``python -m openclaw_rl.judge.loop --config FILE`` judges what another process recorded."""
    import signal

    from .conftest import KEY

    log_dir = tmp_path / "run"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[global]
log_dir = "{log_dir}"
[api]
base_url = "{remote.url}"
api_key = "{KEY}"
timeout_sec = 5
[prm_service]
backend = "taotoken"
model = "judge-model"
extract_instruction = false
retry_interval_sec = 0.1
""")
    store = Store(log_dir / "store.sqlite")
    for idx, state in ((0, None), (1, "thanks, that works")):
        store.record_turn(
            Turn(
                session_id="p",
                turn_index=idx,
                messages=[{"role": "user", "content": "q"}],
                prompt_ids=[1, 2],
                response_ids=[3, 4],
                response_logprobs=[-0.1, -0.2],
            ),
            next_state_for_previous=NextState(role="user", content=state) if state else None,
        )
    proc = start_module("openclaw_rl.judge.loop", config)
    try:
        deadline = time.time() + 120
        while store.turn_status("p", 0) != "judged" and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert store.turn_status("p", 0) == "judged", out
    assert "[prm_service] backend=taotoken, vote_count=3, extract_instruction=false" in out
    assert "[rollout] step=1 reward=1 instruction_extracted=false" in out
    assert KEY not in out
    assert proc.returncode == 0, out


def test_two_services_on_one_store_judge_each_turn_exactly_once(remote, tiny, tmp_path):
    """Two judges (separate Store handles on one file, as two processes or Ray actors would have)."""
    _, tok = tiny
    remote.delay_s = 0.05  # judging takes a moment, so both judges are busy at once
    cfg = api_config(remote, extract_instruction=False, num_workers=2)
    path = tmp_path / "store.sqlite"
    recorder, store_a, store_b = Store(path), Store(path), Store(path)
    for i in range(10):
        record(recorder, tok, f"e{i}", 0, "q")
        record(recorder, tok, f"e{i}", 1, "great, thanks", previous_next_state="great, thanks")
    a = JudgeLoop(cfg, store_a, worker_id="judge-0")
    b = JudgeLoop(cfg, store_b, worker_id="judge-1")
    a.start()
    b.start()
    try:
        deadline = time.time() + 60
        while recorder.counters().judged < 10 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a double judgement, were there one, would land now
    finally:
        a.stop()
        b.stop()
    c = recorder.counters()
    assert (c.judged, c.waiting, c.samples_ready) == (10, 0, 10)
    assert remote.calls == 10 * cfg.prm_service.vote_count  # each turn judged once, by one judge
    assert a.step + b.step == 10 and a.step > 0 and b.step > 0
    assert a.taken_over == b.taken_over == 0
    for s in (recorder, store_a, store_b):
        s.close()


def test_a_judge_whose_lease_ran_out_drops_its_late_result(remote, tiny, tmp_path, caplog):
    _, tok = tiny
    remote.delay_s = 0.4
    cfg = api_config(remote, extract_instruction=False, vote_count=1)
    path = tmp_path / "store.sqlite"
    store_a, store_b = Store(path), Store(path)
    record(store_a, tok, "f", 0, "q")
    record(store_a, tok, "f", 1, "thanks", previous_next_state="thanks")
    slow = JudgeLoop(cfg, store_a, worker_id="judge-0", lease_s=0.1)  # lease shorter than its judgement
    other = JudgeLoop(cfg, store_b, worker_id="judge-1")

    async def both():
        first = asyncio.create_task(slow.run_once())
        await asyncio.sleep(0.2)  # slow's lease has run out, its judgement is still in flight
        second = await other.run_once()
        return await first, second

    with caplog.at_level(logging.INFO, logger="openclaw_rl.judge"):
        first, second = asyncio.run(both())
    assert len(first) == 1 and len(second) == 1  # both judged the turn ...
    assert (slow.step, slow.taken_over, other.step, other.taken_over) == (0, 1, 1, 0)  # ... one result counts
    assert "judge-0: turn f:0 was taken over by another judge" in caplog.text
    assert store_a.counters().samples_ready == 1 and store_a.turn_status("f", 0) == "judged"
    store_a.close()
    store_b.close()


def test_a_restarted_judge_frees_its_own_stale_leases(remote, tiny, tmp_path):
    _, tok = tiny
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    record(store, tok, "g", 0, "q")
    record(store, tok, "g", 1, "thanks", previous_next_state="thanks")
    # The previous incarnation of judge-3 leased the turn for 10 minutes, then died.
    assert [t.key for t in store.claim_turns("judge-3", limit=1, lease_s=600)] == ["g:0"]
    assert asyncio.run(JudgeLoop(cfg, store, worker_id="judge-4").run_once()) == []  # not its lease
    restarted = JudgeLoop(cfg, store, worker_id="judge-3")
    assert [r.score for r in asyncio.run(restarted.run_once())] == [1]  # freed at start, judged at once
    assert store.turn_status("g", 0) == "judged"
    with pytest.raises(ValueError, match="worker_id"):
        JudgeLoop(cfg, store, worker_id=" ")
    store.close()


def test_a_groups_samples_wait_for_the_whole_group_and_are_relative_to_it(remote, tiny, tmp_path):
    _, tok = tiny
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    service = JudgeLoop(cfg, store)
    tag = EpisodeTag(group_id="g1", group_size=3)

    def play(sid: str, reply: str) -> None:
        remote.eval_reply = reply
        record(store, tok, sid, 0, "what is 6 * 7?")
        store.tag_session(sid, tag)
        record(store, tok, sid, 1, "that's right", previous_next_state="that's right")  # the closing turn
        store.close_session(sid)
        asyncio.run(service.run_once())

    play("m0", "SCORE: +1")
    play("m1", "SCORE: -1")
    assert store.turn_status("m1", 0) == "judged" and store.ready_count() == 0  # waiting for m2
    assert store.sessions_needing_guarantee() == []  # a group member gets no at-least-one sample
    play("m2", "SCORE: -1")
    samples = {s.session_id: s for s in store.claim_samples(10, step=1, current_version=0)}
    assert set(samples) == {"m0", "m1", "m2"}
    assert samples["m0"].advantage == pytest.approx(1 + 1 / 3) and samples["m0"].reward == 1.0
    assert samples["m1"].advantage == pytest.approx(-1 + 1 / 3) and samples["m1"].group_id == "g1"
    signal = store.get_meta("signal")
    assert signal["judged"] == 3 and signal["groups"] == 1 and signal["groups_zero_advantage"] == 0
    assert asyncio.run(service.run_once()) == [] and store.ready_count() == 0  # made once


def test_a_group_with_a_dead_member_is_made_once_it_has_been_quiet(remote, tiny, tmp_path):
    _, tok = tiny
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    tag = EpisodeTag(group_id="g2", group_size=2)
    service = JudgeLoop(cfg, store)
    for sid, verdict in (("done", "SCORE: +1"), ("dead", "SCORE: -1")):
        remote.eval_reply = verdict
        record(store, tok, sid, 0, "q")
        store.tag_session(sid, tag)
        record(store, tok, sid, 1, "ok", previous_next_state="ok")
        asyncio.run(service.run_once())
    store.close_session("done")  # "dead" never finishes (its environment crashed)
    asyncio.run(service.run_once())
    assert store.groups_ready() == [] and store.ready_count() == 0
    assert store.groups_ready(quiet_s=0.0) == ["g2"]
    asyncio.run(JudgeLoop(cfg, store, group_quiet_s=0.0).run_once())
    # The dead member is closed once quiet: its judged turn counts with the group (nothing recorded
    # is lost), compared with the finished member's.
    made = {s.session_id: s for s in store.claim_samples(10, step=1, current_version=0)}
    assert set(made) == {"done", "dead"}
    assert made["done"].advantage > 0 > made["dead"].advantage


def test_a_group_whose_every_member_died_is_made_once_quiet(remote, tiny, tmp_path):
    """The environment worker (or the launcher) killed mid-group: no member finished, yet their
    judged turns become samples once the group is quiet, not never."""
    _, tok = tiny
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    tag = EpisodeTag(group_id="g3", group_size=2)
    for sid, verdict in (("a", "SCORE: +1"), ("b", "SCORE: -1")):
        remote.eval_reply = verdict
        record(store, tok, sid, 0, "q")
        store.tag_session(sid, tag)
        record(store, tok, sid, 1, "next", previous_next_state="next")  # turn 1 stays open
        asyncio.run(JudgeLoop(cfg, store).run_once())
    assert store.ready_count() == 0  # not quiet yet: the members may still finish
    asyncio.run(JudgeLoop(cfg, store, group_quiet_s=0.0).run_once())
    made = store.claim_samples(10, step=1, current_version=0)
    assert sorted(s.session_id for s in made) == ["a", "b"] and all(s.turn_index == 0 for s in made)
    assert store.turn_status("a", 1) == "closed"


def test_explicit_feedback_is_decisive_and_its_comment_is_the_hint_source(remote, tiny, tmp_path):
    from openclaw_rl.runtime.users import Feedback

    model, tok = tiny
    remote.eval_reply = "The user is happy.\nSCORE: +1"  # what the judge model would say of the text
    remote.hint_reply = "VERDICT: +1\n[HINT_START]Name the city the user asked about.[HINT_END]"
    cfg = api_config(remote, training={"opd_enabled": True})
    store = Store(tmp_path / "store.sqlite")
    t = record(store, tok, "f", 0, "capital of Australia?")
    t.response_id = "chatcmpl-f0"
    store.record_turn(t)
    record(store, tok, "f", 1, "thanks!", previous_next_state="thanks!")
    store.record_feedback(Feedback("chatcmpl-f0", "default", -1, "wrong, it's Canberra", time.time()))
    service = JudgeLoop(cfg, store, judge=make_judge(cfg, teacher=LocalTeacher(model, tok, topk=0)))
    [result] = asyncio.run(service.run_once())
    assert result.score == -1  # the rating, although the reply text reads as thanks
    assert [v.score for v in result.votes] == [-1, -1, -1]
    assert all(v.raw == "explicit feedback: the user rated this response -1" for v in result.votes)
    assert result.hint == "Name the city the user asked about."  # drawn from the comment
    [sample] = store.claim_samples(10, step=1, current_version=0)
    assert sample.reward == -1.0 and sample.teacher_logprobs is not None


def test_explicit_positive_feedback_without_a_comment_asks_for_no_hint(remote, tiny, tmp_path):
    from openclaw_rl.runtime.users import Feedback

    _, tok = tiny
    remote.eval_reply = "SCORE: -1"
    cfg = api_config(remote)
    store = Store(tmp_path / "store.sqlite")
    t = record(store, tok, "g", 0, "hi")
    t.response_id = "chatcmpl-g0"
    store.record_turn(t)
    store.record_feedback(Feedback("chatcmpl-g0", "default", 1, None, time.time()))
    calls = remote.calls
    [result] = asyncio.run(JudgeLoop(cfg, store).run_once())
    assert result.score == 1 and result.hint is None
    assert remote.calls == calls  # decided by the rating alone: the judge model was not asked


def test_the_teacher_reads_what_the_same_user_asked_for_before_and_nothing_of_anyone_else(
    remote, tiny, tmp_path
):
    model, tok = tiny
    cfg = api_config(remote, training={"opd_enabled": True}, hint_memory=4)
    store = Store(tmp_path / "store.sqlite")
    service = JudgeLoop(cfg, store, judge=make_judge(cfg, teacher=LocalTeacher(model, tok, topk=0)))
    remote.eval_reply = "SCORE: -1"

    def judge_one(sid: str, who: str, hint: str):
        remote.hint_reply = f"VERDICT: +1\n[HINT_START]{hint}[HINT_END]"
        record(store, tok, sid, 0, "what is 6 * 7?", who=who)
        record(store, tok, sid, 1, "redo it", previous_next_state="redo it", who=who)
        [result] = asyncio.run(service.run_once())
        return result

    first = judge_one("ann-1", "ann", "Answer in plain prose without bold text.")
    assert first.teacher_hint == first.hint  # nothing asked before: this turn's hint alone
    judge_one("bob-1", "bob", "Use a heading for every section please.")
    again = judge_one("ann-2", "ann", "Answer in plain prose without bold text.")
    assert again.teacher_hint == again.hint  # a repeat of an earlier wish is listed once
    later = judge_one("ann-3", "ann", "Put the final answer on the last line, e.g. 800.")
    assert later.hint == "Put the final answer on the last line, e.g. 800."
    # ann's earlier wish first, this turn's last; the number stays (it is this turn's own hint)
    assert later.teacher_hint == (
        "- Answer in plain prose without bold text.\n- Put the final answer on the last line, e.g. 800."
    )
    assert later.teacher_context_len > first.teacher_context_len
    bobs = judge_one("bob-2", "bob", "Please be more formal.")
    assert "Use a heading" in bobs.teacher_hint and "prose" not in bobs.teacher_hint
    # an earlier hint's figures are about its own problem: masked in a later turn that never saw them
    last = judge_one("ann-4", "ann", "Drop the chatbot phrases.")
    assert "e.g. ...\n" in last.teacher_hint and "800" not in last.teacher_hint
    assert last.teacher_hint.endswith("- Drop the chatbot phrases.")
    stored = store.judgement("ann-4", 0)
    assert stored.teacher_hint == last.teacher_hint  # what the teacher read is kept with the turn


def test_hint_memory_off_gives_the_teacher_this_turns_hint_only(remote, tiny, tmp_path):
    model, tok = tiny
    cfg = api_config(remote, training={"opd_enabled": True}, hint_memory=0)
    store = Store(tmp_path / "store.sqlite")
    service = JudgeLoop(cfg, store, judge=make_judge(cfg, teacher=LocalTeacher(model, tok, topk=0)))
    remote.eval_reply = "SCORE: -1"
    for i, hint in enumerate(["Answer in plain prose please.", "End with the final answer."]):
        remote.hint_reply = f"VERDICT: +1\n[HINT_START]{hint}[HINT_END]"
        record(store, tok, f"s{i}", 0, "q", who="ann")
        record(store, tok, f"s{i}", 1, "redo", previous_next_state="redo", who="ann")
        [result] = asyncio.run(service.run_once())
        assert result.teacher_hint == hint


def test_a_judge_model_that_never_answers_readably_is_named_in_the_log(remote, tiny, tmp_path, caplog):
    """No valid vote scores 0 (the rule), but a judge model that never writes a SCORE line must not
    pass silently for one that finds no evidence, and a reply past its budget is stored shortened."""
    _, tok = tiny
    remote.eval_reply = "Well, it depends. " * 2000 + "Overall I like it."
    cfg = api_config(remote, extract_instruction=False)
    store = Store(tmp_path / "store.sqlite")
    record(store, tok, "h", 0, "hi")
    record(store, tok, "h", 1, "thanks", previous_next_state="thanks")
    with caplog.at_level("WARNING", logger="openclaw_rl.judge"):
        [result] = asyncio.run(JudgeLoop(cfg, store).run_once())
    assert result.ok and result.score == 0
    assert "none of its 3 votes had a readable answer" in caplog.text
    stored = store.judgement("h", 0)
    assert stored is not None and all(len(v.raw) < 4_100 for v in stored.votes)
    assert stored.votes[0].raw.endswith("Overall I like it.")
