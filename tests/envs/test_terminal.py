"""The terminal task set: every checker accepts its oracle and rejects a wrong command, for real."""

from __future__ import annotations

import shlex

import pytest

from openclaw_rl.envs import make
from openclaw_rl.envs.terminal import EVAL_TASKS, TASKS, extract_command, task_names

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model


def test_task_set_size_and_split():
    assert len(TASKS) >= 20
    assert {t.category for t in TASKS} == {"files", "text", "archives", "git", "python"}
    assert set(task_names("eval")) == set(EVAL_TASKS)
    assert not set(task_names("train")) & set(EVAL_TASKS)
    assert len(task_names("train")) + len(task_names("eval")) == len(TASKS)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_oracle_solves_and_wrong_fails(task):
    env = make("terminal", task=task.name)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(task.wrong)
        assert not info["success"] and reward == 0.0 and not terminated, (task.name, obs)
        assert obs.startswith("exit code:")
        env.reset(seed=0)  # a fresh sandbox, so the wrong command left nothing behind
        obs, reward, terminated, truncated, info = env.step(f"```bash\n{task.oracle}\n```")
        assert info["success"] and reward == 1.0 and terminated, (task.name, obs)
    finally:
        env.close()


def test_extract_command():
    assert extract_command("Sure:\n```bash\n$ ls -la\n```\nthat lists") == "ls -la"
    assert extract_command("```\necho hi\n```") == "echo hi"
    assert extract_command("  wc -l a.txt \n") == "wc -l a.txt"
    # cut off at max_tokens before the closing fence: what it got to, not the fence as a command
    assert extract_command("Run this:\n```bash\nls -la\nwc -l a.t") == "ls -la\nwc -l a.t"
    assert extract_command("```python\nprint(6 * 7)\n```") == "python3 -c 'print(6 * 7)'"
    # fences pair in order: a closing fence never opens a block, and prose after a block is prose
    assert extract_command("```text\nfoo\n```\nthen run ls -la") == ""
    assert extract_command("```json\n{}\n```\n```bash\necho ok\n```") == "echo ok"
    # a block under a list item keeps its own indentation, minus the common part
    listed = "1. run:\n   ```python\n   for i in range(2):\n       print(i)\n   ```"
    assert extract_command(listed) == "python3 -c " + shlex.quote("for i in range(2):\n    print(i)")


def test_episode_truncates_and_reports_bad_replies():
    env = make("terminal", task="count_lines", max_turns=2)
    env.reset(seed=1)
    obs, r, term, trunc, info = env.step("")
    assert "no command found" in obs and not term and not trunc
    env.max_turns = 3
    # a script of comments only does nothing: not an exit 0 the judge would read as a success
    obs, r, term, trunc, info = env.step("```bash\n#!/bin/bash\n# first, count the lines\n```")
    assert "no command found in the reply (only comments)" in obs and info["exit_code"] == 2
    obs, r, term, trunc, info = env.step("```bash\nnosuchcommand\n```")
    assert info["exit_code"] == 127 and "command not found" in obs and trunc and not term
    env.close()
    env.close()  # safe twice


def test_random_draws_come_from_the_training_split():
    env = make("terminal", seed=3)
    seen = set()
    for s in range(12):
        _, info = env.reset(seed=s)
        seen.add(info["task"])
    env.close()
    assert seen and not seen & set(EVAL_TASKS)
