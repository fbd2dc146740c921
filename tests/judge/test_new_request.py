"""A next message that moves on to a new request with its own instructions: the instructions belong to
the new request, not to a correction of the response (judge/new_request.py)."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_rl.config import Config, PrmServiceConfig
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.new_request import request_part
from openclaw_rl.types import NextState

CANBERRA = "The capital of Australia is Canberra, a planned city chosen as a compromise in 1908."
CITIES = "Paris has about 2.1 million people and Lyon about 520,000, so Paris is much bigger than Lyon."


@pytest.mark.parametrize(
    "response, message, part",
    [
        (CANBERRA, "Is Paris bigger than Lyon? Answer yes or no.", "Is Paris bigger than Lyon?"),
        (
            CANBERRA,
            "Now write a haiku about autumn. Keep it under 20 words.",
            "Now write a haiku about autumn.",
        ),
        (
            CANBERRA,
            "Thanks! How many legs does a spider have? Reply with a digit.",
            "Thanks! How many legs does a spider have?",
        ),
        (CANBERRA, "巴黎比里昂大吗？只回答是或否。", "巴黎比里昂大吗？"),
    ],
)
def test_a_new_request_on_another_subject_keeps_its_instructions_to_itself(response, message, part):
    assert request_part(message, response) == part


@pytest.mark.parametrize(
    "response, message",
    [
        # the same subject asked for in another format: a redo, read whole
        (CITIES, "Is Paris bigger than Lyon? Answer yes or no."),
        # corrections and complaints, whatever follows them
        (CANBERRA, "Is that right? I think it's Sydney. Check again."),
        (CANBERRA, "Why did you mention 1908? That's wrong, fix it."),
        (CANBERRA, "No. Answer yes or no next time."),
        (CANBERRA, "Where does the planned city thing come from? Too long, just the name."),
        # referring back to the response
        (CANBERRA, "Can you give that as a numbered list instead? Keep it short."),
        (CANBERRA, "Write it again without the date. One sentence."),
        (CANBERRA, "Thanks. Now give it to me as a numbered list."),
        # a request that is the whole message: nothing to set aside
        (CANBERRA, "Is Paris bigger than Lyon?"),
        # too little of its own to tell a new subject ("Show your working?")
        (CANBERRA, "Show the steps please? One per line."),
        # a response too short to know its subject (a rephrased request?)
        ("Sydney.", "What is the capital city of Australia? One word."),
    ],
)
def test_anything_else_is_read_whole(response, message):
    assert request_part(message, response) is None


@pytest.fixture(scope="module")
def judge():
    return make_judge(Config(prm_service=PrmServiceConfig(backend="minilm", temperature=0.0, vote_count=3)))


@pytest.mark.slow
def test_the_judge_takes_no_hint_from_a_new_requests_own_instructions(judge):
    state = NextState(role="user", content="Is Paris bigger than Lyon? Answer yes or no.")
    moved_on = asyncio.run(judge.score(CANBERRA, state))
    assert moved_on.score != -1, moved_on.votes  # moving on is no correction of the Canberra answer
    assert moved_on.hint is None or "yes or no" not in moved_on.hint.lower()
    assert "new request" in moved_on.votes[0].raw

    # after a paragraph comparing the two cities the same words ask for the answer again, shorter
    redo = asyncio.run(judge.score(CITIES, state))
    assert redo.score == -1 and redo.hint is not None and "yes or no" in redo.hint.lower()
