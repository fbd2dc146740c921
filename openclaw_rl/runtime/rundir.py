"""The run directory: where one run keeps everything it writes, named in one place.

Every loop of a run opens the same ``[global] log_dir``; this object is the only place that knows
what lives inside it, so no loop spells a path out by hand::

    run = RunDir.of(cfg)
    store = Store(run.store)                   # <log_dir>/store.sqlite, the durable store
    run.checkpoints                            # <log_dir>/checkpoints/step_00000012/ ...
    run.policies                               # <log_dir>/policy/v000003/ exported policy versions
    run.publish_policy(3, run.policies / "v000003", step=12)
    run.read_policy_pointer()                  # (3, Path(".../policy/v000003"))
    run.read_published_policy()                # PublishedPolicy(version=3, path=..., step=12)
    run.admin_key()                            # the secret of the policy service's admin routes
    run.client_key(cfg.policy_service)         # the key its clients send (api_key, or generated)

Exported policies go to ``policy/`` whether the online training loop or the offline
``openclaw-rl train`` wrote them, and the policy service's weight route loads only from there.

The admin secret (``admin.key``, readable by the owner only) is how the run's own loops reach the
policy service's admin routes (weight swaps, pause, closing sessions): the launcher makes a new one
for each run, and the loops read it from here; it is never the user-facing ``api_key``. The client key (``client.key``, also 0600) is the
user-facing key a policy service on a public address requires when the config sets none: it is
made once, at the service's first start, and its clients (the run's own and the user's) read it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from openclaw_rl.config import Config, PolicyServiceConfig, generates_client_key
from openclaw_rl.runtime.store import folder_problem, store_problem

#: The file naming the newest published policy version, inside :attr:`RunDir.policies`.
POLICY_POINTER = "latest.json"
#: What each exported policy folder says of itself: version, step, base model, run (the trainers write it).
POLICY_META = "openclaw_policy.json"
MIN_FREE_BYTES = 200 * 2**20  # below this, the next checkpoint may not fit


def free_bytes(folder: Path) -> int:
    """Bytes free on the disk under ``folder`` (0 when it cannot be read: no room to count on)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


#: The file a running run holds an exclusive ``flock`` on (and names its launcher's PID in).
RUN_LOCK = "run.lock"


