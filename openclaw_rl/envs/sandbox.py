"""A bubblewrap sandbox for commands the agent writes (terminal env, python tool).

Why bubblewrap: it is a small, audited, unprivileged isolation tool shipped by Debian
(``apt-get install bubblewrap``; ``make sysdeps``) that builds a private mount/pid/net namespace
set per command without a daemon. Each :meth:`Sandbox.run` starts one ``bwrap`` process that sees:

* ``/work``  — the sandbox's own directory (read-write), also the working directory;
* ``/home/agent`` — a private home (read-write, persists across commands like ``/work``);
* ``/usr`` (and the ``/bin``, ``/lib`` links) and a few ``/etc`` files — read-only;
* a fresh ``/tmp`` (size-capped tmpfs), a minimal ``/dev`` and a private ``/proc``.

Nothing else of the host file system exists inside, so nothing outside can be written.
``--unshare-all`` removes the network (only the sandbox's own loopback exists), IPC, UTS and PID sharing;
``--die-with-parent`` plus the PID namespace mean that killing ``bwrap`` kills every process the
command left behind.

Resource limits are rlimits set by util-linux ``prlimit`` just before ``bwrap`` starts, so they hold
for every process inside: CPU seconds, address space (memory), process count, file size. Output is
read by this process and capped (a command printing without end is killed once it passes
``kill_output_bytes``), and a wall-clock timeout kills the whole tree.

Running as root: the kernel never applies ``RLIMIT_NPROC`` to the host's uid 0, and a user
namespace's uid maps back to the uid that created it. So when this process is root, ``bwrap`` is
started under a dedicated unprivileged host uid (61000+, one per sandbox, so sandboxes do not share a
process budget) and the sandbox directory is owned by that uid; inside, the agent is uid 1000 with no
capabilities. A fork bomb then hits the process limit instead of the machine.

Known limits (documented in docs/envs.md): memory is limited per process (RLIMIT_AS), not per tree;
total disk use in ``/work`` is checked after each command and reported, not enforced by a quota.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openclaw_rl.envs.base import EnvUnavailable

BWRAP = "/usr/bin/bwrap"
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
SANDBOX_UID_BASE = 61000
_uid_counter = itertools.count()
_uid_lock = threading.Lock()
_probed = False
_swept: set[str] = set()
#: The only variable bwrap itself needs; the command's own environment is set by --setenv.
_BWRAP_ENV = {"PATH": "/usr/bin:/bin"}
#: Sandbox folders (and the staging name each has until it is locked), which a later process removes
#: when no live sandbox holds them: what a killed one (``kill -9`` of the env loop) left behind.
_FOLDER = re.compile(r"(?:\.openclaw_sbx_new_|openclaw_sbx_\d+_)")
_STAGING = ".openclaw_sbx_new_"  # a folder before its lock is taken and it gets its name
STAGING_GRACE_S = 60.0  # a staging folder older than this was left by a process that died making it


class SandboxUnavailable(EnvUnavailable):
    """bubblewrap (or prlimit) is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command limits. Defaults suit small shell / python tasks on a 2-core machine."""

    timeout_sec: float = 10.0
    cpu_sec: int = 10
    memory_mb: int = 512
    max_procs: int = 64
    file_size_mb: int = 16
    tmp_size_mb: int = 64
    output_bytes: int = 8192  # kept per stream and shown to the agent
    kill_output_bytes: int = 1 << 20  # the command is killed once it has printed this much
    disk_mb: int = 64  # /work size reported as over quota past this


@dataclass
class CommandResult:
    """What one command did: the next state of a terminal action."""

    command: str
    stdout: str
    stderr: str
    exit_code: int
    elapsed_s: float
    timed_out: bool = False
    output_truncated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def as_observation(self) -> str:
        """The text the agent sees: exit code, stdout, stderr and any limit that was hit."""
        parts = [f"exit code: {self.exit_code}"]
        parts.append("stdout:\n" + (self.stdout if self.stdout else "(empty)"))
        parts.append("stderr:\n" + (self.stderr if self.stderr else "(empty)"))
        parts += [f"[sandbox] {n}" for n in self.notes]
        return "\n".join(parts)


def _next_uid() -> int:
    with _uid_lock:
        n = next(_uid_counter)
    # Spread across processes too (several test / worker processes may run at once).
    return SANDBOX_UID_BASE + (os.getpid() * 31 + n) % 2000


def check_available() -> None:
    """Raise :class:`SandboxUnavailable` with an install hint when the tools are missing."""
    if not os.access(BWRAP, os.X_OK):
        raise SandboxUnavailable(
            f"bubblewrap not found at {BWRAP}: install it with `make sysdeps` (apt-get install bubblewrap)"
        )
    if not os.access(PRLIMIT, os.X_OK):
        raise SandboxUnavailable(f"prlimit not found at {PRLIMIT}: install util-linux")


def _entries(top: Path) -> Iterator[os.DirEntry[str]]:
    """Every entry under ``top`` (links not followed), walked with a stack, not recursion: an agent
    can nest folders deeper than Python's recursion limit (``os.walk`` on 3.11 and ``shutil.rmtree``
    recurse), and its sandbox must still be measured and removed. Unreadable folders are skipped."""
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    yield entry
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue  # gone, unreadable, or a path past PATH_MAX


def remove_tree(path: Path) -> None:
    """Delete ``path`` and everything under it, however deep the agent nested it; never raises."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass  # deeper than the recursion limit: rm below walks it without recursion
    if os.path.lexists(path):
        try:  # GNU rm walks any depth (fts) and works below PATH_MAX by relative paths
            subprocess.run(
                ["rm", "-rf", "--one-file-system", "--", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass  # left for the next process's sweep, which takes only unheld folders


def _sweep_orphans(base_dir: str | Path | None) -> None:
    """Once per folder and process: delete the sandbox folders no live sandbox holds.

    A live sandbox holds an exclusive ``flock`` on its folder for its whole life. The lock, not the
    PID in the folder's name, decides: processes in other PID namespaces (two containers sharing one
    ``/tmp``) cannot see each other's PIDs, but they do see each other's locks. A folder gets its
    name only once its lock is held (:class:`Sandbox`), so an unheld one is abandoned; an unheld
    staging folder is, once it is older than ``STAGING_GRACE_S``."""
    base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
    if str(base) in _swept:
        return
    _swept.add(str(base))
    try:
        entries = list(base.iterdir())
    except OSError:
        return  # an unreadable temp folder: mkdtemp will say what is wrong with it
    for entry in entries:
        if not _FOLDER.match(entry.name):
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue  # gone mid-scan
        if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode):
            continue  # another user's sandbox: not ours to judge
        if entry.name.startswith(_STAGING) and time.time() - st.st_mtime < STAGING_GRACE_S:
            continue  # its maker may be between making it and locking it
        if _unheld(entry):
            remove_tree(entry)


def _lock_folder(folder: Path, wait: bool) -> int | None:
    """Open ``folder`` and take an exclusive flock on it; the fd, or None if another holds it."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def _lock_own_folder(folder: Path) -> int | None:
    """The creator's lock on its new folder; None on a filesystem without flock (ENOLCK, some
    network mounts), where the sandbox works unlocked and sweeps leave every folder alone."""
    try:
        return _lock_folder(folder, wait=True)
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise


def _unheld(folder: Path) -> bool:
    """True when no live sandbox holds ``folder`` (the probe's own lock is released at once)."""
    try:
        fd = _lock_folder(folder, wait=False)
    except OSError:
        return False  # gone mid-scan, or not ours to open
    if fd is None:
        return False
    os.close(fd)
    return True


class Sandbox:
    """One isolated directory plus a way to run shell commands in it.

    Usage::

        with Sandbox() as sb:
            sb.write_file("a.txt", "hi\\n")
            r = sb.run("wc -l a.txt")
            r.stdout, r.exit_code
    """

    def __init__(self, limits: SandboxLimits | None = None, base_dir: str | Path | None = None):
        check_available()
        self.limits = limits or SandboxLimits()
        _sweep_orphans(base_dir)
        # Made under a name the sweep leaves to its maker while locked, locked, then renamed: a sweep
        # never sees a live sandbox's folder unlocked.
        staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=base_dir))
        self._lock_fd: int | None = None
        self.root = staging
        try:
            self._lock_fd = _lock_own_folder(staging)  # held until close()
            self.root = staging.with_name(f"openclaw_sbx_{os.getpid()}_{staging.name.removeprefix(_STAGING)}")
            staging.rename(self.root)
            self.workdir = self.root / "work"
            self.home = self.root / "home"
            self._etc = self.root / "etc"
            for d in (self.workdir, self.home, self._etc):
                d.mkdir()
            self.is_root = os.geteuid() == 0
            self.uid = _next_uid() if self.is_root else os.geteuid()
            self.gid = self.uid if self.is_root else os.getegid()
            (self._etc / "passwd").write_text("agent:x:1000:1000:agent:/home/agent:/bin/bash\n")
            (self._etc / "group").write_text("agent:x:1000:\n")
            os.chmod(self.root, 0o755)
            self._chown_tree()
        except BaseException:
            self._closed = False
            self.close()  # nothing half-made is left behind, nor its lock
            raise
        self._closed = False
        self._probe()

    def _probe(self) -> None:
        """Once per process: prove bwrap can build its namespaces here, or say why it cannot."""
        global _probed
        if _probed:
            return
        r = self.run("true")
        if r.exit_code != 0:
            self.close()
            raise SandboxUnavailable(
                f"bubblewrap cannot create a sandbox here (exit {r.exit_code}): {r.stderr.strip()[:300]}; "
                "it needs unprivileged user namespaces (kernel.unprivileged_userns_clone / "
                "user.max_user_namespaces) or a setuid bwrap"
            )
        _probed = True

    # ---- files (used by task set-up and checkers; never follow links out of /work) ----

    def _chown_tree(self) -> None:
        """Give /work and /home to the sandbox uid (only needed, and only possible, as root)."""
        if not self.is_root:
            return
        for top in (self.workdir, self.home):
            os.lchown(top, self.uid, self.gid)
            for entry in _entries(top):
                try:
                    os.lchown(entry.path, self.uid, self.gid)
                except OSError:
                    continue  # removed meanwhile, or a path past PATH_MAX

    def path(self, rel: str) -> Path:
        """Absolute host path of ``rel`` inside /work; refuses anything resolving outside it, and a
        NUL byte (no path holds one)."""
        if "\0" in rel:
            raise PermissionError(f"{rel!r} holds a NUL byte, which no path can")
        target = Path(os.path.realpath(self.workdir / rel))
        base = Path(os.path.realpath(self.workdir))
        if target != base and base not in target.parents:
            raise PermissionError(f"{rel!r} resolves outside the sandbox directory")
        return target

    def write_file(self, rel: str, content: str | bytes, mode: int = 0o644) -> None:
        """Create a file in /work (parents too), owned by the sandbox user."""
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        p.write_bytes(content)
        os.chmod(p, mode)
        self._chown_tree()

    def read_file(self, rel: str, max_bytes: int = 1 << 20) -> str | None:
        """Text of /work/``rel``, or None if it is missing, not a regular file, or a link leaving /work."""
        try:
            p = self.path(rel)
        except PermissionError:
            return None
        if not p.is_file():
            return None
        with open(p, "rb") as f:
            return f.read(max_bytes).decode(errors="replace")

    def exists(self, rel: str) -> bool:
        try:
            return self.path(rel).exists()
        except PermissionError:
            return False

    def disk_usage(self) -> int:
        """Bytes used under /work (links not followed)."""
        total = 0
        for entry in _entries(self.workdir):
            try:
                if not entry.is_dir(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
        return total

    # ---- commands ----

    def _argv(self, command: str) -> list[str]:
        lim = self.limits
        argv = [
            PRLIMIT,
            f"--cpu={lim.cpu_sec}:{lim.cpu_sec + 1}",
            f"--as={lim.memory_mb << 20}",
            f"--nproc={lim.max_procs}",
            f"--fsize={lim.file_size_mb << 20}",
            "--core=0",
            "--",
            BWRAP,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / top
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{top}"]
        for etc in (
            "/etc/alternatives",
            "/etc/ld.so.cache",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d",
            "/etc/localtime",
            "/etc/nsswitch.conf",
        ):
            if os.path.exists(etc):
                argv += ["--ro-bind", etc, etc]
        argv += [
            "--ro-bind",
            str(self._etc / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(self._etc / "group"),
            "/etc/group",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(lim.tmp_size_mb << 20),
            "--tmpfs",
            "/tmp",
            "--bind",
            str(self.workdir),
            "/work",
            "--bind",
            str(self.home),
            "/home/agent",
            "--remount-ro",
            "/",
            "--chdir",
            "/work",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/home/agent",
            "--setenv",
            "USER",
            "agent",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "TERM",
            "dumb",
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            "--setenv",
            "GIT_AUTHOR_NAME",
            "agent",
            "--setenv",
            "GIT_AUTHOR_EMAIL",
            "agent@sandbox",
            "--setenv",
            "GIT_COMMITTER_NAME",
            "agent",
            "--setenv",
            "GIT_COMMITTER_EMAIL",
            "agent@sandbox",
            "/bin/bash",
            "-c",
            command,
        ]
        return argv

    def run(self, command: str, stdin: str | None = None) -> CommandResult:
        """Run ``command`` with bash inside the sandbox; never raises for what the command does."""
        if self._closed:
            raise RuntimeError("sandbox is closed")
        lim = self.limits
        if "\x00" in command:
            # No program can receive a NUL in its argv; a model that emits one gets told, not a crash.
            return CommandResult(
                command=command.replace("\x00", "\\0"),
                stdout="",
                stderr="the command contains a NUL byte (\\0); it cannot be run",
                exit_code=2,
                elapsed_s=0.0,
            )
        kwargs: dict = {}
        if self.is_root:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._argv(command),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                cwd=self.root,
                # bwrap's own PID-1 process keeps the environment it was started with, and a command
                # inside can read it from /proc/1/environ: it gets nothing of the service's (API keys).
                env=_BWRAP_ENV,
                **kwargs,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"could not start bubblewrap: {exc}") from exc
        if stdin is not None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(stdin.encode()[: lim.kill_output_bytes])
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the command did not read its input; that is its business
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        total = 0
        timed_out = flooded = False
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        deadline = start + lim.timeout_sec
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                total += len(chunk)
                buf = bufs[key.data]
                if len(buf) < lim.output_bytes + 1:
                    buf += chunk[: lim.output_bytes + 1 - len(buf)]
            if total > lim.kill_output_bytes:
                flooded = True
                break
        if timed_out or flooded:
            self._kill(proc)
        try:
            exit_code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            exit_code = proc.wait()
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        elapsed = time.monotonic() - start
        notes = []
        truncated = any(len(b) > lim.output_bytes for b in bufs.values()) or flooded
        if timed_out:
            notes.append(f"killed: wall-clock timeout of {lim.timeout_sec:g}s exceeded")
            exit_code = 124
        if flooded:
            notes.append(f"killed: printed more than {lim.kill_output_bytes} bytes of output")
        elif truncated:
            notes.append(f"output truncated to {lim.output_bytes} bytes per stream")
        if exit_code < 0:
            notes.append(f"terminated by signal {signal.Signals(-exit_code).name}")
            exit_code = 128 - exit_code
        elif exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and not (timed_out or flooded):
            notes.append(
                f"process ended by signal {signal.Signals(exit_code - 128).name} "
                f"(CPU limit {lim.cpu_sec}s or memory limit {lim.memory_mb} MB)"
            )
        elif exit_code == 128 + signal.SIGXFSZ:
            notes.append(f"file size limit of {lim.file_size_mb} MB exceeded")
        if b"Resource temporarily unavailable" in bufs["stderr"] and b"fork" in bufs["stderr"]:
            # a shell that cannot fork says so and goes on: exit status 0 hides the limit
            notes.append(f"process limit of {lim.max_procs} reached: some commands did not start")
        # before anything reads /work: a command may have taken its permissions away
        self._keep_workdir_usable()
        used = self.disk_usage()
        if used > lim.disk_mb << 20:
            notes.append(f"disk quota exceeded: /work holds {used >> 20} MB (limit {lim.disk_mb} MB)")
        out, err = (bytes(bufs[k][: lim.output_bytes]).decode(errors="replace") for k in ("stdout", "stderr"))
        return CommandResult(
            command=command,
            stdout=out,
            stderr=err,
            exit_code=exit_code,
            elapsed_s=elapsed,
            timed_out=timed_out,
            output_truncated=truncated,
            notes=notes,
        )

    def _keep_workdir_usable(self) -> None:
        """Give /work and the home folder back their owner's rwx: after a ``chmod 000 .`` inside,
        bwrap itself could no longer enter /work and every later command would fail before it ran."""
        for top in (self.workdir, self.home):
            mode = stat.S_IMODE(top.lstat().st_mode)
            if mode & 0o700 != 0o700:
                os.chmod(top, mode | 0o700)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """Kill bwrap's process group; --die-with-parent and the PID namespace take the rest."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone

    def close(self) -> None:
        """Delete the sandbox directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        remove_tree(self.root)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown; nothing left to report to
            return
