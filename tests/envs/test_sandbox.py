"""Sandbox escapes: each is contained, reported as an observation, and the sandbox lives on."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from openclaw_rl.envs import make
from openclaw_rl.envs.sandbox import Sandbox, SandboxLimits

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

LIMITS = SandboxLimits(timeout_sec=3, cpu_sec=2, max_procs=32, kill_output_bytes=200_000, output_bytes=2000)


@pytest.fixture
def sb():
    with Sandbox(LIMITS) as s:
        yield s


def _alive(sb: Sandbox) -> None:
    r = sb.run("echo still-alive")
    assert r.exit_code == 0 and r.stdout.strip() == "still-alive"


def test_runs_as_unprivileged_user_in_own_dir(sb):
    r = sb.run("id -u; pwd; echo hi > f; cat f")
    assert r.stdout.split() == ["1000", "/work", "hi"]
    assert (sb.workdir / "f").read_text() == "hi\n"


def test_cannot_write_outside(sb, tmp_path):
    marker = tmp_path / "outside.txt"
    r = sb.run(f"echo x > /usr/evil; echo x > /evil; echo x > {marker}; echo x > /tmp/../etc/evil; ls /root")
    assert r.exit_code != 0
    assert "Read-only file system" in r.stderr
    assert not marker.exists() and not Path("/usr/evil").exists() and not Path("/evil").exists()
    # the host's files do not even exist inside
    r = sb.run(f"cat {Path(__file__).resolve()}")
    assert r.exit_code != 0 and "No such file" in r.stderr
    _alive(sb)


def test_symlink_out_is_not_followed_by_checkers(sb):
    sb.run("ln -s /etc/hostname link; ln -s ../../.. up")
    assert sb.read_file("up/etc/hostname") is None
    with pytest.raises(PermissionError):
        sb.path("up/etc")


def test_no_network(sb):
    # a real server listening on the host's loopback is not reachable from inside
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    accepted: list[object] = []
    t = threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True)
    t.start()
    try:
        r = sb.run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\""
        )
        assert r.exit_code != 0 and ("refused" in r.stderr or "unreachable" in r.stderr), r.as_observation()
        r = sb.run("python3 -c \"import socket; socket.create_connection(('93.184.216.34', 80), timeout=2)\"")
        assert r.exit_code != 0 and "unreachable" in r.stderr
        assert not accepted
    finally:
        srv.close()
    _alive(sb)


def test_fork_bomb_is_contained(sb):
    r = sb.run("bomb() { bomb | bomb & }; bomb; sleep 1; ps -e | wc -l")
    assert "Resource temporarily unavailable" in r.stderr or r.timed_out, r.as_observation()
    r = sb.run('python3 -c "import os\nwhile True: os.fork()"')
    assert "Resource temporarily unavailable" in r.stderr
    # a shell that cannot fork goes on with status 0: the observation names the limit
    r = sb.run("for i in $(seq 80); do sleep 2 & done; wait")
    assert "[sandbox] process limit of 32 reached" in r.as_observation(), r.as_observation()
    _alive(sb)
    # nothing survives the command: the PID namespace went with it
    if os.geteuid() == 0:
        deadline = time.monotonic() + 5  # the kernel tears the namespace down asynchronously
        while _host_processes_of(sb.uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _host_processes_of(sb.uid)


def _host_processes_of(uid: int) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if p.stat().st_uid == uid:
                    pids.append(int(p.name))
            except FileNotFoundError:
                continue
    return pids


def test_infinite_output_is_cut(sb):
    r = sb.run("yes")
    assert r.output_truncated and any("printed more than" in n for n in r.notes)
    assert len(r.stdout) <= LIMITS.output_bytes
    assert "[sandbox] killed: printed more than" in r.as_observation()
    _alive(sb)


def test_sleep_past_timeout_is_killed(sb):
    r = sb.run("sleep 60 & sleep 60")
    assert r.timed_out and r.exit_code == 124 and r.elapsed_s < 10
    assert "wall-clock timeout" in r.as_observation()
    _alive(sb)


def test_cpu_memory_and_file_size_limits(sb):
    r = sb.run('python3 -c "x = bytearray(2_000_000_000)"')
    assert "MemoryError" in r.stderr
    r = sb.run("head -c 20000000 /dev/zero > big")
    assert r.exit_code != 0 and any("file size limit" in n for n in r.notes)
    r = SandboxLimits(timeout_sec=10, cpu_sec=1)
    with Sandbox(r) as s2:
        res = s2.run("while :; do :; done")
        assert not res.timed_out and res.exit_code == 128 + 24  # SIGXCPU
        assert any("CPU limit" in n for n in res.notes)


def test_terminal_env_reports_escape_as_observation():
    env = make("terminal", task="count_lines", limits=LIMITS, max_turns=5)
    env.reset(seed=0)
    for cmd in ("yes", "sleep 30", "echo x > /usr/x", "bomb(){ bomb|bomb& }; bomb"):
        obs, reward, term, trunc, info = env.step(f"```bash\n{cmd}\n```")
        assert obs.startswith("exit code:") and not term
    obs, reward, term, trunc, info = env.step("wc -l < access.log")
    assert info["success"] and term
    env.close()


def test_the_services_environment_is_not_readable_inside(monkeypatch):
    # bwrap's own PID 1 inside the namespace is readable by the command; it must not hold the
    # service's variables, where the users' API keys live.
    monkeypatch.setenv("OPENCLAW_TEST_SECRET", "not-a-real-secret")
    with Sandbox(LIMITS) as s:
        r = s.run("cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'; env")
        assert r.exit_code == 0
        assert "not-a-real-secret" not in r.stdout + r.stderr
        assert "OPENCLAW_TEST_SECRET" not in r.stdout


def test_a_nul_byte_or_chmod_000_does_not_break_the_sandbox(sb):
    r = sb.run("echo a\x00b")
    assert r.exit_code != 0 and "NUL" in r.stderr
    _alive(sb)
    assert sb.read_file("a\x00b") is None and not sb.exists("a\x00b")  # no path holds a NUL
    sb.write_file("kept.txt", "kept")
    assert sb.run("chmod 000 .").exit_code == 0
    # usable again as soon as the command returns: a checker reads /work right after it
    assert sb.workdir.stat().st_mode & 0o700 == 0o700 and sb.read_file("kept.txt") == "kept"
    _alive(sb)  # bwrap can still enter /work


def test_folders_nested_deeper_than_pythons_recursion_limit_are_measured_and_removed():
    """An agent's command may nest folders 1,500 deep: the sandbox still runs commands, measures its
    disk use and leaves no folder behind (os.walk and shutil.rmtree recurse on Python 3.11)."""
    sb = Sandbox(LIMITS)
    nest = "import os\nfor _ in range(1500):\n os.mkdir('a'); os.chdir('a')\nopen('f', 'w').write('x' * 10)"
    assert sb.run(f'python3 -c "{nest}"').exit_code == 0
    _alive(sb)
    assert sb.disk_usage() == 10
    root = sb.root
    sb.close()
    assert not root.exists()


def test_a_killed_process_s_sandbox_folder_is_removed_by_the_next_one():
    # A folder the sandbox's own uid can pass through (pytest's tmp_path is 0700 to root).
    base = Path(tempfile.mkdtemp(prefix="sbx-sweep-"))
    base.chmod(0o755)
    try:
        # a process that made a sandbox and died without closing it (kill -9 of the env loop)
        code = (
            "import os; from openclaw_rl.envs.sandbox import Sandbox; "
            f"s = Sandbox(base_dir={str(base)!r}); print(s.root, flush=True); os._exit(0)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        left = Path(out.stdout.strip())
        assert left.exists()
        with Sandbox(LIMITS, base_dir=base) as s:
            assert not left.exists()
            assert s.root.exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_sweep_removes_only_folders_no_live_sandbox_holds(tmp_path):
    """The lock decides, not the PID in the name: a folder held by a process in another PID namespace
    (its PID means nothing here) survives; an abandoned one goes, and so does the held one once its
    holder is gone."""
    from openclaw_rl.envs import sandbox as sandbox_mod

    held, abandoned = (tmp_path / f"openclaw_sbx_{n}_x" for n in (999_999_001, 999_999_002))
    for folder in (held, abandoned):
        (folder / "work").mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\n"
            "time.sleep(60)",
            str(held),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        sandbox_mod._swept.discard(str(tmp_path))
        sandbox_mod._sweep_orphans(tmp_path)
        assert held.is_dir()
        assert not abandoned.exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its folder is an orphan now
    sandbox_mod._swept.discard(str(tmp_path))
    sandbox_mod._sweep_orphans(tmp_path)
    assert not held.exists()


def test_staging_leftovers_are_swept_once_old_and_a_failed_start_leaves_nothing(tmp_path, monkeypatch):
    from openclaw_rl.envs import sandbox as sandbox_mod

    old, young = tmp_path / ".openclaw_sbx_new_old12345", tmp_path / ".openclaw_sbx_new_young123"
    for folder in (old, young):
        folder.mkdir()
    past = time.time() - 2 * sandbox_mod.STAGING_GRACE_S
    os.utime(old, (past, past))
    sandbox_mod._swept.discard(str(tmp_path))
    sandbox_mod._sweep_orphans(tmp_path)
    assert not old.exists() and young.is_dir()  # young: its maker may not have locked it yet

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sandbox_mod.os, "chmod", refuse)
    base = tmp_path / "fresh"
    base.mkdir()
    with pytest.raises(OSError):
        Sandbox(base_dir=base)
    assert list(base.iterdir()) == []  # neither the folder nor its staging name is left behind


def test_a_live_sandbox_survives_another_process_sweeping():
    base = Path(tempfile.mkdtemp(prefix="sweep_"))
    base.chmod(0o755)  # the sandbox uid must reach its folder (pytest's tmp_path is 0700)
    with Sandbox(base_dir=base) as live:
        code = "import sys\nfrom openclaw_rl.envs import sandbox\nsandbox._sweep_orphans(sys.argv[1])\n"
        subprocess.run([sys.executable, "-c", code, str(base)], check=True, timeout=60)
        assert live.root.is_dir()
        assert live.run("echo ok").stdout.strip() == "ok"
        # the whole random part of the staging name is kept: names cannot collide within a process
        assert len(live.root.name.split("_", 3)[-1]) >= 8
    shutil.rmtree(base)
