"""``progress_line`` / ``openclaw-rl status``: the counters, and the live eval score once there is one."""

from __future__ import annotations

import threading

from openclaw_rl.config import build_config
from openclaw_rl.launcher.status import progress_line, run_progress_line, status_command
from openclaw_rl.runtime.metrics import MetricsWriter
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Counters, Store


def _cfg(tmp_path, **training):
    return build_config({"global": {"log_dir": str(tmp_path / "logs")}, "training": training}, environ={})


def test_progress_line_without_and_with_an_evaluation():
    c = Counters(
        turns=0,
        open=0,
        waiting=0,
        judged=0,
        failed=0,
        samples_ready=0,
        samples_claimed=0,
        samples_trained=0,
        samples_dropped=0,
        reward_mean=None,
        policy_version=0,
        trainer_step=0,
        trainer_updates=0,
    )
    plain = progress_line(c)
    assert plain.startswith("[progress] turns=0 ") and "eval=" not in plain
    assert progress_line(c, None) == plain
    line = progress_line(c, {"score": 0.4712, "base_score": 0.3351, "policy_version": 3, "step": 8})
    assert line == plain + " eval=0.47 (base 0.34)"
    assert progress_line(c, {"score": 0.5, "base_score": None}).endswith(" eval=0.50 (base n/a)")
    assert (
        progress_line(c, {"policy_version": 3, "error": "broken"}) == plain
    )  # a failed evaluation shows nothing


def test_status_prints_the_same_line_as_the_launcher(tmp_path, capsys):
    cfg = _cfg(tmp_path, eval_interval=4)
    store = Store(RunDir.of(cfg).store)
    writer = MetricsWriter(cfg.log_dir, tensorboard=False)
    writer.write(1, {"loss": 0.5, "kl": 0.01, "clip_frac": 0.0, "step": 1.0})  # as the trainer reports it
    writer.write(0, {"policy_version": 0, "score": 0.34, "base_score": 0.34}, kind="eval")
    writer.write(4, {"policy_version": 1, "score": 0.47, "base_score": 0.34}, kind="eval")
    expected = run_progress_line(cfg, store)
    store.close()
    assert expected.endswith(" eval=0.47 (base 0.34)")
    assert status_command(cfg) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == expected
    assert out[1].startswith("[train] last update step=1 loss=0.5")


def test_status_names_a_published_version_serving_never_loaded(tmp_path, capsys):
    """A launcher killed mid-run: the trainer's last publish lands after serving stopped, so the
    store's served version lags the pointer; status says which version the next start serves."""
    cfg = _cfg(tmp_path)
    run = RunDir.of(cfg)
    store = Store(run.store)
    store.set_meta("policy_version", 3)  # what serving wrote when it loaded v3
    store.close()
    for v in (3, 4):
        (run.policies / f"v{v:06d}").mkdir(parents=True)
        run.publish_policy(v, run.policies / f"v{v:06d}", step=2 * v)
    assert status_command(cfg) == 0
    out = capsys.readouterr().out
    assert " version=3 " in out.splitlines()[0]
    assert "published policy version 4 (step 8) is newer than the served version 3" in out


def test_the_launcher_waits_for_the_final_evaluation(tmp_path, capsys):
    """At max_steps the launcher lets a running evaluator score what is still due, then goes on."""
    import sys

    from openclaw_rl.launcher.wiring import Child, _await_final_eval

    cfg = _cfg(tmp_path, eval_interval=4)
    evaluator = Child("evaluator", [sys.executable, "-c", "import time; time.sleep(120)"])
    evaluator.start()
    writer = MetricsWriter(cfg.log_dir, tensorboard=False)
    done = threading.Timer(0.5, lambda: writer.write(0, {"policy_version": 0, "score": 0.3}, kind="eval"))
    try:
        done.start()  # the base is due until this row lands
        _await_final_eval(cfg, evaluator, lambda: False)
        assert "waiting up to" in capsys.readouterr().out
        _await_final_eval(cfg, evaluator, lambda: False)  # nothing due now: no wait, no line
        assert capsys.readouterr().out == ""
    finally:
        done.cancel()
        evaluator.stop(timeout=10)
    assert not evaluator.alive()


def test_the_run_name_leads_the_progress_line_and_status(tmp_path, capsys):
    cfg = _cfg(tmp_path, eval_interval=0)
    cfg.global_.run_name = "alice_week2"
    Store(RunDir.of(cfg).store).close()
    assert status_command(cfg) == 0
    assert capsys.readouterr().out.startswith("[progress] run=alice_week2 turns=0 ")


