"""tool_call: real tools, held-out split, and malformed calls that never crash the env."""

from __future__ import annotations

import json

import pytest

from openclaw_rl.envs import make
from openclaw_rl.envs.tool_call import TOOLS, ToolError, calculate, new_call_id


def _call(name, args):
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
    }


def test_calculator_is_safe_and_correct():
    assert calculate("(20 + 44) * 2 - 100 / 4") == 103
    assert calculate("1,000 + 2^3") == 1008
    assert calculate("sqrt(16) + abs(-2) + round(2.6)") == 9
    for bad in (
        "__import__('os').system('id')",
        "open('/etc/passwd')",
        "[1]*9",
        "x + 1",
        "9**9**9",
        "1/0",
        "",
        # too large for a float or for printing: an error observation, not an exception
        "sqrt((10**12)**64)",
        "round(1e308*10)",
        "*".join(["(10**12)**60"] * 6),
    ):
        with pytest.raises(ToolError):
            calculate(bad)


def test_gsm8k_episode_with_real_tools(gsm8k_path):
    env = make("tool_call", kind="gsm8k", data_path=str(gsm8k_path), eval_size=50, split="eval")
    obs, info = env.reset(seed=0, options={"item": 0})
    assert info["tools"] == TOOLS and info["messages"][-1]["content"] == obs
    answer = env.answer
    obs, r, term, trunc, info = env.step(
        {
            "content": "",
            "tool_calls": [
                _call("calculator", {"expression": f"{answer} + 0"}),
                _call("python", {"code": f"print({answer} * 1)"}),
            ],
        }
    )
    assert not term and info["next_state_role"] == "tool"
    assert [m["role"] for m in obs] == ["tool", "tool"]
    assert obs[0]["content"] == answer.replace(",", "") and f"stdout:\n{answer}" in obs[1]["content"]
    obs, r, term, trunc, info = env.step(f"I computed it. ANSWER: {answer}")
    assert term and info["success"] and r == 1.0
    env.close()


def test_eval_items_are_the_held_out_slice(gsm8k_path):
    env = make("tool_call", kind="gsm8k", data_path=str(gsm8k_path), eval_size=50, split="train")
    idx = {env.reset(seed=s)[1]["item_index"] for s in range(30)}
    assert max(idx) < 1319 - 50
    env.close()


def test_lookup_task_via_file_and_text_tool_call():
    env = make("tool_call", kind="lookup")
    obs, info = env.reset(seed=5)
    # text-form tool call (models without native tool calling)
    obs, r, term, trunc, info = env.step(
        '<tool_call>{"name": "file", "arguments": {"action": "read", "path": "inventory.json"}}</tool_call>'
    )
    assert isinstance(obs, str) and "price" in obs and info["next_state_role"] == "user"
    rows = json.loads(obs.split("\n", 1)[1])
    wrong = str(int(env.answer) + 1)
    obs, r, term, trunc, info = env.step(f"ANSWER: {wrong}")
    assert term and not info["success"]
    assert rows


def test_a_reply_that_is_only_a_calls_json_is_a_call_and_a_json_answer_is_an_answer():
    env = make("tool_call", kind="lookup")
    env.reset(seed=5)
    obs, *_ = env.step('{"name": "file", "arguments": {"action": "read", "path": "inventory.json"}}')
    assert "price" in obs  # models without call markup write the call's JSON alone
    answer = json.dumps({"name": "melon", "price": int(env.answer)})
    obs, r, term, trunc, info = env.step(answer)  # a final answer in JSON: not a call to "melon"
    assert term and info["success"], obs
    env.reset(seed=5)
    obs, r, term, trunc, info = env.step(f"```json\n{answer}\n```")  # nor in a fence
    assert term and info["success"], obs


def test_malformed_calls_get_error_observations():
    env = make("tool_call", kind="lookup", max_turns=20)
    env.reset(seed=1)
    cases = [
        (_call("calculator", "{not json"), "not valid JSON"),
        (_call("rm_rf", {}), "unknown tool 'rm_rf'"),
        (_call("calculator", {}), "missing required argument 'expression'"),
        (_call("calculator", {"expression": 5}), "must be a string"),
        (_call("calculator", "[1, 2]"), "must be a JSON object"),
        (_call("file", {"action": "read", "path": "../../etc/passwd"}), "outside the working directory"),
        (_call("file", {"action": "read", "path": "nope.txt"}), "does not exist"),
        (_call("file", {"action": "delete", "path": "x"}), "unknown action"),
        (_call("file", {"action": "write", "path": "x\x00y", "content": "hi"}), "NUL byte"),
        ({"id": "x", "function": "calculator"}, "malformed tool call"),
        ("garbage", "malformed tool call"),
    ]
    for call, expected in cases:
        obs, r, term, trunc, info = env.step({"content": None, "tool_calls": [call]})
        assert not term and info["tool_errors"] == 1, call
        assert (
            obs[0]["role"] == "tool"
            and obs[0]["content"].startswith("error:")
            and expected in obs[0]["content"]
        ), (call, obs)
    obs, *_ = env.step('<tool_call>{"name": "calculator", "arguments": </tool_call>')
    assert "not valid JSON" in obs
    # the python tool reports an exception trace as the next state
    obs, *_ = env.step({"tool_calls": [_call("python", {"code": "1/0"})]})
    assert "ZeroDivisionError" in obs[0]["content"] and "exit code: 1" in obs[0]["content"]
    # write then read back through the file tool and python (same sandbox dir)
    obs, *_ = env.step(
        {
            "tool_calls": [
                _call("file", {"action": "write", "path": "n/x.txt", "content": "42"}),
                _call("python", {"code": "print(open('n/x.txt').read())"}),
            ]
        }
    )
    assert "wrote 2 bytes" in obs[0]["content"] and "42" in obs[1]["content"]
    env.close()


def test_writing_through_a_file_is_an_error_observation_without_host_paths():
    env = make("tool_call", kind="lookup")
    env.reset(seed=0)
    env.step(
        {"content": "", "tool_calls": [_call("file", {"action": "write", "path": "a.txt", "content": "x"})]}
    )
    obs, *_ = env.step(
        {"content": "", "tool_calls": [_call("file", {"action": "write", "path": "a.txt/b", "content": "x"})]}
    )
    text = obs[0]["content"]
    assert text == "error: file: cannot write 'a.txt/b': a part of the path is a file, not a directory"
    assert str(env.sandbox.root) not in text
    env.close()
