"""The embedded minilm judge: training data validation, accuracy sanity, votes, extractive hints."""

from __future__ import annotations

import asyncio
import json

import pytest

from openclaw_rl.config import Config, PrmServiceConfig
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.minilm import JudgeDataError, MiniLMJudge, extract_hint, load_examples
from openclaw_rl.types import NextState

pytestmark = pytest.mark.slow  # starts real processes, a sandbox, Ray, FSDP or trains a model

# Unseen phrasings (not in openclaw_rl/judge/data), in the three styles.
CASES = [
    ("user", "brilliant, that's spot on. let's do the next exercise", 1),
    ("user", "way too formal, and please lose the bullet points", -1),
    ("user", "wrong again, the question says 15 minutes per lap", -1),
    ("tool", "$ pythn run.py\nbash: pythn: command not found\n[exit code 127]", -1),
    ("tool", "$ python run.py\nall 3 checks passed\n[exit code 0]", 1),
    ("tool", '{"ok": true, "order_id": 5512}', 1),
    ("tool", "ValueError: month must be in 1..12", -1),
]


@pytest.fixture(scope="module")
def judge():
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", temperature=0.0, vote_count=3))
    return make_judge(cfg)


def test_shipped_data_is_valid_and_covers_every_label_and_style():
    examples = load_examples()
    assert len(examples) >= 250
    assert {e.label for e in examples} == {1, -1, 0}
    assert {e.style for e in examples} >= {"chat", "terminal", "tool_call", "gui"}


def test_bad_training_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"role": "user", "next_state": "ok", "label": 1}) + "\n"
                   + json.dumps({"role": "user", "next_state": "ok", "label": 2}) + "\n")
    with pytest.raises(JudgeDataError, match=r"bad.jsonl:2: label must be 1, -1 or 0"):
        load_examples([bad])
    bad.write_text("{not json\n")
    with pytest.raises(JudgeDataError, match=r"bad.jsonl:1: not valid JSON"):
        load_examples([bad])


def test_accuracy_sanity_on_unseen_cases(judge):
    assert isinstance(judge, MiniLMJudge)

    async def go():
        return [await judge.score("response", NextState(role=r, content=c)) for r, c, _ in CASES]
    results = asyncio.run(go())
    correct = [res.score == expected for res, (_, _, expected) in zip(results, CASES, strict=True)]
    assert sum(correct) >= len(CASES) - 1, [(c[1], r.score) for c, r in zip(CASES, results, strict=True)]
    for res in results:
        assert len(res.votes) == 3 and all("minilm classifier" in v.raw for v in res.votes)


def test_negative_user_reply_yields_extractive_hint(judge):
    res = asyncio.run(judge.score("**1.** Add\n**2.** Multiply",
                                  NextState(role="user", content="way too formal, and please lose the bullet points")))
    assert res.score == -1
    assert res.hint is not None and "bullet points" in res.hint and "formal" in res.hint
    pos = asyncio.run(judge.score("done", NextState(role="user", content="thanks, can you save it?")))
    assert pos.score == 1 and pos.hint is None


def test_votes_respect_reward_space():
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", reward_space=[1, -1], vote_count=5,
                                              temperature=1.0))
    res = asyncio.run(make_judge(cfg).score("x", NextState(role="user", content="hmm")))
    assert len(res.votes) == 5 and all(v.score in (1, -1) for v in res.votes)


@pytest.mark.parametrize("role, text, expected", [
    ("user", "this sounds like a robot wrote it, no bold or numbered lists please",
     "No bold or numbered lists please."),
    ("user", "ugh. use the file tool instead", "Use the file tool instead."),
    ("user", "wrong. it's Canberra",
     'The user replied: "wrong. it\'s Canberra". Take this correction into account.'),
    ("user", "you sound like a textbook. drop the bold, just talk to me", "Drop the bold. Just talk to me."),
    ("tool", "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'id'\n[exit code 1]",
     "The previous action failed with: KeyError: 'id'. Fix the cause of this error instead of repeating the action."),
    ("tool", "42\n[exit code 0]", None),
])
def test_extract_hint(role, text, expected):
    assert extract_hint(role, text) == expected