def test_status_without_a_run_names_the_folder_a_relative_log_dir_was_read_from(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg = build_config({"global": {"log_dir": "runs/mine"}}, environ={})
    assert status_command(cfg) == 1
    out = capsys.readouterr().out
    assert f"no run found: {tmp_path / 'runs' / 'mine'}" in out and "read from the current folder" in out
    assert not (tmp_path / "runs").exists()  # a read-only command creates nothing


def test_commands_that_only_read_a_run_do_not_repeat_the_configs_training_warnings(tmp_path, capsys):
    from openclaw_rl.cli import main

    conf = tmp_path / "c.toml"
    conf.write_text(f'[global]\nlog_dir = "{tmp_path}/logs"\n[prm_service]\nvote_count = 1\n')
    for verb in (["status"], ["turns"], ["samples", "--out", str(tmp_path / "s.jsonl")], ["users", "list"]):
        main([*verb, "--config", str(conf)])
        assert "vote_count = 1" not in capsys.readouterr().err, verb
    main(["judge", "--config", str(conf), "--next-state", "thanks, perfect"])  # runs the judge: warned
    assert "warning: [prm_service] vote_count = 1" in capsys.readouterr().err


def test_a_runs_samples_are_written_as_the_file_train_replays(tmp_path, capsys):
    from openclaw_rl.cli import main
    from openclaw_rl.trainer.sample_file import load_samples
    from openclaw_rl.types import Sample

    log_dir = tmp_path / "logs"
    config = tmp_path / "c.toml"
    config.write_text(f'[global]\nlog_dir = "{log_dir}"\n')
    cfg = build_config({"global": {"log_dir": str(log_dir)}}, environ={})
    store = Store(RunDir.of(cfg).store)
    made = [
        Sample(
            sample_id=f"s{i}",
            session_id=f"sess{i}",
            turn_index=0,
            prompt_ids=[1, 2],
            response_ids=[3, 4],
            rollout_logprobs=[-0.5, -0.25],
            loss_mask=[1, 1],
            reward=1.0,
        )
        for i in range(3)
    ]
    store.add_samples(made)
    store.claim_samples(1, step=1, current_version=0, max_staleness=8)
    store.commit_checkpoint(1, 0)
    store.close()
    every, trained = tmp_path / "all.jsonl", tmp_path / "trained.jsonl"
    assert main(["samples", "--config", str(config), "--out", str(every)]) == 0
    assert main(["samples", "--config", str(config), "--out", str(trained), "--status", "trained"]) == 0
    assert load_samples(every) == made and [s.sample_id for s in load_samples(trained)] == ["s0"]
    assert "3 sample(s) written to" in capsys.readouterr().out
    assert every.stat().st_mode & 0o777 == 0o600  # the users' words, as users export writes them
    # the same run read through another config's --log-dir, by status, samples and users list alike
    other = tmp_path / "other.toml"
    other.write_text(f'[global]\nlog_dir = "{tmp_path / "elsewhere"}"\n')
    assert main(["samples", "--config", str(other), "--log-dir", str(log_dir), "--out", str(every)]) == 0
    assert main(["users", "list", "--config", str(other), "--log-dir", str(log_dir)]) == 0
    assert "no run found" not in capsys.readouterr().out


def test_a_stray_argument_is_told_with_the_verbs_own_usage(tmp_path, capsys):
    import pytest

    from openclaw_rl.cli import main

    for argv in (["status", "--config", "c.toml", "--bogus"], ["users", "list", "--config", "c.toml", "-x"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"usage: openclaw-rl {' '.join(argv[:-3])} " in err, err
        assert f"unrecognized arguments: {argv[-1]}" in err


def test_turns_lists_the_newest_turns_with_the_ids_feedback_rates(tmp_path, capsys):
    """What a client such as OpenClaw does not show: the id of each reply, to rate it."""
    from openclaw_rl.cli import main
    from openclaw_rl.types import Turn

    log_dir = tmp_path / "logs"
    config = tmp_path / "c.toml"
    config.write_text(f'[global]\nlog_dir = "{log_dir}"\n')
    store = Store(log_dir / "store.sqlite")
    for i, (user, text) in enumerate(
        [("alice", "first reply"), ("bob", "bob's\nreply"), ("alice", "newest")]
    ):
        turn = Turn(
            session_id=f"{user}/auto-0123456789abcdef",  # as a named user's sessions are stored
            turn_index=i,
            messages=[{"role": "user", "content": "q"}],
            prompt_ids=[1],
            response_ids=[2],
            response_logprobs=[-1.0],
            response_text=text,
            user=user,
            response_id=f"chatcmpl-{i}",
        )
        store.record_turn(turn)
    store.close()
    assert main(["turns", "--config", str(config), "--last", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("response id") and len(lines) == 3
    assert lines[1].startswith("chatcmpl-2") and "'newest'" in lines[1] and "alice" in lines[1]
    assert lines[2].startswith("chatcmpl-1") and '"bob\'s reply"' in lines[2]
    assert "bob/auto-0123456789abcdef " in lines[2]  # the whole id, to copy
    assert main(["turns", "--config", str(config), "--user", "alice"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert ids == ["chatcmpl-2", "chatcmpl-0"]
    assert main(["turns", "--config", str(config), "--user", "carol"]) == 0
    assert "no turns recorded for user 'carol'" in capsys.readouterr().out


def test_in_per_user_mode_the_progress_line_shows_the_users_adapters(tmp_path):
    """The shared version stays 0 in per_user mode; the line says how far the users' adapters got."""
    from openclaw_rl.runtime.users import adapter_meta

    store = Store(tmp_path / "store.sqlite")
    try:
        assert "user_adapters" not in progress_line(store.counters())
        store.set_meta(adapter_meta("alice"), 3)  # what the service writes when it serves a version
        store.set_meta(adapter_meta("bob"), 1)
        store.set_meta(adapter_meta("carol"), 0)  # no adapter yet: served the base
        line = progress_line(store.counters())
        assert " version=0 " in line and line.endswith(" user_adapters=2 (newest v3)")
    finally:
        store.close()


def test_columns_are_padded_by_terminal_width():
    from openclaw_rl.launcher.status import fit

    assert fit("我的会话", 14) == "我的会话      "  # 8 + 6 columns
    # a longer one keeps its head and tail around a mark: a session's /auto-... tail tells it apart
    assert fit("abc", 5) == "abc  " and fit("abcdefgh", 5) == "ab…gh"
    assert fit("会话会话会话会话", 6) == "会…话 "  # a wide character never half-fits
    assert fit("\x1b[2Jx", 8) == "\\x1b[2Jx"  # an escape sequence is shown, not obeyed
