"""``openclaw-rl eval`` end to end on the tiny model: held-out set, in-process policy over HTTP."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from openclaw_rl.cli import main
from openclaw_rl.config import load_config
from openclaw_rl.envs.base import make
from openclaw_rl.envs.chat import looping
from openclaw_rl.envs.data import gsm8k_split
from openclaw_rl.envs.loop import env_kwargs_for
from openclaw_rl.envs.terminal import EVAL_TASKS
from openclaw_rl.policy.server import PolicyService
from tests.helpers import save_tiny_model

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model


def test_eval_command_prints_scores_and_json(tmp_path, tiny_model_dir, gsm8k_path, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n'
        f'[policy_service]\nmodel = "{tiny_model_dir}"\nbatch_wait_ms = 2.0\n'
        f'[env_service]\ninteraction_types = ["chat", "terminal", "tool_call"]\nmax_turns = 1\n'
        f'data_path = "{gsm8k_path}"\neval_size = 20\n'
    )
    out = tmp_path / "eval.json"
    # a "trained" checkpoint: same architecture, other weights, loaded into the served policy
    checkpoint = save_tiny_model(tmp_path / "ckpt", seed=1)
    rc = main(
        [
            "eval",
            "--config",
            str(cfg),
            "--checkpoint",
            str(checkpoint),
            "--chat-n",
            "2",
            "--terminal-n",
            "2",
            "--tool-call-n",
            "2",
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert f"[eval] policy={checkpoint} version=1" in printed
    assert "[eval] chat persona=student n=2 personalization=" in printed
    assert "[eval] terminal n=2 success_rate=" in printed and "[eval] tool_call n=2 success_rate=" in printed
    summary = json.loads(out.read_text())
    assert set(summary["chat"]) == {"student", "teacher"}
    assert summary["terminal"]["n"] == 2 and summary["tool_call"]["n"] == 2
    assert set(summary["terminal"]["tasks"]) == set(list(EVAL_TASKS)[:2])  # the held-out tasks, by name
    # evaluation traffic went to a private store, never the training store
    assert not (tmp_path / "logs" / "store.sqlite").exists()
    # The chat scores are the persona's scorer applied to the policy's greedy first replies to the
    # *held-out* problems: ask the same served checkpoint ourselves, with the official client.
    conf = load_config(cfg)
    scored = summary["chat"]["student"]["scores"]
    assert len(scored) == 2 and summary["chat"]["student"]["personalization"] == sum(scored) / 2
    env = make("chat", persona="student", **{**env_kwargs_for(conf, "chat", "eval"), "max_turns": 1})
    held_out = {item.index for item in gsm8k_split(gsm8k_path, 20, "eval")}
    conf.global_.log_dir = str(tmp_path / "check")
    conf.policy_service.port = 0
    service = PolicyService(conf)
    url = service.start()
    try:
        service.swap_weights(checkpoint, 1)
        client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60)
        reports, texts = [], []
        for i, expected in enumerate(scored):
            _obs, info = env.reset(seed=i, options={"item": i})
            assert env.context["item_index"] in held_out  # type: ignore[attr-defined]
            reply = client.chat.completions.create(
                model=conf.policy_service.model, messages=info["messages"], max_tokens=8, temperature=0.0
            )
            assert env.score(reply.choices[0].message.content or "") == expected
            reports.append(env.report(reply.choices[0].message.content or ""))  # type: ignore[attr-defined]
            texts.append(reply.choices[0].message.content or "")
        # ...and each preference's rate is the share of those replies that meet it
        rates = summary["chat"]["student"]["preferences"]
        assert set(rates) == {"no_markdown", "no_ai_phrases", "student_voice", "final_answer"}
        assert rates == {name: sum(r[name] for r in reports) / 2 for name in rates}
        # ...and the looping share is that of the same replies (a loop meets no wish)
        assert summary["chat"]["student"]["looping"] == sum(looping(t) for t in texts) / 2
    finally:
        service.stop()


def test_eval_rejects_missing_checkpoint(tmp_path, tiny_model_dir, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[policy_service]\nmodel = "{tiny_model_dir}"\n')
    assert main(["eval", "--config", str(cfg), "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().out
    (tmp_path / "checkpoints" / "step_00000002").mkdir(parents=True)  # a checkpoint with no policy/
    assert (
        main(["eval", "--config", str(cfg), "--checkpoint", str(tmp_path / "checkpoints" / "step_00000002")])
        == 2
    )
    assert "holds no policy" in capsys.readouterr().out


def test_a_training_checkpoint_is_evaluated_by_its_policy_folder(tmp_path):
    from openclaw_rl.launcher.evaluate import _policy_folder

    ckpt = tmp_path / "step_00000002"
    (ckpt / "policy").mkdir(parents=True)
    (ckpt / "policy" / "adapter_config.json").write_text("{}")
    assert _policy_folder(ckpt) == (ckpt / "policy", None)
    assert _policy_folder(ckpt / "policy") == (ckpt / "policy", None)


def test_eval_flags_default_to_the_eval_sizes(capsys):
    """The help text and the defaults come from EvalSizes, so they cannot disagree with it."""
    import pytest

    from openclaw_rl.cli import build_parser
    from openclaw_rl.launcher.evaluate import EvalSizes

    args = build_parser().parse_args(["eval", "--config", "c.toml"])
    assert (args.chat_n, args.terminal_n, args.tool_call_n, args.max_tokens) == (
        EvalSizes.chat,
        EvalSizes.terminal,
        EvalSizes.tool_call,
        EvalSizes.max_tokens,
    )
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert f"per chat persona (default {EvalSizes.chat})" in capsys.readouterr().out


def test_eval_says_which_asked_parts_the_run_does_not_have(tmp_path, tiny_model_dir, gsm8k_path, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n'
        f'[env_service]\ninteraction_types = ["chat"]\ndata_path = "{gsm8k_path}"\neval_size = 20\n'
    )
    args = ["eval", "--config", str(cfg), "--chat-n", "0", "--terminal-n", "1", "--tool-call-n", "1"]
    assert main([*args, "--out", str(tmp_path / "e.json")]) == 0
    printed = capsys.readouterr().out
    assert (
        "[eval] note: terminal, tool_call not evaluated: not in [env_service] interaction_types (chat)"
        in printed
    )


def test_an_evaluation_is_labelled_with_the_version_the_folder_holds(tmp_path):
    import json

    from openclaw_rl.launcher.evaluate import exported_version
    from openclaw_rl.runtime.rundir import POLICY_META

    published = tmp_path / "policy" / "v000006"
    published.mkdir(parents=True)
    (published / POLICY_META).write_text(json.dumps({"version": 6, "step": 12}))
    assert exported_version(published) == 6
    renamed = tmp_path / "v000004"  # a copy without its meta file: the folder's name
    renamed.mkdir()
    assert exported_version(renamed) == 4
    assert exported_version(tmp_path) == 1  # weights from elsewhere
