"""The run directory's policy pointer: a run finds its newest published weights from any working
folder, and a copied or moved log_dir serves its own copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from openclaw_rl.runtime.rundir import POLICY_POINTER, RunDir


def _version(run: RunDir, n: int, user: str | None = None) -> Path:
    path = run.policy_dir(user) / f"v{n:06d}"
    path.mkdir(parents=True)
    (path / "weights").write_text(f"v{n}")
    return path


def test_a_run_started_elsewhere_finds_its_published_policy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = RunDir(Path("runA"))  # a relative log_dir, as configs/local.toml has
    run.publish_policy(2, _version(run, 2), step=3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    published = RunDir(tmp_path / "runA").read_published_policy()
    assert published is not None and published.version == 2 and published.step == 3
    assert (published.path / "weights").read_text() == "v2"


def test_a_copied_run_serves_its_own_copy(tmp_path):
    run = RunDir(tmp_path / "runA")
    run.publish_policy(1, _version(run, 1, "alice"), user="alice")
    shutil.copytree(tmp_path / "runA", tmp_path / "runB")
    (tmp_path / "runB" / "policy" / "users" / "alice" / "v000001" / "weights").write_text("copy")
    published = RunDir(tmp_path / "runB").read_published_policy("alice")
    assert published is not None and (published.path / "weights").read_text() == "copy"


def test_a_long_run_keeps_only_its_newest_policy_versions(tmp_path):
    """[training] keep_policies: each publish removes all but the newest versions, per user; the
    other users' and the shared policy's versions are left alone; 0 keeps every version."""
    run = RunDir(tmp_path / "run")
    for n in range(1, 6):
        run.publish_policy(n, _version(run, n), keep=3)
        run.publish_policy(n, _version(run, n, "alice"), user="alice", keep=2)
    assert [v for v, _ in run.published_versions()] == [5, 4, 3]
    assert [v for v, _ in run.published_versions("alice")] == [5, 4]
    published = run.read_published_policy()
    assert published is not None and (published.path / "weights").read_text() == "v5"
    run.publish_policy(6, _version(run, 6, "bob"), user="bob", keep=0)
    run.publish_policy(7, _version(run, 7, "bob"), user="bob", keep=0)
    assert [v for v, _ in run.published_versions("bob")] == [7, 6]
    # a pointer moved back to an old version by hand: that version is never removed
    run.publish_policy(3, run.policy_dir() / "v000003", keep=1)
    assert [v for v, _ in run.published_versions()] == [5, 3]


def test_pointers_written_by_older_versions_still_read(tmp_path, monkeypatch):
    """Older pointers held a path relative to the launch folder, or an absolute one."""
    run = RunDir(tmp_path / "runA")
    _version(run, 4)
    pointer = run.policies / POLICY_POINTER
    pointer.write_text(json.dumps({"version": 4, "path": "runA/policy/v000004"}))
    monkeypatch.chdir(tmp_path / "runA")  # not the folder the path was relative to
    published = run.read_published_policy()
    assert published is not None and (published.path / "weights").read_text() == "v4"
    pointer.write_text(json.dumps({"version": 4, "path": "/gone/runA/policy/v000004", "step": 9}))
    published = run.read_published_policy()
    assert published is not None and published.step == 9 and (published.path / "weights").read_text() == "v4"


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to act as another user"
)
def test_a_log_dir_the_user_may_not_reach_is_named_not_a_traceback():
    """Path.exists raises PermissionError on Python 3.11 under a folder the process may not read."""
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    reach = subprocess.run([*as_nobody, "import openclaw_rl"], capture_output=True, timeout=60, cwd="/")
    if reach.returncode != 0:
        pytest.skip("this checkout is not readable by another user")
    base = Path(tempfile.mkdtemp(prefix="perm_"))
    try:
        base.chmod(0o755)
        (base / "locked").mkdir(mode=0o700)
        code = (
            "import sys; from pathlib import Path; from openclaw_rl.runtime.rundir import RunDir\n"
            "run = RunDir(Path(sys.argv[1])); print(run.problem()); print(run.prepare())"
        )
        out = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                code,
                str(base / "locked" / "run"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert out.returncode == 0, out.stderr[-1000:]
        checked, prepared = out.stdout.splitlines()
        assert "cannot be created in" in checked and "Permission denied" in checked
        assert "Permission denied" in prepared  # and the run would not start either
    finally:
        shutil.rmtree(base)


def test_a_held_folder_stays_held_while_a_child_that_inherited_the_lock_lives(tmp_path):
    """The launcher's loops inherit its folder lock: a launcher killed with kill -9 leaves the folder
    held until its last loop has exited, so a new run cannot start beside the old loops."""
    import os
    import subprocess
    import sys

    from openclaw_rl.runtime.rundir import RunDir

    run = RunDir(tmp_path)
    lock = run.hold()
    assert not isinstance(lock, str) and lock.fd is not None
    assert run.holder() == os.getpid()
    second = run.hold()
    assert isinstance(second, str) and f"pid {os.getpid()}" in second and "log_dir" in second
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=(lock.fd,)
    )
    try:
        lock.release()  # the launcher is gone; its loop is not
        assert run.holder() == os.getpid()
    finally:
        child.communicate(timeout=30)
    assert run.holder() is None
    again = run.hold()
    assert not isinstance(again, str)
    again.release()