def process_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (anyone's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    return True


def _pid_in(fd: int) -> int:
    """The PID a held run.lock names (0 when it names none)."""
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else 0


@dataclass
class RunLock:
    """A folder held for one run. The lock belongs to the open file, so children given ``fd``
    (``Popen(pass_fds=...)``) hold it too: a run whose launcher was killed still holds its folder
    until its last loop has exited."""

    fd: int | None  # None on a file system without flock: nothing is held, nothing is refused

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def atomic_write_text(path: Path, text: str, mode: int = 0o644, exclusive: bool = False) -> bool:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never half of one
    (write a sibling temporary file, then move it into place, which is atomic on POSIX). ``mode`` is
    set when the temporary file is created, so a secret is never readable by others, even briefly.

    ``exclusive``: only if ``path`` does not exist yet (the move is a hard link, which fails on an
    existing name); returns False, writing nothing, when another writer was first. Two processes
    that both find no secret thus agree on one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
    if not exclusive:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def _pointed_at(folder: Path, path: Path) -> Path:
    """Where a policy pointer in ``folder`` points. New pointers are relative to their folder.
    Older ones hold a path relative to the folder their run was started in, or an absolute one:
    the version's folder beside the pointer wins, so the run reads it from any working folder and a
    copied or moved log_dir serves its own copy, not the original's."""
    if not path.is_absolute() and (folder / path).exists():
        return folder / path
    beside = folder / path.name
    if beside.is_dir():
        return beside
    return path if path.is_absolute() else folder / path


@dataclass(frozen=True)
class PublishedPolicy:
    """What :data:`POLICY_POINTER` says: the newest policy version, where it is, and the training
    step it was exported at (None in a pointer written before the step was recorded)."""

    version: int
    path: Path
    step: int | None = None


@dataclass(frozen=True)
class RunDir:
    """The layout of one run's ``log_dir``."""

    root: Path

    @classmethod
    def of(cls, cfg: Config) -> RunDir:
        """The run directory named by ``[global] log_dir``."""
        return cls(Path(cfg.global_.log_dir))

    def problem(self) -> str | None:
        """What stops this folder from holding a run, found without leaving anything behind (the dry
        run's check): it or a folder above it is a file, it cannot be created or written, or its store
        file is no store."""
        problem = folder_problem(self.root) or store_problem(self.store)
        if problem is None and self.store.is_file() and not os.access(self.store, os.W_OK):
            problem = f"{self.store} is read-only: a run writes every turn to it; make it writable"
        return problem

    def mode_problem(self, mode: str) -> str | None:
        """Why this folder cannot go on in ``[users] mode`` = ``mode``: it trained in the other mode
        (one shared policy, or each user's adapter), which this mode would neither serve nor go on
        training, and whose trained samples it would train again. None when it agrees, or is new."""
        shared = sorted(self.checkpoints.glob("step_*"))
        users_root = self.checkpoints / "users"
        users = (
            sorted(p.name for p in users_root.iterdir() if any(p.glob("step_*")))
            if users_root.is_dir()
            else []
        )
        if mode == "per_user" and shared:
            return (
                f'[users] mode = "per_user", but {self.root} trained one shared policy ({shared[-1].name}): '
                "per_user mode trains each user's adapter from the base and would neither serve nor go on "
                'training it. Keep mode = "shared" for this log_dir, or give the per_user run a new '
                "[global] log_dir"
            )
        if mode == "shared" and users:
            return (
                f'[users] mode = "shared", but {self.root} trained per-user adapters ({", ".join(users[:5])}'
                f"{', ...' if len(users) > 5 else ''}): shared mode would train one policy over them and "
                'train their samples again. Keep mode = "per_user" for this log_dir, or give the shared '
                "run a new [global] log_dir"
            )
        return None

    def prepare(self) -> str | None:
        """After :meth:`problem` found nothing: create the folder and prove it takes a write and has
        room for checkpoints; what is wrong, or None. Every command that writes a run calls both
        first, so a bad log_dir is one message, not a crash later."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # people's words: the owner's
            probe = self.root / ".write_probe"
            probe.write_bytes(b"x" * 4096)
            probe.unlink()
        except OSError as exc:
            return f"[global] log_dir = {str(self.root)!r} is not writable: {exc.strerror or exc}"
        free = free_bytes(self.root)
        if free < MIN_FREE_BYTES:
            return (
                f"[global] log_dir = {str(self.root)!r}: only {free // 2**20} MiB free; checkpoints need more"
            )
        return None

    def holder(self) -> int | None:
        """The PID of the launcher running a run in this folder now (0 when it named none), or None
        (the dry run's check; it takes nothing)."""
        try:  # read-write: on NFS flock is a POSIX write lock, which a read-only file cannot take
            fd = os.open(self.root / RUN_LOCK, os.O_RDWR)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_in(fd)
        except OSError:  # no flock on this file system
            return None
        finally:
            os.close(fd)
        return None

    def busy(self) -> str | None:
        """The message for a folder another run is using now (:meth:`holder`), else None."""
        pid = self.holder()
        return None if pid is None else self.in_use(pid)

    def in_use(self, pid: int) -> str:
        """The message for a folder that another run holds."""
        who = f" (pid {pid})" if pid else ""
        if pid and not process_alive(pid):  # its launcher was killed; its loops hold the lock as they stop
            who = (
                f" (its launcher, pid {pid}, has exited and its loops are still stopping: try again shortly)"
            )
        return (
            f"[global] log_dir = {str(self.root)!r} is in use by another run{who}: two runs on one "
            "folder would train the same samples twice and refuse each other's weight swaps; stop "
            "that run first, or give this one its own log_dir"
        )

    def hold(self) -> RunLock | str:
        """Take this folder for this process's run (after :meth:`prepare`): the lock, or a message
        naming the run that holds it."""
        path = self.root / RUN_LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            return f"[global] log_dir = {str(self.root)!r}: cannot create {RUN_LOCK}: {exc.strerror or exc}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            os.close(fd)
            return self.in_use(pid)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                print(
                    f"warning: {path}: this file system has no flock; nothing stops a second run on "
                    "this log_dir, so start only one",
                    file=sys.stderr,
                )
                return RunLock(None)
            return f"[global] log_dir = {str(self.root)!r}: cannot lock {RUN_LOCK}: {exc.strerror or exc}"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # the PID is for people's messages; the lock is what counts
            print(
                f"warning: {path}: cannot write this run's PID into it: {exc.strerror or exc}",
                file=sys.stderr,
            )
        return RunLock(fd)

    @property
    def store(self) -> Path:
        """The durable store (SQLite, WAL) every loop shares."""
        return self.root / "store.sqlite"

    def store_identity(self) -> tuple[int, int] | None:
        """The store file's (device, inode), or None when there is none: what :meth:`store_gone`
        compares against."""
        try:
            st = self.store.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def store_gone(self, identity: tuple[int, int] | None) -> str | None:
        """Why the run cannot go on, when the store it started with (``identity``) was removed or
        replaced under it (``rm -rf`` of the run's folder): its loops would keep writing to a deleted
        file, and a restarted loop would start an empty store beside them. None while it is there."""
        now = self.store_identity()
        if identity is None or now == identity:
            return None
        what = "removed" if now is None else "replaced by another file"
        return (
            f"the run's store {self.store} was {what} while the run was going (was {self.root} deleted?); "
            "its loops were writing to a file no one can read any more, so the run stops; what they "
            "recorded since went with it"
        )

    @property
    def checkpoints(self) -> Path:
        """Trainer checkpoints (weights, optimizer, step), one folder per step."""
        return self.root / "checkpoints"

    @property
    def policies(self) -> Path:
        """Exported policy versions (``v000001`` ...) and the pointer to the newest."""
        return self.root / "policy"

    def policy_dir(self, user: str | None = None) -> Path:
        """Where exported versions and their pointer live: the shared policy's folder, or (per_user
        mode) ``policy/users/<user>`` for one user's adapters — inside the folder the weight routes
        load from."""
        return self.policies if user is None else self.policies / "users" / user

    def published_versions(self, user: str | None = None) -> list[tuple[int, Path]]:
        """Every exported version folder (``v000006``) of the shared policy or of ``user``'s adapter,
        newest first: what serving falls back on when the pointer's folder is gone or damaged."""
        folder = self.policy_dir(user)
        found = [(int(p.name[1:]), p) for p in folder.glob("v*") if p.is_dir() and p.name[1:].isdigit()]
        return sorted(found, reverse=True)

    def prune_policies(self, keep: int, user: str | None = None) -> list[Path]:
        """Remove all but the newest ``keep`` exported versions of the shared policy (``user``: of
        that user's adapter); the version the pointer names is always kept. ``keep = 0`` keeps
        every version. Returns the folders removed."""
        if keep <= 0:
            return []
        published = self.read_published_policy(user)
        named = published.path.resolve() if published is not None else None
        removed = []
        for _, folder in self.published_versions(user)[keep:]:
            if folder.resolve() == named:
                continue
            shutil.rmtree(folder, ignore_errors=True)  # a folder half removed is removed next time
            removed.append(folder)
        return removed

    def user_folders(self, user: str) -> list[Path]:
        """The folders that hold only ``user``'s files (per_user mode): their published adapters and
        their adapter / optimiser checkpoints."""
        return [self.policy_dir(user), self.checkpoints / "users" / user]

    def published_users(self) -> list[str]:
        """Users with at least one published adapter (per_user mode)."""
        root = self.policies / "users"
        if not root.is_dir():
            return []
        return sorted(d.name for d in root.iterdir() if (d / POLICY_POINTER).is_file())

    def read_policy_pointer(self) -> tuple[int, Path] | None:
        """The newest published policy ``(version, path)``, or None before the first publication."""
        published = self.read_published_policy()
        return None if published is None else (published.version, published.path)

    def read_published_policy(self, user: str | None = None) -> PublishedPolicy | None:
        """The newest published policy (``user``: that user's adapter) with its training step, or
        None before the first publication. A pointer without ``step`` (written by an older version)
        reads with ``step = None``."""
        folder = self.policy_dir(user)
        pointer = folder / POLICY_POINTER
        if not pointer.is_file():
            return None
        data = json.loads(pointer.read_text(encoding="utf-8"))
        step = data.get("step")
        path = _pointed_at(folder, Path(data["path"]))
        return PublishedPolicy(int(data["version"]), path, None if step is None else int(step))

    def publish_policy(
        self, version: int, path: Path, step: int | None = None, user: str | None = None, keep: int = 0
    ) -> None:
        """Point :data:`POLICY_POINTER` at ``path`` (atomic: serving never reads half a pointer);
        ``step``: the training step the policy was exported at (the live evaluator spaces its
        evaluations by it); ``user``: publish that user's adapter instead of the shared policy;
        ``keep``: then keep only the newest ``keep`` versions (``[training] keep_policies``; 0 = all)."""
        folder = self.policy_dir(user)
        folder.mkdir(parents=True, exist_ok=True)
        # Relative to the pointer's own folder: the run reads the same weights from whatever folder it
        # is started in, and a copied or moved log_dir serves its own copy, not the original's.
        inside = path.resolve().is_relative_to(folder.resolve())
        stored = path.resolve().relative_to(folder.resolve()) if inside else path.resolve()
        data: dict[str, object] = {"version": version, "path": str(stored)}
        if step is not None:
            data["step"] = step
        atomic_write_text(folder / POLICY_POINTER, json.dumps(data))
        self.prune_policies(keep, user)

    @property
    def admin_key_file(self) -> Path:
        """The run's admin secret (mode 0600): the key of the policy service's admin routes."""
        return self.root / "admin.key"

    def new_admin_key(self) -> str:
        """Make a fresh admin secret for this run (the launcher does, before it starts any loop)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        atomic_write_text(self.admin_key_file, key, mode=0o600)
        return key

    def admin_key(self) -> str:
        """The run's admin secret; made now if this run has none yet (a policy service started
        on its own, without the launcher)."""
        return self._secret(self.admin_key_file)

    @property
    def client_key_file(self) -> Path:
        """The client key a policy service on a public address makes when no ``api_key`` is set
        (mode 0600); kept across restarts, so configured clients keep working (delete it to rotate)."""
        return self.root / "client.key"

    def client_key(self, pol: PolicyServiceConfig) -> str | None:
        """The key clients of the policy service must send: ``[policy_service] api_key``, else the
        generated client key (made now if there is none, see :func:`generates_client_key`), else
        None (a loopback or declared-open endpoint)."""
        if pol.api_key is not None and pol.api_key.get_secret_value():
            return pol.api_key.get_secret_value()
        if generates_client_key(pol):
            return self._secret(self.client_key_file)
        return None

    def _secret(self, path: Path) -> str:
        """The secret in ``path``, made (random, mode 0600) if there is none. Processes that race to
        make it agree on one: the first exclusive write wins and the others read it."""
        for _ in range(50):
            try:
                key = path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                key = ""
            if key:
                return key
            if path.exists():  # created but empty: someone else's write, or a broken file
                time.sleep(0.01)
                continue
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            key = secrets.token_urlsafe(32)
            if atomic_write_text(path, key, mode=0o600, exclusive=True):
                return key
        raise RuntimeError(f"{path} exists but stays empty; delete it and start again")
