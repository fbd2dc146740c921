"""The API backend against a real OpenAI-compatible server on loopback (it plays the remote judge)."""

from __future__ import annotations

import asyncio

from openclaw_rl.judge import make_judge
from openclaw_rl.judge.api import ApiJudge
from openclaw_rl.types import NextState

from .conftest import api_config

STATE = NextState(role="user", content="no bold please")


def run(judge, response="**Answer:** 7", state=STATE):
    async def go():
        try:
            return await judge.score(response, state)
        finally:
            await judge.close()

    return asyncio.run(go())


def test_votes_majority_and_hint(remote):
    remote.eval_reply = "The user asks to change the formatting.\nSCORE: -1"
    remote.hint_reply = "VERDICT: +1\n[HINT_START]Answer in plain text without bold formatting.[HINT_END]"
    judge = make_judge(api_config(remote))
    assert isinstance(judge, ApiJudge) and judge.name == "taotoken"
    result = run(judge)
    assert result.ok and result.score == -1
    assert len(result.votes) == 3 and all(v.raw.endswith("SCORE: -1") for v in result.votes)
    assert result.hint == "Answer in plain text without bold formatting."
    assert len(result.hint_votes) == 3
    assert remote.calls == 6  # 3 evaluative + 3 hint requests


def test_base_url_ending_in_v1_works(remote):
    cfg = api_config(remote, api={"base_url": remote.url + "/v1"}, extract_instruction=False)
    result = run(make_judge(cfg))
    assert result.ok and result.score == 1 and result.hint_votes == []


def test_unparsable_replies_are_invalid_votes_not_errors(remote):
    remote.eval_reply = "I would rather not say."
    result = run(make_judge(api_config(remote, extract_instruction=False)))
    assert result.ok and result.score == 0
    assert [v.score for v in result.votes] == [None, None, None]
    assert result.votes[0].raw == "I would rather not say."


def test_no_reply_at_all_is_an_error_not_a_zero(remote):
    """A reasoning model that spends the reply budget thinking returns null content cut at
    "length": as invalid votes that was a score of 0, fed to training with no word of it."""
    remote.eval_reply, remote.finish_reason = None, "length"
    result = run(make_judge(api_config(remote, extract_instruction=False)))
    assert not result.ok  # stored as an error: the turn is judged again, never trained on as 0
    assert "3 empty replies" in result.error and "3 cut at the 384-token reply budget" in result.error


def test_scores_outside_reward_space_are_invalid(remote):
    remote.eval_reply = "SCORE: 0"
    result = run(make_judge(api_config(remote, reward_space=[1, -1], extract_instruction=False)))
    assert result.ok and result.score == 0 and all(v.score is None for v in result.votes)


def test_429_is_retried_then_succeeds(remote):
    remote.fail_next = [429, 503]
    result = run(make_judge(api_config(remote, vote_count=1, extract_instruction=False)))
    assert result.ok and result.score == 1
    assert remote.calls == 3  # two refusals, then the answer


def test_rate_limit_after_retries_is_an_error_not_a_zero(remote):
    remote.fail_next = [429] * 10
    result = run(make_judge(api_config(remote, vote_count=1, extract_instruction=False)))
    assert not result.ok
    assert "rate-limiting (HTTP 429) (retried up to 2 times)" in result.error
    assert result.votes == []


def test_timeout_is_an_error(remote):
    remote.delay_s = 2.0
    cfg = api_config(
        remote, api={"timeout_sec": 0.3, "max_retries": 0}, vote_count=1, extract_instruction=False
    )
    result = run(make_judge(cfg))
    assert not result.ok and "timed out" in result.error and remote.url in result.error


def test_refused_key_is_a_clear_error_without_the_key(remote):
    cfg = api_config(remote, api={"api_key": "wrong-judge-key"}, vote_count=1)
    result = run(make_judge(cfg))
    assert not result.ok and "refused the API key" in result.error
    assert "wrong-judge-key" not in result.error


def test_unreachable_api_is_an_error():
    from openclaw_rl.config import build_config

    cfg = build_config(
        {
            "api": {"base_url": "http://127.0.0.1:9", "timeout_sec": 1, "max_retries": 0},
            "prm_service": {"backend": "api", "vote_count": 1},
        },
        environ={},
    )
    result = run(make_judge(cfg))
    assert not result.ok and "could not be reached" in result.error


def test_a_page_that_is_not_a_chat_completion_is_a_clear_error(remote):
    # base_url pointing at a web page: a 200 whose body is HTML, or JSON cut short
    for body, says in (("<html>oops</html>", "not a chat completion"), ('{"choices": [', "not JSON")):
        remote.reset()
        remote.raw_body = body
        result = run(make_judge(api_config(remote, vote_count=1, extract_instruction=False)))
        assert not result.ok and remote.url in result.error and says in result.error, result.error


def test_a_refusal_says_the_endpoints_reason_and_is_not_called_retried(remote):
    # the endpoint's reason quotes the key it was sent (a key of no known shape): masked
    remote.fail_next, remote.key = [400], "plain-judge-key"
    cfg = api_config(remote, api={"api_key": "plain-judge-key"}, vote_count=1, extract_instruction=False)
    result = run(make_judge(cfg))
    assert not result.ok and "HTTP 400: canned 400 for the key [key]" in result.error, result.error
    assert "retried" not in result.error and "plain-judge-key" not in result.error
    assert remote.calls == 1


def test_votes_that_are_not_an_answer_in_reward_space_are_invalid(remote):
    # "1/10" is no +1, a verdict of 7 is no verdict (and its hint goes with it)
    remote.eval_reply = "I'd rate it SCORE: 1/10"
    remote.hint_reply = "VERDICT: 7\n[HINT_START]Use a table.[HINT_END]"
    result = run(make_judge(api_config(remote)))
    assert result.ok and result.score == 0 and all(v.score is None for v in result.votes)
    assert result.hint is None and all(v.score is None for v in result.hint_votes)
    remote.reset()
    remote.eval_reply = "用户在纠正。\nSCORE：-1"  # a full-width colon, as Chinese-tuned models write
    assert run(make_judge(api_config(remote, extract_instruction=False))).score == -1


def test_a_huge_next_state_is_sent_clipped_and_a_huge_hint_is_not_kept(remote):
    remote.hint_reply = "VERDICT: +1\n[HINT_START]" + "Do this. " * 400 + "[HINT_END]"
    log = "line\n" * 40_000 + "BUILD FAILED"
    result = run(make_judge(api_config(remote)), state=NextState(role="environment", content=log))
    assert result.ok and result.hint is None  # 3,600 characters is no 1-3 sentence hint
    from openclaw_rl.judge.prompts import MAX_QUOTED_CHARS, evaluative_messages

    sent = evaluative_messages("ok", NextState(role="environment", content=log))[1]["content"]
    assert len(sent) < MAX_QUOTED_CHARS + 500 and sent.rstrip(">\n").endswith("BUILD FAILED")
    assert "characters left out" in sent
