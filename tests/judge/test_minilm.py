"""The embedded minilm judge: training data validation, accuracy sanity, the evidence-first votes and
what ``vote_count`` means for them, the head cache, held-out disjointness, extractive hints."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from openclaw_rl.config import Config, PrmServiceConfig
from openclaw_rl.envs.sandbox import CommandResult
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.minilm import (
    Example,
    JudgeDataError,
    MiniLMJudge,
    Recipe,
    StateClassifier,
    cache_key,
    extract_hint,
    load_examples,
)
from openclaw_rl.judge.voting import majority
from openclaw_rl.types import NextState

ROOT = Path(__file__).resolve().parents[2]

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
    assert len(examples) >= 800
    assert {e.label for e in examples} == {1, -1, 0}
    assert {e.style for e in examples} >= {"chat", "terminal", "tool_call", "gui"}
    assert {e.role for e in examples} == {"user", "tool", "environment", "system"}


def test_bad_training_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"role": "user", "next_state": "ok", "label": 1})
        + "\n"
        + json.dumps({"role": "user", "next_state": "ok", "label": 2})
        + "\n"
    )
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
        assert len(res.votes) == 3
        assert all("minilm classifier" in v.raw or v.raw.startswith("evidence:") for v in res.votes)


def _observation(exit_code: int, stdout: str = "", stderr: str = "") -> str:
    return CommandResult(
        command="c", stdout=stdout, stderr=stderr, exit_code=exit_code, elapsed_s=0.0
    ).as_observation()


# The four kinds the judge used to get wrong (fresh phrasings: in neither the training lines nor a
# held-out set): a correction that states the right answer, a shell error with a non-zero exit code,
# a bare successful exit, a redirection to another file.
@pytest.mark.parametrize(
    "role, text, expected",
    [
        ("user", "that's wrong, it's 17", -1),
        ("user", "wrong, the answer is 250 not 205", -1),
        ("user", "nope, it's Thursday the 9th, not the 10th", -1),
        ("environment", _observation(1, "", "grep: logs/today.txt: No such file or directory\n"), -1),
        (
            "tool",
            "$ python run.py\nusage: run.py [-h] --input FILE\nrun.py: error: the following arguments are required: "
            "--input\n[exit code 2]",
            -1,
        ),
        ("tool", "Process exited with code 3", -1),
        ("environment", _observation(0), 1),
        ("tool", "$ mkdir -p build\n[exit code 0]", 1),
        ("tool", "exit status 0", 1),
        ("user", "no, I meant the other file, settings.py", -1),
        ("user", "wrong file — I was asking about routes.ts, not app.ts", -1),
        ("user", "not that one, I meant the invoices folder", -1),
        # thanks, then a request for the same answer again in another form, is a correction; thanks,
        # then a new question, is not (phrasings that are in no training file)
        ("user", "Thanks. Now give it to me as a numbered list.", -1),
        ("user", "OK thank you. Now repeat that without the greeting.", -1),
        ("user", "Thanks! Now, how many days are in a leap year?", 1),
    ],
)
def test_formerly_missed_kinds_get_the_right_sign(judge, role, text, expected):
    res = asyncio.run(judge.score("previous action", NextState(role=role, content=text)))
    assert res.score == expected, res.votes


@pytest.mark.parametrize("votes", [1, 3, 5])
def test_decisive_evidence_gives_vote_count_identical_votes(votes):
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", vote_count=votes, temperature=1.5))
    judge = make_judge(cfg)
    for text, expected in ((_observation(0), 1), ("Traceback (most recent call last):\nKeyError: 'id'", -1)):
        res = asyncio.run(judge.score("x", NextState(role="tool", content=text)))
        assert len(res.votes) == votes  # N votes, each reads the same evidence and agrees
        assert {v.score for v in res.votes} == {expected} and res.score == expected
        assert all(v.raw.startswith("evidence:") for v in res.votes)
        assert len(res.hint_votes) == votes


def test_classifier_votes_are_independent_draws_combined_by_majority():
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", vote_count=4, temperature=1.0))
    judge = make_judge(cfg)
    assert isinstance(judge, MiniLMJudge)
    state = NextState(role="user", content="hmm, fine i guess")
    judge.distribution = lambda ns: {1: 0.5, -1: 0.5, 0: 0.0}  # an undecided head
    results = [asyncio.run(judge.score("x", state)) for _ in range(12)]
    for res in results:
        assert len(res.votes) == 4 and all("minilm classifier" in v.raw for v in res.votes)
        assert res.score == majority(res.votes, [1, -1, 0])
    # independent draws: the votes of one judgement differ, and a 2-2 split is a tie -> 0
    assert any(len({v.score for v in res.votes}) > 1 for res in results)
    assert any(res.score == 0 for res in results)


def test_evidence_outside_reward_space_leaves_the_decision_to_the_classifier():
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", reward_space=[-1, 0], vote_count=3))
    res = asyncio.run(make_judge(cfg).score("x", NextState(role="tool", content=_observation(0))))
    assert all(v.score in (-1, 0) and "minilm classifier" in v.raw for v in res.votes)


def test_negative_evidence_without_an_error_line_still_gives_a_hint(judge):
    res = asyncio.run(judge.score("ran it", NextState(role="environment", content=_observation(1))))
    assert res.score == -1 and res.hint is not None and "exit code: 1" in res.hint


def test_changed_training_set_or_recipe_invalidates_the_cached_head(judge, tmp_path):
    examples = [
        Example("user", "thanks, perfect", 1),
        Example("user", "wrong, it's 4", -1),
        Example("user", "brb", 0),
        Example("tool", "[exit 0]", 1),
        Example("tool", "KeyError: 'x'", -1),
        Example("tool", "still running", 0),
    ]
    changed = [*examples[:-1], Example("tool", "still running", 1)]
    assert cache_key(examples, Recipe()) != cache_key(changed, Recipe())
    assert cache_key(examples, Recipe()) != cache_key([*examples, Example("user", "ok", 0)], Recipe())
    assert cache_key(examples, Recipe()) != cache_key(examples, Recipe(hidden=64))
    embedder = judge.classifier.embedder
    first = StateClassifier(tmp_path, examples, embedder=embedder)
    again = StateClassifier(tmp_path, examples, embedder=embedder)
    assert again.cache_path == first.cache_path and again.trained_s == 0.0  # loaded, not retrained
    other = StateClassifier(tmp_path, changed, embedder=embedder)
    assert other.cache_path != first.cache_path
    assert len(list(tmp_path.glob("minilm_head_*.pt"))) == 2


def test_held_out_sets_are_disjoint_from_the_training_lines():
    spec = importlib.util.spec_from_file_location("bench_judge", ROOT / "bench" / "judge.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sets = bench.held_out_sets()
    assert len(sets["new"]) >= 150 and len(sets["old"]) >= 60
    assert {c["role"] for c in sets["new"]} == {"user", "tool", "environment", "system"}
    assert bench.overlap([e.next_state for e in load_examples()], sets) == []
    # the check is case-, whitespace- and punctuation-insensitive
    assert bench.overlap(["  THANKS!! "], {"x": [{"next_state": "thanks"}]}) == ["thanks"]


def test_negative_user_reply_yields_extractive_hint(judge):
    res = asyncio.run(
        judge.score(
            "**1.** Add\n**2.** Multiply",
            NextState(role="user", content="way too formal, and please lose the bullet points"),
        )
    )
    assert res.score == -1
    assert res.hint is not None and "bullet points" in res.hint and "formal" in res.hint
    pos = asyncio.run(judge.score("done", NextState(role="user", content="thanks, can you save it?")))
    assert pos.score == 1 and pos.hint is None


def test_votes_respect_reward_space():
    cfg = Config(
        prm_service=PrmServiceConfig(backend="minilm", reward_space=[1, -1], vote_count=5, temperature=1.0)
    )
    res = asyncio.run(make_judge(cfg).score("x", NextState(role="user", content="hmm")))
    assert len(res.votes) == 5 and all(v.score in (1, -1) for v in res.votes)


@pytest.mark.parametrize(
    "role, text, expected",
    [
        (
            "user",
            "this sounds like a robot wrote it, no bold or numbered lists please",
            "No bold or numbered lists please.",
        ),
        ("user", "ugh. use the file tool instead", "Use the file tool instead."),
        (
            "user",
            "wrong. it's Canberra",
            'The user replied: "wrong. it\'s Canberra". Take this correction into account.',
        ),
        (
            "user",
            "you sound like a textbook. drop the bold, just talk to me",
            "Drop the bold. Just talk to me.",
        ),
        (
            "tool",
            "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'id'\n[exit code 1]",
            "The previous action failed with: KeyError: 'id'. Fix the cause of this error instead of repeating the action.",
        ),
        ("tool", "42\n[exit code 0]", None),
        # a request asked as a question is the instruction it asks for
        ("user", "hmm, could you put the steps in a table? easier for me", "Put the steps in a table."),
        # a lead that only asks for another try takes no place of the hint's few sentences
        (
            "user",
            "Not quite what I wanted. Could you try again? The summary is too long, and use metric units",
            "Do not be too long. Use metric units.",
        ),
        # an example stays with the request it illustrates
        (
            "user",
            "ok thanks but it needs a source for each claim, like a link or a page number",
            "It needs a source for each claim, like a link or a page number.",
        ),
        # a quoted word keeps both of its quotes
        ("user", 'almost but drop the word "basically"', 'Drop the word "basically".'),
        ("user", "A summary at the top, please; my manager skims.", "A summary at the top please."),
        # a verdict on the reply is no instruction ("Answer wrong." would read as one): quoted instead
        ("user", "answer wrong", 'The user replied: "answer wrong". Take this correction into account.'),
        (
            "user",
            "这个 answer 不对啊，应该是84",
            'The user replied: "这个 answer 不对啊，应该是84". Take this correction into account.',
        ),
        ("user", "the answer is wrong, use the second table", "Use the second table."),
        # the directive words are English: another language's correction is quoted whole ("No 6 por
        # 7." was its hint), and so is one whose fragment is too short to keep ("Again.")
        (
            "user",
            "No, eso está mal. Te pedí 6 por 8, no 6 por 7.",
            'The user replied: "No, eso está mal. Te pedí 6 por 8, no 6 por 7.". Take this correction into account.',
        ),
        (
            "user",
            "Great job, you broke prod. Again.",
            'The user replied: "Great job, you broke prod. Again.". Take this correction into account.',
        ),
        ("user", "lol no", 'The user replied: "lol no". Take this correction into account.'),
        # a test run's FAILED line says what failed; the summary after it only counts
        (
            "environment",
            "tests/test_api.py ..F..\nFAILED tests/test_api.py::test_login - AssertionError: 401 != 200\n"
            "===== 1 failed, 4 passed in 0.31s =====",
            "The previous action failed with: FAILED tests/test_api.py::test_login - AssertionError: 401 != 200. "
            "Fix the cause of this error instead of repeating the action.",
        ),
    ],
)
def test_extract_hint(role, text, expected):
    assert extract_hint(role, text) == expected


def test_a_failed_builds_hint_names_its_cause_not_the_wrapper(judge):
    """The evidence read the compiler's error line; the log's last error line is make's wrapper."""
    log = (
        "gcc -c src/module30.c\nsrc/module30.c:42:5: error: 'foo' undeclared (first use in this function)\n"
        "make: *** [all] Error 2\n[exit code 2]"
    )
    res = asyncio.run(judge.score("Building it now.", NextState(role="environment", content=log)))
    assert res.score == -1 and res.hint is not None
    assert "'foo' undeclared" in res.hint and "make: ***" not in res.hint
