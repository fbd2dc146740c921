"""The main job end to end: launcher + serving + judge + trainer as processes, driven over HTTP.

Scripted sessions talk to the policy service like a real client until the trainer has done its
updates; the test then checks what a user would: the store holds judged turns and trained samples,
a checkpoint is on disk, and the served policy version advanced while requests kept succeeding.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from openclaw_rl.runtime.ports import free_port
from openclaw_rl.runtime.store import Store

from ..helpers import start_module

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

ROOT = Path(__file__).resolve().parents[2]
REPLIES = [
    "no, that's wrong, redo it without bold please",
    "thanks, that's perfect!",
    "this sounds like a robot wrote it, try again",
    "great, moving on to the next one",
]


def _head(log_dir: Path, model: Path, port: int, global_keys: str = "") -> str:
    """The start of a run's config: its folder (and ``global_keys``), the tiny model on ``port``."""
    return f"""
[global]
log_dir = "{log_dir}"
{global_keys}
[policy_service]
model = "{model}"
port = {port}"""


def _serving_run(log_dir: Path, model: Path, port: int, conf: Path) -> subprocess.Popen[str]:
    """A launched run with no environment workers (the judge on MiniLM), once it serves on ``port``."""
    conf.write_text(f"""{_head(log_dir, model, port)}
[env_service]
num_envs = 0
[prm_service]
backend = "minilm"
""")
    launcher = start_module("openclaw_rl.launcher", conf)
    deadline = time.monotonic() + 180
    while True:
        if time.monotonic() > deadline or launcher.poll() is not None:
            launcher.kill()
            raise AssertionError("the run did not start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return launcher
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def _drive(url: str, stop: threading.Event, seen: dict) -> None:
    """Three-turn sessions, each user reply being the next state of the turn before it."""
    s = 0
    while not stop.is_set():
        msgs = [{"role": "user", "content": f"What is {s} plus {s}?"}]
        try:
            for t in range(3):
                r = httpx.post(
                    f"{url}/v1/chat/completions",
                    timeout=60,
                    json={"model": "policy", "messages": msgs, "max_tokens": 10},
                    headers={"X-Session-Id": f"e2e-{s}", "X-Session-Done": "true" if t == 2 else "false"},
                )
                seen["ok" if r.status_code == 200 else "errors"] += 1
                seen["max_version"] = max(seen["max_version"], r.json().get("policy_version", 0))
                msgs += [
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": REPLIES[(s + t) % 4]},
                ]
        except httpx.HTTPError:
            if not stop.is_set():
                time.sleep(0.5)  # the server is still starting (or stopping at the end)
        s += 1


@pytest.mark.parametrize(
    "async_mode, env_workers",
    [(True, False), (False, False), (True, True)],
    ids=["async", "lock-step", "env-workers"],
)
def test_main_job_trains_swaps_and_keeps_serving(
    tiny_model_dir, tmp_path, gsm8k_path, async_mode, env_workers
):
    """Traffic comes from scripted sessions (a person, in personal-agent mode) or from the
    launcher's own environment workers playing the student persona in groups of two attempts."""
    port = free_port()
    log_dir = tmp_path / "logs"
    conf = tmp_path / "run.toml"
    head = _head(log_dir, tiny_model_dir, port, f"seed = 0\nasync_mode = {str(async_mode).lower()}")
    conf.write_text(f"""{head}
weight_sync_interval = 2
max_tokens_default = 48
[env_service]
num_envs = {2 if env_workers else 0}
group_size = 2
interaction_types = ["chat"]
personas = ["student"]
max_turns = 2
data_path = "{gsm8k_path}"
[prm_service]
backend = "minilm"
[training]
lr = 1e-3
batch_size = 2
mini_batch_size = 1
checkpoint_interval = 1
max_steps = 3
""")
    launcher = start_module("openclaw_rl.launcher", conf)
    stop, seen = threading.Event(), {"ok": 0, "errors": 0, "max_version": 0}
    driver = threading.Thread(target=_drive, args=(f"http://127.0.0.1:{port}", stop, seen), daemon=True)
    if not env_workers:
        driver.start()
    try:
        out, _ = launcher.communicate(timeout=420)
    finally:
        stop.set()
        if launcher.poll() is None:
            launcher.kill()
    if not env_workers:
        driver.join(60)
    assert launcher.returncode == 0, out[-4000:]
    for line in (
        "[policy_service] listening on",
        "[prm_service] backend=minilm",
        "[training] algorithm=ppo",
        "[async] weight_sync_interval=2, non_blocking=true",
        "[rollout] step=",
        "[train] ppo_update done",
        "[policy_service] weights swapped, policy_version=1",
    ):
        assert line in out, f"missing {line!r} in:\n{out[-4000:]}"
    assert ("[async] lock-step: serving paused for training" in out) == (not async_mode)
    if env_workers:
        assert "[env_service] mode=local, num_envs=2, types=[chat]" in out
    else:
        assert seen["errors"] == 0 and seen["ok"] > 0
        assert seen["max_version"] >= 1, "no response was served by the new policy version"
    store = Store(log_dir / "store.sqlite")
    c = store.counters()
    grouped = store._db.execute(
        'SELECT COUNT(*) FROM samples WHERE data LIKE \'%"group_id":"grp-chat-%\''
    ).fetchone()[0]
    signal = store.get_meta("signal", {})
    store.close()
    # environment episodes are compared within their group; a person's turns against a running baseline
    assert (grouped > 0) == env_workers and (signal.get("groups", 0) > 0) == env_workers
    assert signal["judged"] >= 6
    assert c.trainer_step == 3 and c.samples_trained == 6 and c.judged >= 6
    assert c.trainer_updates == 3 and "step=3 checkpointed=3" in out  # the final [progress] line
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_00000003"
    assert (log_dir / "policy" / "latest.json").is_file()
    assert (log_dir / "training_curves.png").stat().st_size > 1000
    assert len((log_dir / "metrics.jsonl").read_text().splitlines()) == 3


def test_per_user_main_job_trains_each_simulated_user_their_own_adapter(tiny_model_dir, tmp_path, gsm8k_path):
    """[users] mode = "per_user": the student and the analyst are two users; each gets updates of
    their own adapter, published and swapped into serving for them alone."""
    port = free_port()
    log_dir = tmp_path / "logs"
    conf = tmp_path / "run.toml"
    conf.write_text(f"""
[global]
log_dir = "{log_dir}"
seed = 0
[policy_service]
model = "{tiny_model_dir}"
port = {port}
weight_sync_interval = 1
max_tokens_default = 32
[env_service]
num_envs = 2
group_size = 2
interaction_types = ["chat"]
personas = ["student", "analyst"]
max_turns = 2
data_path = "{gsm8k_path}"
[prm_service]
backend = "minilm"
[training]
lr = 1e-3
batch_size = 2
mini_batch_size = 1
max_steps = 4
eval_interval = 0
[users]
mode = "per_user"
""")
    out = subprocess.run(
        [sys.executable, "-m", "openclaw_rl.launch", "--config", str(conf)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    store = Store(log_dir / "store.sqlite")
    users = {u: store.user_stats(u, "x") for u in store.user_names()}
    assert set(users) == {"sim-student", "sim-analyst"}, users
    trained = [u for u, s in users.items() if s.updates > 0]
    assert trained, users
    for user in trained:
        assert f"[async] published policy user={user} version=1" in text
        assert f"[policy_service] adapter of user {user} swapped, version=1" in text
        assert (log_dir / "policy" / "users" / user / "v000001" / "adapter_config.json").is_file()
    # every sample trained belongs to one user's update: no update mixed users
    rows = store._db.execute(
        "SELECT step, COUNT(DISTINCT user) FROM samples WHERE status='trained' GROUP BY step"
    )
    assert all(n == 1 for _, n in rows.fetchall())


def test_a_run_whose_folder_is_removed_stops_loudly_and_leaves_no_fresh_store(tiny_model_dir, tmp_path):
    """``rm -rf`` of a running run's log_dir: the loops would go on writing to a deleted store and a
    restarted one would start an empty store beside them; the launcher stops the run and says why."""
    import shutil

    port = free_port()
    log_dir = tmp_path / "logs"
    launcher = _serving_run(log_dir, tiny_model_dir, port, tmp_path / "run.toml")
    try:
        shutil.rmtree(log_dir)
        out, _ = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1, out[-3000:]
    assert f"the run's store {log_dir}/store.sqlite was removed while the run was going" in out, out[-3000:]
    assert not (log_dir / "store.sqlite").exists() and not (log_dir / "checkpoints").exists()
    with pytest.raises(httpx.HTTPError):  # every loop it started is gone, the server included
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_a_second_ctrl_c_kills_every_loop_and_says_so_in_the_exit_status(tiny_model_dir, tmp_path):
    """One Ctrl-C asks the loops to finish (exit 0 once they have); a second kills them: nothing is
    left running, and the exit status (130) tells a script the stop was not a clean one."""
    import signal

    port = free_port()
    launcher = _serving_run(tmp_path / "logs", tiny_model_dir, port, tmp_path / "run.toml")
    try:
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.3)
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, out[-3000:]
    assert "[launch] asked again: killing the loops" in out
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
