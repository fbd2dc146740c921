"""Voting rules, answer parsing, hint selection and distribution sampling."""

from __future__ import annotations

import random

import pytest

from openclaw_rl.judge.prompts import (
    HINT_END,
    HINT_START,
    evaluative_messages,
    hint_messages,
    parse_hint_vote,
    parse_score,
)
from openclaw_rl.judge.voting import majority, restrict, sample_from_distribution, select_hint, tempered
from openclaw_rl.types import NextState, Vote

SPACE = [1, -1, 0]


def votes(*scores):
    return [Vote(raw=str(s), score=s) for s in scores]


@pytest.mark.parametrize(
    "scores, expected",
    [
        ((1, 1, -1), 1),
        ((-1, -1, 1), -1),
        ((1, -1, 0), 0),  # three-way tie
        ((1, -1), 0),  # two-way tie
        ((1, None, None), 1),  # invalid votes are not counted
        ((1, -1, None), 0),  # tie among the valid ones
        ((None, None, None), 0),  # all invalid
        ((), 0),
        ((0, 0, 1), 0),
        ((-1, -1, -1, 1, 1), -1),
    ],
)
def test_majority(scores, expected):
    assert majority(votes(*scores), SPACE) == expected


def test_majority_ignores_scores_outside_reward_space():
    # With reward_space [1, -1], a 0 vote is invalid: two 0s cannot outvote one -1.
    assert majority(votes(0, 0, -1), [1, -1]) == -1
    assert majority(votes(0, 0, 0), [1, -1]) == 0


def test_parse_score():
    assert parse_score("looks fine.\nSCORE: +1", SPACE) == 1
    assert parse_score("SCORE: -1", SPACE) == -1
    assert parse_score("score = 0", SPACE) == 0
    assert parse_score("first SCORE: 1 ... on reflection SCORE: -1", SPACE) == -1  # last answer wins
    assert parse_score("\\boxed{-1}", SPACE) == -1
    assert parse_score("I think it is good", SPACE) is None
    assert parse_score("SCORE: 7", SPACE) is None
    assert parse_score("SCORE: 0", [1, -1]) is None  # outside reward_space: invalid vote
    assert parse_score("", SPACE) is None


def test_parse_score_reads_typographic_signs():
    # A minus sign (U+2212), an en dash or the full-width forms are the vote the judge meant.
    assert parse_score("SCORE: \u22121", SPACE) == -1
    assert parse_score("SCORE：－1", SPACE) == -1
    assert parse_score("SCORE: \u2013 1", SPACE) == -1
    assert parse_score("SCORE: ＋1", SPACE) == 1
    assert parse_hint_vote("VERDICT: \u22121")[0] == -1
    assert parse_score("SCORE: \u22127", SPACE) is None


@pytest.mark.parametrize(
    "text",
    ["SCORE: １", "SCORE：＋１", "SCORE: (+1)", "SCORE: [+1]", 'SCORE: "+1"', "SCORE: `+1`", "SCORE: 【+1】"],
)
def test_parse_score_reads_a_vote_in_full_width_digits_brackets_or_quotes(text):
    assert parse_score(text.replace("+1", " +1 ") if text[7:8] in "([" else text, SPACE) == 1
    assert parse_score(text, SPACE) == 1
    assert parse_score(text.replace("1", "7").replace("１", "７"), SPACE) is None


def test_judge_is_offered_only_the_scores_it_may_give():
    state = NextState(role="user", content="ok")
    with_zero = evaluative_messages("x", state, reward_space=[1, -1, 0])[0]["content"]
    assert with_zero.endswith("SCORE: 0") and "Score 0 only when" in with_zero
    binary = evaluative_messages("x", state, reward_space=[1, -1])[0]["content"]
    assert "SCORE: 0" not in binary and "Score 0" not in binary and binary.endswith("SCORE: +1 or SCORE: -1")
    assert "change request" in binary  # the grading rules themselves stay
    short = evaluative_messages("x", state, short_answer=True, reward_space=[1, -1])[0]["content"]
    assert "UNCLEAR" not in short and short.endswith("GOOD (score +1) or BAD (score -1).")


def test_parse_hint_vote():
    text = f"VERDICT: +1\n{HINT_START}Write plain prose without bold text.{HINT_END}"
    assert parse_hint_vote(text) == (1, "Write plain prose without bold text.")
    assert parse_hint_vote("VERDICT: -1") == (-1, None)
    assert parse_hint_vote(f"VERDICT: -1 {HINT_START}ignored{HINT_END}") == (-1, None)
    assert parse_hint_vote("VERDICT: +1 but no markers") == (1, None)
    assert parse_hint_vote(f"{HINT_START}Use the file tool.{HINT_END}") == (1, "Use the file tool.")
    assert parse_hint_vote("no idea") == (None, None)


def test_select_hint_keeps_longest_positive_over_ten_chars():
    vs = [
        Vote(raw="", score=1, hint="Be brief."),  # 9 chars: too short
        Vote(raw="", score=1, hint="Use plain prose, no lists."),
        Vote(raw="", score=1, hint="Use plain prose without any lists or bold."),
        Vote(raw="", score=-1, hint="a much much longer hint from a negative vote, never kept"),
        Vote(raw="", score=None),
    ]
    assert select_hint(vs) == "Use plain prose without any lists or bold."
    assert select_hint([Vote(raw="", score=1, hint="too short")]) is None
    assert select_hint([Vote(raw="", score=1, hint="exactly 10")]) is None  # must be MORE than 10
    assert select_hint([Vote(raw="", score=1, hint="eleven char")]) == "eleven char"
    assert select_hint([]) is None


def test_prompts_carry_response_state_and_role():
    msgs = evaluative_messages("the answer is 4", NextState(role="tool", content="[exit code 1]"))
    assert "SCORE" in msgs[0]["content"] and "change request" in msgs[0]["content"]
    assert "the answer is 4" in msgs[1]["content"] and "[exit code 1]" in msgs[1]["content"]
    assert "tool" in msgs[1]["content"]
    short = evaluative_messages("x", NextState(role="user", content="y"), short_answer=True)
    assert "GOOD" in short[0]["content"] and "SCORE:" not in short[0]["content"].split("\n")[-1]
    h = hint_messages("x", NextState(role="user", content="no bold please"))
    assert HINT_START in h[0]["content"] and "no bold please" in h[1]["content"]


def test_tempered_and_sampling():
    probs = {1: 0.7, -1: 0.2, 0: 0.1}
    assert tempered(probs, 0) == {1: 1.0, -1: 0.0, 0: 0.0}
    sharp = tempered(probs, 0.5)
    assert sharp[1] > 0.7 and abs(sum(sharp.values()) - 1) < 1e-9
    assert abs(tempered(probs, 1.0)[1] - 0.7) < 1e-9
    vs = sample_from_distribution(probs, 3, 0.0, random.Random(0))
    assert [v.score for v in vs] == [1, 1, 1] and "p(+1)=0.700" in vs[0].raw
    many = sample_from_distribution(probs, 2000, 1.0, random.Random(0))
    share = sum(v.score == 1 for v in many) / 2000
    assert 0.65 < share < 0.75
    assert restrict(probs, [1, -1]) == pytest.approx({1: 0.7 / 0.9, -1: 0.2 / 0.9})


@pytest.mark.parametrize(
    "text", ["SCORE: [-1, 0, +1]", "SCORE: (+1) or (-1)", "SCORE: +1 / -1", "SCORE: [-1", "SCORE: +1, 0, -1"]
)
def test_parse_score_takes_the_options_echoed_for_no_vote(text):
    assert parse_score(text, SPACE) is None
