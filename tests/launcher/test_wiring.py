"""The launcher's children: a child stops when the launcher dies, even by ``kill -9``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

LAUNCHER = """
import sys, time
from openclaw_rl.launcher.wiring import Child
child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(300)"])
child.start()
print(child.proc.pid, flush=True)
time.sleep(300)
"""


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_stops_when_its_launcher_is_killed():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(launcher.stdout.readline())
        assert _running(pid)
    finally:
        launcher.kill()  # SIGKILL: the launcher gets no chance to stop its children itself
        launcher.wait(timeout=10)
    deadline = time.monotonic() + 20
    while _running(pid):
        assert time.monotonic() < deadline, f"child {pid} outlived its launcher"
        time.sleep(0.1)


def test_a_restarted_run_serves_its_newest_published_policy(tmp_path, tiny_model_dir):
    """Both launchers start serving through start_serving: a run with a published policy resumes it."""
    import httpx

    from openclaw_rl.config import build_config
    from openclaw_rl.launcher.wiring import build_children, policy_url, start_serving
    from openclaw_rl.runtime.ports import free_port
    from openclaw_rl.runtime.rundir import RunDir
    from tests.helpers import save_tiny_model

    cfg = build_config({"global": {"log_dir": str(tmp_path / "logs")},
                        "policy_service": {"model": str(tiny_model_dir), "port": free_port()},
                        "env_service": {"enabled": False}}, environ={})
    conf = tmp_path / "run.toml"
    conf.write_text(f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n'
                    f'port = {cfg.policy_service.port}\n[env_service]\nenabled = false\n')
    run = RunDir.of(cfg)
    run.publish_policy(3, save_tiny_model(run.policies / "v000003", seed=1))  # what the trainer left behind
    server = build_children(cfg, str(conf))["policy_service"]
    ok, engine = start_serving(cfg, server)
    try:
        assert ok and engine is None
        assert httpx.get(f"{policy_url(cfg)}/healthz", timeout=10).json()["policy_version"] == 3
    finally:
        server.stop(timeout=30)
