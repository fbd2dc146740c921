"""``openclaw-rl eval`` end to end on the tiny model: held-out set, in-process policy over HTTP."""

from __future__ import annotations

import json

from openclaw_rl.cli import main
from openclaw_rl.runtime.models import save_tiny_model


def test_eval_command_prints_scores_and_json(tmp_path, tiny_model_dir, gsm8k_path, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[global]\nlog_dir = "{tmp_path / "logs"}"\n'
                   f'[policy_service]\nmodel = "{tiny_model_dir}"\nbatch_wait_ms = 2.0\n'
                   f'[env_service]\ninteraction_types = ["chat", "terminal", "tool_call"]\nmax_turns = 1\n'
                   f'data_path = "{gsm8k_path}"\neval_size = 20\n')
    out = tmp_path / "eval.json"
    # a "trained" checkpoint: same architecture, other weights, loaded into the served policy
    checkpoint = save_tiny_model(tmp_path / "ckpt", seed=1)
    rc = main(["eval", "--config", str(cfg), "--checkpoint", str(checkpoint), "--chat-n", "2", "--terminal-n", "2", "--tool-call-n", "2",
               "--max-tokens", "8", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert f"[eval] policy={checkpoint} version=1" in printed
    assert "[eval] chat persona=student n=2 personalization=" in printed
    assert "[eval] terminal n=2 success_rate=" in printed and "[eval] tool_call n=2 success_rate=" in printed
    summary = json.loads(out.read_text())
    assert set(summary["chat"]) == {"student", "teacher"}
    assert 0.0 <= summary["chat"]["student"]["personalization"] <= 1.0
    assert summary["terminal"]["n"] == 2 and summary["tool_call"]["n"] == 2
    # evaluation traffic went to a private store, never the training store
    assert not (tmp_path / "logs" / "store.sqlite").exists()


def test_eval_rejects_missing_checkpoint(tmp_path, tiny_model_dir, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[policy_service]\nmodel = "{tiny_model_dir}"\n')
    assert main(["eval", "--config", str(cfg), "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().out



def test_eval_flags_default_to_the_eval_sizes(capsys):
    """The help text and the defaults come from EvalSizes, so they cannot disagree with it."""
    import pytest

    from openclaw_rl.cli import build_parser
    from openclaw_rl.envs.evaluate import EvalSizes

    args = build_parser().parse_args(["eval", "--config", "c.toml"])
    assert (args.chat_n, args.terminal_n, args.tool_call_n, args.max_tokens) == \
        (EvalSizes.chat, EvalSizes.terminal, EvalSizes.tool_call, EvalSizes.max_tokens)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert f"per chat persona (default {EvalSizes.chat})" in capsys.readouterr().out
