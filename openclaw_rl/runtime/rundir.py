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

Exported policies go to ``policy/`` whether the online training loop or the offline
``openclaw-rl train`` wrote them, and the policy service's weight route loads only from there.

The admin secret (``admin.key``, readable by the owner only) is how the run's own loops reach the
policy service's admin routes (weight swaps, pause, closing sessions): the launcher makes a new one
for each run, and the loops read it from here; it is never the user-facing ``api_key``.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from openclaw_rl.config import Config

#: The file naming the newest published policy version, inside :attr:`RunDir.policies`.
POLICY_POINTER = "latest.json"


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never half of one
    (write a sibling temporary file, then ``os.replace``, which is atomic on POSIX). ``mode`` is set
    when the temporary file is created, so a secret is never readable by others, even briefly."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)


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

    @property
    def store(self) -> Path:
        """The durable store (SQLite, WAL) every loop shares."""
        return self.root / "store.sqlite"

    @property
    def checkpoints(self) -> Path:
        """Trainer checkpoints (weights, optimizer, step), one folder per step."""
        return self.root / "checkpoints"

    @property
    def policies(self) -> Path:
        """Exported policy versions (``v000001`` ...) and the pointer to the newest."""
        return self.root / "policy"

    def read_policy_pointer(self) -> tuple[int, Path] | None:
        """The newest published policy ``(version, path)``, or None before the first publication."""
        published = self.read_published_policy()
        return None if published is None else (published.version, published.path)

    def read_published_policy(self) -> PublishedPolicy | None:
        """The newest published policy with its training step, or None before the first publication.
        A pointer without ``step`` (written by an older version) reads with ``step = None``."""
        pointer = self.policies / POLICY_POINTER
        if not pointer.is_file():
            return None
        data = json.loads(pointer.read_text(encoding="utf-8"))
        step = data.get("step")
        return PublishedPolicy(int(data["version"]), Path(data["path"]), None if step is None else int(step))

    def publish_policy(self, version: int, path: Path, step: int | None = None) -> None:
        """Point :data:`POLICY_POINTER` at ``path`` (atomic: serving never reads half a pointer);
        ``step``: the training step the policy was exported at (the live evaluator spaces its
        evaluations by it)."""
        self.policies.mkdir(parents=True, exist_ok=True)
        data: dict[str, object] = {"version": version, "path": str(path)}
        if step is not None:
            data["step"] = step
        atomic_write_text(self.policies / POLICY_POINTER, json.dumps(data))

    @property
    def admin_key_file(self) -> Path:
        """The run's admin secret (mode 0600): the key of the policy service's admin routes."""
        return self.root / "admin.key"

    def new_admin_key(self) -> str:
        """Make a fresh admin secret for this run (the launcher does, before it starts any loop)."""
        self.root.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(32)
        atomic_write_text(self.admin_key_file, key, mode=0o600)
        return key

    def admin_key(self) -> str:
        """The run's admin secret; made now if this run has none yet (a policy service started
        on its own, without the launcher). Two processes that both find none agree on one: the
        file is created exclusively, and the loser reads the winner's."""
        for _ in range(50):
            try:
                key = self.admin_key_file.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                key = ""
            if key:
                return key
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.admin_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                time.sleep(0.01)  # another process is writing it; read it on the next pass
                continue
            key = secrets.token_urlsafe(32)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(key)
            return key
        raise RuntimeError(f"{self.admin_key_file} exists but stays empty; delete it and start again")
