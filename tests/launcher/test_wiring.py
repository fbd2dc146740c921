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


STOPPING_LOOP = """
import signal, sys, time
from pathlib import Path
log = Path(sys.argv[1])
def stop(*_):
    with log.open("a") as f:
        f.write(f"asked {sys.argv[2]}\\n")
    time.sleep(1.0)  # finishing what it was doing
    with log.open("a") as f:
        f.write(f"gone {sys.argv[2]}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(300)
"""


def test_a_stopping_run_asks_every_loop_at_once_and_the_server_last(tmp_path):
    from openclaw_rl.launcher.wiring import STOP_ORDER, Child, _stop_all

    log = tmp_path / "stops.log"
    script = tmp_path / "loop.py"
    script.write_text(STOPPING_LOOP)
    children = {name: Child(name, [sys.executable, str(script), str(log), name]) for name in STOP_ORDER}
    for child in children.values():
        child.start()
    time.sleep(2.0)  # every child has its handler installed
    _stop_all(children)
    events = log.read_text().split()
    said = list(zip(events[::2], events[1::2], strict=True))
    loops = [n for n in STOP_ORDER if n != "policy_service"]
    # every loop was asked before any of them had gone: they stop side by side ...
    assert sorted(said[: len(loops)]) == sorted(("asked", n) for n in loops)
    # ... and the server only once they all had: it drains the turns still in flight
    assert said[-2:] == [("asked", "policy_service"), ("gone", "policy_service")]
    assert {n for kind, n in said if kind == "gone"} == set(STOP_ORDER)
    assert all(not c.alive() for c in children.values())


def test_the_server_is_given_as_long_to_drain_as_it_gives_a_reply():
    """Ctrl-C while a user's reply streams: the launcher must not kill the server before the server
    itself would give up on the reply (request_timeout_sec), or the reply is cut off unrecorded."""
    from openclaw_rl.config import Config
    from openclaw_rl.launcher.wiring import server_stop_timeout

    cfg = Config()
    for seconds in (45.0, 300.0):
        cfg.policy_service.request_timeout_sec = seconds
        assert server_stop_timeout(cfg) > seconds


def test_a_restarted_run_serves_its_newest_published_policy(tmp_path, tiny_model_dir):
    """A run with a published policy resumes it: when the run starts, and when the policy service
    alone was killed and the launcher restarts it (not the base until the next publish)."""
    import os
    import signal

    import httpx

    from openclaw_rl.config import build_config
    from openclaw_rl.launcher.wiring import build_children, policy_url, start_serving, supervise, wait_healthy
    from openclaw_rl.runtime.ports import free_port
    from openclaw_rl.runtime.rundir import RunDir
    from tests.helpers import save_tiny_model

    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"model": str(tiny_model_dir), "port": free_port()},
            "env_service": {"enabled": False},
        },
        environ={},
    )
    conf = tmp_path / "run.toml"
    conf.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n'
        f"port = {cfg.policy_service.port}\n[env_service]\nenabled = false\n"
    )
    run = RunDir.of(cfg)
    run.publish_policy(3, save_tiny_model(run.policies / "v000003", seed=1))  # what the trainer left behind
    server = build_children(cfg, str(conf))["policy_service"]
    ok, engine = start_serving(cfg, server)
    try:
        assert ok and engine is None
        assert httpx.get(f"{policy_url(cfg)}/healthz", timeout=10).json()["policy_version"] == 3
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        assert supervise({"policy_service": server}) is None and server.restarts == 1
        assert wait_healthy(policy_url(cfg), server)
        assert httpx.get(f"{policy_url(cfg)}/healthz", timeout=10).json()["policy_version"] == 3
    finally:
        server.stop(timeout=30)


def test_each_loop_process_gets_its_share_of_threads(tmp_path, monkeypatch):
    from openclaw_rl.config import build_config
    from openclaw_rl.launcher.wiring import Child, build_children, thread_shares

    assert thread_shares(2) == {
        "policy_service": 1,
        "training": 1,
        "prm_service": 1,
        "env_service": 1,
        "evaluator": 1,
    }
    assert thread_shares(16)["policy_service"] == 8 and thread_shares(16)["training"] == 8
    cfg = build_config({"global": {"log_dir": str(tmp_path)}}, environ={})
    children = build_children(cfg, str(tmp_path / "c.toml"))
    assert all(c.threads is not None and c.threads >= 1 for c in children.values())

    def threads_in_child(out: Path) -> str:
        """What torch in a started child really uses (it reads OMP_NUM_THREADS), and that variable."""
        code = (
            f"import os, torch; open({str(out)!r}, 'w').write("
            "f'{torch.get_num_threads()} {os.environ.get(\"OMP_NUM_THREADS\")}')"
        )
        child = Child("probe", [sys.executable, "-c", code], threads=1)
        child.start()
        child.proc.wait(timeout=120)
        return out.read_text()

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_in_child(tmp_path / "a") == "1 1"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # a user's own setting wins
    assert threads_in_child(tmp_path / "b").endswith(" 5")


