"""The local LLM backend (answer-word probabilities) on the tiny model, and the debug command."""

from __future__ import annotations

import asyncio
import json

import pytest

from openclaw_rl.config import Config, PrmServiceConfig
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.cli import judge_command
from openclaw_rl.judge.local import LocalJudge
from openclaw_rl.judge.prompts import ANSWER_WORDS
from openclaw_rl.types import NextState

from .conftest import api_config


def test_local_backend_reads_answer_word_probabilities(tiny_model_dir):
    cfg = Config(
        prm_service=PrmServiceConfig(
            backend="local", model=str(tiny_model_dir), vote_count=3, reward_space=[1, -1]
        )
    )
    judge = make_judge(cfg)
    assert isinstance(judge, LocalJudge)
    assert len(set(judge.answer_ids.values())) == len(ANSWER_WORDS)
    state = NextState(role="user", content="no bold please")
    dist = judge.answer_distribution("**7**", state)
    assert set(dist) == {1, -1} and sum(dist.values()) == pytest.approx(1.0)
    res = asyncio.run(judge.score("**7**", state))
    assert res.ok and len(res.votes) == 3 and all(v.score in (1, -1) for v in res.votes)
    assert "answer-word probabilities" in res.votes[0].raw
    # Hint votes are generated text: each is parsed (a random model mostly yields invalid votes).
    assert len(res.hint_votes) == 3


def test_judge_command_prints_one_json_object(remote, capsys):
    remote.eval_reply = "SCORE: -1"
    remote.hint_reply = "VERDICT: +1\n[HINT_START]Write without bold formatting.[HINT_END]"
    code = judge_command(api_config(remote), "**7**", "no bold please", "user")
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["score"] == -1 and out["hint"] == "Write without bold formatting."
    assert len(out["votes"]) == 3 and out["votes"][0]["raw"] == "SCORE: -1"
    assert out["timing"]["judge_s"] >= 0 and out["error"] is None


def test_judge_command_reports_failure_and_bad_input(remote, capsys):
    remote.fail_next = [500] * 20
    code = judge_command(api_config(remote, api={"max_retries": 0}), "x", "thanks", "tool")
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["score"] is None and "HTTP 500" in out["error"]
    assert judge_command(api_config(remote), "x", "   ", "user") == 2
    assert "next-state" in json.loads(capsys.readouterr().out)["error"]


def test_the_judge_command_reads_a_long_next_state_from_a_file_or_stdin(tmp_path):
    # A 120 KB build log does not fit a command line: --next-state @FILE or - (stdin).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "build.log"
    log.write_text("compiling module\n" * 8000 + "ERROR: build failed\n")
    base = [
        sys.executable,
        "-m",
        "openclaw_rl.cli",
        "judge",
        "--config",
        str(root / "configs" / "local.toml"),
    ]
    # the next state alone, as docs/judge.md says the command may be asked (no --response)
    alone = subprocess.run(
        [*base, "--next-state", "[exit code 1] command not found: foo", "--role", "environment"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["score"] == -1
    from_file = subprocess.run(
        [*base, "--response", "Building it now.", "--next-state", f"@{log}", "--role", "environment"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)["score"] == -1
    # "-" reads stdin (the argument reader alone: the judge above already ran end to end)
    import io

    from openclaw_rl.cli import _text_arg

    stdin, sys.stdin = sys.stdin, io.StringIO("thanks, that's perfect")
    try:
        assert _text_arg("-") == "thanks, that's perfect"
    finally:
        sys.stdin = stdin
    assert _text_arg("@") == "@" and _text_arg("plain text") == "plain text"
    missing = subprocess.run(
        [*base, "--response", "x", "--next-state", f"@{tmp_path / 'nope.log'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
