"""samples.jsonl reading/writing and the offline replay command (``openclaw-rl train``)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.trainer.cli import train_command
from openclaw_rl.trainer.sample_file import SampleFileError, load_samples, write_samples
from openclaw_rl.types import Sample

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model


def _samples(n: int) -> list[Sample]:
    out = []
    for i in range(n):
        resp = [100 + i, 200 + i, 300 + i]
        out.append(
            Sample(
                sample_id=f"s{i}",
                session_id="sess",
                turn_index=i,
                prompt_ids=[1, 2, 3 + i],
                response_ids=resp,
                rollout_logprobs=[-10.8] * 3,
                loss_mask=[1, 1, 1],
                reward=1.0 if i % 2 == 0 else -1.0,
                teacher_logprobs=[-10.0, -11.0, -10.5] if i == 1 else None,
            )
        )
    return out


def _replay_config(tmp_path, model_dir, training: str) -> str:
    """A replay's config.toml: the tiny model, batches of 2, and ``training``'s own key."""
    return (
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nmodel = "{model_dir}"\n'
        f'[training]\nbackend = "torch"\nbatch_size = 2\nmini_batch_size = 2\n{training}\n'
    )


def test_round_trip(tmp_path):
    path = write_samples(tmp_path / "d" / "s.jsonl", _samples(3))
    assert load_samples(path) == _samples(3)


def test_bad_lines_name_the_line(tmp_path):
    path = write_samples(tmp_path / "s.jsonl", _samples(2))
    good = path.read_text()
    path.write_text(good + "\n{not json\n")
    with pytest.raises(SampleFileError, match=r"s\.jsonl:4: not valid JSON"):
        load_samples(path)
    bad = json.loads(good.splitlines()[0])
    bad["loss_mask"] = [1]
    path.write_text(good + json.dumps(bad) + "\n")
    with pytest.raises(SampleFileError, match=r"s\.jsonl:3: invalid sample: .*loss_mask has 1 entries"):
        load_samples(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(SampleFileError, match=r":1: expected a JSON object"):
        load_samples(path)
    with pytest.raises(SampleFileError, match="not found"):
        load_samples(tmp_path / "missing.jsonl")
    # bytes that are not UTF-8, a NaN reward, a loss_mask of 2: the line, not a traceback or a
    # mini-batch silently skipped; a Windows editor's byte-order mark is no problem
    path.write_bytes(good.encode() + b'{"sample_id": "caf\xe9"}\n')
    with pytest.raises(SampleFileError, match=r"s\.jsonl:3: not UTF-8 \(byte 0xe9"):
        load_samples(path)
    for field, value, said in (
        ("reward", float("nan"), "reward must be a finite number"),
        ("loss_mask", [1, 2, 1], "each entry is 0 or 1"),
    ):
        line = {**bad, "loss_mask": [1, 1, 1], field: value}
        path.write_text(good + json.dumps(line) + "\n")
        with pytest.raises(SampleFileError, match=rf"s\.jsonl:3: invalid sample: .*{said}"):
            load_samples(path)
    path.write_text("\ufeff" + good, encoding="utf-8")
    assert len(load_samples(path)) == 2


def test_train_command_replays_checkpoints_and_resumes(make_cfg, tmp_path, capsys):
    cfg = make_cfg(checkpoint_interval=2, batch_size=2, mini_batch_size=1)
    path = write_samples(tmp_path / "s.jsonl", _samples(3))
    assert train_command(cfg, str(path), 3, resume=False) == 0
    out = capsys.readouterr().out
    assert out.count("[train] ppo_update done, kl=") == 3
    ckpts = cfg.log_dir / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000003"  # saved at the end too
    assert (ckpts / "step_00000002").is_dir()
    assert (cfg.log_dir / "policy" / "v000001" / "adapter_model.safetensors").is_file()
    # --steps is the total to reach: a resumed run continues from 3 to 5.
    assert train_command(cfg, str(path), 5, resume=True) == 0
    out = capsys.readouterr().out
    assert "resumed at step=3" in out and out.count("[train] ppo_update done") == 2
    assert (ckpts / "latest").read_text().strip() == "step_00000005"
    # published as the next version, never over the one before (a service may be serving it)
    published = RunDir.of(cfg).read_published_policy()
    assert published is not None and published.version == 2 and published.step == 5
    assert (cfg.log_dir / "policy" / "v000001" / "adapter_model.safetensors").is_file()
    # resumed with nothing left to do: says so, trains nothing and publishes no new version
    assert train_command(cfg, str(path), 5, resume=True) == 0
    out = capsys.readouterr().out
    assert "nothing to train" in out and "ppo_update" not in out
    assert RunDir.of(cfg).read_published_policy().version == 2
    assert not (cfg.log_dir / "policy" / "v000003").exists()


@pytest.mark.parametrize(
    "damage",
    ["optimizer.pt", "policy/adapter_model.safetensors", "trainer_state.json"],
)
def test_resuming_a_damaged_checkpoint_is_one_error_naming_it(make_cfg, tmp_path, capsys, damage):
    cfg = make_cfg(checkpoint_interval=1, batch_size=2, mini_batch_size=1)
    path = write_samples(tmp_path / "s.jsonl", _samples(2))
    assert train_command(cfg, str(path), 1, resume=False) == 0
    ckpt = cfg.log_dir / "checkpoints" / "step_00000001"
    assert (ckpt / damage).is_file()
    (ckpt / damage).write_bytes(b"garbage")
    capsys.readouterr()
    assert train_command(cfg, str(path), 2, resume=True) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: checkpoint ") and str(ckpt) in err, err


def test_train_command_bad_input_exits_2(make_cfg, tmp_path, capsys):
    cfg = make_cfg()
    path = tmp_path / "bad.jsonl"
    path.write_text("{}\n")
    assert train_command(cfg, str(path), 1, resume=False) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: invalid sample" in err
    assert "sample_id: Field required" in err and "session_id: Field required" in err  # every problem
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert train_command(cfg, str(empty), 1, resume=False) == 2
    # a sample the model cannot take, far down the file: refused before the first update, by its line
    samples = _samples(6)
    samples[4].response_ids[1] = 10**7
    late = write_samples(tmp_path / "late.jsonl", samples)
    assert train_command(cfg, str(late), 3, resume=False) == 2
    err = capsys.readouterr().err
    assert "late.jsonl:5 (s4): token id 10000000 outside the model's vocabulary" in err, err
    assert not RunDir.of(cfg).checkpoints.exists() or not any(RunDir.of(cfg).checkpoints.iterdir())


def test_openclaw_rl_train_command_line(tmp_path, tiny_model_dir):
    """The real entry point a user types, in a subprocess: config file + samples file."""
    import subprocess
    import sys

    path = write_samples(tmp_path / "s.jsonl", _samples(2))
    config = tmp_path / "config.toml"
    config.write_text(_replay_config(tmp_path, tiny_model_dir, "lr = 1e-3"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openclaw_rl.cli",
            "train",
            "--config",
            str(config),
            "--samples",
            str(path),
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[train] ppo_update done, kl=" in proc.stdout
    assert (tmp_path / "logs" / "policy" / "v000001" / "adapter_config.json").is_file()
    # published: a service or run on this log_dir serves the replayed policy
    published = RunDir(tmp_path / "logs").read_published_policy()
    assert published is not None and published.version == 1 and published.path.name == "v000001"

    # Again without --resume: the run's checkpoints are refused, not overwritten ...
    argv = [sys.executable, "-m", "openclaw_rl.cli", "train", "--config", str(config), "--samples", str(path)]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "2"}
    ckpts = tmp_path / "logs" / "checkpoints"
    before = sorted(p.name for p in ckpts.iterdir())
    proc = subprocess.run([*argv, "--steps", "1"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "already holds checkpoints" in proc.stderr and "--log-dir" in proc.stderr
    assert "Traceback" not in proc.stderr and sorted(p.name for p in ckpts.iterdir()) == before
    # ... and --log-dir trains into another folder, leaving the run as it was
    other = tmp_path / "replay"
    proc = subprocess.run(
        [*argv, "--steps", "1", "--log-dir", str(other)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (other / "checkpoints" / "step_00000001").is_dir()
    assert sorted(p.name for p in ckpts.iterdir()) == before
    # ... which `status --log-dir` describes (it has no store: no live run ever used it) ...
    status = subprocess.run(
        [*argv[:3], "status", "--config", str(config), "--log-dir", str(other)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert (
        "offline replay" in status.stdout
        and "step_00000001" in status.stdout
        and "version 1" in status.stdout
    )
    # ... and `serve --log-dir` serves
    from openclaw_rl.runtime.ports import free_port

    port = free_port()
    server = subprocess.Popen(
        [*argv[:3], "serve", "--config", str(config), "--port", str(port), "--log-dir", str(other)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        health = None
        for _ in range(240):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert health is not None and health["policy_version"] == 1, health
    finally:
        server.terminate()
        server.wait(timeout=60)
    # a log_dir under a file is one error line naming the file
    (tmp_path / "afile").write_text("x")
    proc = subprocess.run(
        [*argv, "--log-dir", str(tmp_path / "afile" / "sub")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'afile'} is a file"), proc.stderr


@pytest.mark.parametrize(
    "left", ["per-user checkpoints", "a published policy", "a user's published adapter", "a run's store"]
)
def test_a_folder_holding_any_part_of_a_run_is_not_replayed_over(make_cfg, tmp_path, capsys, left):
    cfg = make_cfg(batch_size=2, mini_batch_size=1)
    run = RunDir.of(cfg)
    if left == "per-user checkpoints":
        (run.checkpoints / "users" / "alice" / "step_00000001").mkdir(parents=True)
    elif left == "a run's store":
        from openclaw_rl.runtime.store import Store

        Store(run.store).close()  # a live run that has recorded turns but not checkpointed yet
    else:
        user = "alice" if "user" in left else None
        version = run.policy_dir(user) / "v000004"
        version.mkdir(parents=True)
        run.publish_policy(4, version, user=user)
    path = write_samples(tmp_path / "s.jsonl", _samples(2))
    assert train_command(cfg, str(path), 1, resume=False) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--log-dir" in err
    assert not run.checkpoints.is_dir() or not list(run.checkpoints.glob("step_*"))


def test_a_replay_stopped_by_sigterm_keeps_and_publishes_what_it_trained(tmp_path, tiny_model_dir):
    """kill, timeout and job schedulers send SIGTERM: it stops a replay as Ctrl-C does (checkpoint,
    published version, exit 130), where it used to die with every update since the last checkpoint."""
    import signal
    import subprocess
    import sys

    path = write_samples(tmp_path / "s.jsonl", _samples(2))
    config = tmp_path / "config.toml"
    config.write_text(_replay_config(tmp_path, tiny_model_dir, "checkpoint_interval = 1000"))
    argv = [sys.executable, "-m", "openclaw_rl.cli", "train", "--config", str(config), "--samples", str(path)]
    proc = subprocess.Popen(
        [*argv, "--steps", "100000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the first update done: then stop it
        seen.append(line)
        if "ppo_update done" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(seen) + proc.stdout.read()
    assert proc.wait(timeout=120) == 130, out[-2000:]
    assert (tmp_path / "logs" / "checkpoints" / "latest").is_file(), out[-2000:]
    assert "published version 1" in out and (tmp_path / "logs" / "policy" / "v000001").is_dir(), out[-2000:]
