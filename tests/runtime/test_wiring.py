"""The launcher's children: a child stops when the launcher dies, even by ``kill -9``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = """
import sys, time
from openclaw_rl.runtime.wiring import Child
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