def _served_version(tmp_path, tiny_model_dir, prepare) -> int:
    """The policy version a freshly started service serves from a run folder ``prepare(cfg, run)`` set up."""
    from openclaw_rl.config import build_config
    from openclaw_rl.policy.server import PolicyService
    from openclaw_rl.runtime.rundir import RunDir

    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"model": str(tiny_model_dir), "port": 0},
            "training": {"lora": True},
        },
        environ={},
    )
    prepare(cfg, RunDir.of(cfg))
    svc = PolicyService(cfg)
    svc.start()
    try:
        return svc.policy_version
    finally:
        svc.stop()


def test_a_published_policy_that_cannot_be_loaded_is_reported_and_the_base_served(
    tmp_path, tiny_model_dir, capsys
):
    def emptied(cfg, run):
        (run.policies / "v000002").mkdir(parents=True)  # emptied by hand, or a disk that lost it
        run.publish_policy(2, run.policies / "v000002")

    assert _served_version(tmp_path, tiny_model_dir, emptied) == 0
    assert "could not load policy version=2" in capsys.readouterr().out


def test_a_published_version_gone_by_hand_falls_back_to_the_newest_that_loads(
    tmp_path, tiny_model_dir, capsys
):
    from openclaw_rl.trainer.ppo import Trainer

    def removed(cfg, run):
        Trainer(cfg, cfg.policy_service.model).export_policy(run.policies, 1)
        run.publish_policy(2, run.policies / "v000002")  # the pointer names v2, whose folder was removed

    assert _served_version(tmp_path, tiny_model_dir, removed) == 1
    out = capsys.readouterr().out
    assert "could not load policy version=2" in out
    assert "serving policy version=1, the newest that loads (the published version 2 does not)" in out


def test_a_loop_stopped_by_a_full_disk_waits_for_room_and_is_not_counted_as_a_crash(
    tmp_path, monkeypatch, capsys
):
    """A full disk is not a crash to retry three times and then stop the run (serving with it): the
    loop that hit it waits for room, the others go on, and it restarts once there is room."""
    import shutil
    from collections import namedtuple

    from openclaw_rl.launcher import wiring
    from openclaw_rl.runtime import rundir
    from openclaw_rl.runtime.loop_main import DISK_FULL_EXIT

    usage = namedtuple("usage", "total used free")
    free = {"bytes": 10 * 2**20}
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda _: usage(1, 1, free["bytes"]))
    full = [sys.executable, "-c", f"raise SystemExit({DISK_FULL_EXIT})"]
    trainer = wiring.Child("training", full, restarts=wiring.MAX_RESTARTS)  # no crashes left to spend
    trainer.start()
    trainer.proc.wait(timeout=60)
    for _ in range(3):
        assert wiring.supervise({"training": trainer}, tmp_path) is None  # the run goes on
    assert not trainer.alive() and trainer.waiting_for_room
    out = capsys.readouterr().out
    assert out.count(f"[launch] training stopped: the disk under {tmp_path} is full (10 MiB free)") == 1
    free["bytes"] = shutil.disk_usage(tmp_path).free + wiring.MIN_FREE_BYTES
    assert wiring.supervise({"training": trainer}, tmp_path) is None
    assert "room on the disk again; restarting it" in capsys.readouterr().out
    trainer.proc.wait(timeout=60)
    assert trainer.restarts == wiring.MAX_RESTARTS and not trainer.waiting_for_room


def test_a_loop_that_fills_the_disk_says_so_and_exits_for_a_restart_later(tmp_path, capsys):
    from openclaw_rl.runtime.loop_main import DISK_FULL_EXIT, run_loop_body

    def writes_a_checkpoint() -> int:
        try:
            raise OSError(28, "No space left on device")
        except OSError as exc:  # as safetensors reports it: its own error, the OS's words inside
            raise RuntimeError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            ) from exc

    assert run_loop_body("training", writes_a_checkpoint, tmp_path) == DISK_FULL_EXIT
    err = capsys.readouterr().err
    assert "[training] stopped: the disk is full" in err and f"free space under {tmp_path}" in err
    assert run_loop_body("training", lambda: 1 // 0, tmp_path) == 1  # any other error is a crash


def test_an_opaque_write_error_on_a_full_disk_counts_as_the_full_disk(tmp_path, monkeypatch):
    """torch's writer says only 'unexpected pos 64 vs 0' when the disk fills under it: with the run's
    folder nearly out of room, that is the full disk, not a crash to retry."""
    from collections import namedtuple

    from openclaw_rl.runtime import loop_main, rundir

    opaque = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda _: usage(1, 1, 5 * 2**20))
    assert loop_main.disk_full(opaque, tmp_path)
    assert not loop_main.disk_full(opaque)  # without a folder to look at: a crash
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda _: usage(1, 1, 50 * 2**30))
    assert not loop_main.disk_full(opaque, tmp_path)
    assert loop_main.disk_full(RuntimeError("database or disk is full"))
