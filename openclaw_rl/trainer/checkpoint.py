"""One way to publish a directory: checkpoints and exported policies, single-process and FSDP.

A publication of ``root/name`` (:class:`Publication`) goes through these steps:

1. :meth:`Publication.begin` makes an empty temporary sibling, ``root/.{name}.tmp{tag}``;
2. the caller writes into it (under FSDP every rank writes into the same one, so ``tag`` is shared);
3. :meth:`Publication.commit` (one process) flushes it to disk, puts it in place as ``root/name``,
   moves the pointer file (when there is one) to ``name``, and only then removes what it replaced.

A crash at any moment leaves the pointer on a complete directory: the old one until the pointer has
moved, the new one after. Re-publishing an existing name (the same step saved twice, the same policy
version exported again) swaps the two directories in one atomic step (Linux ``renameat2`` with
``RENAME_EXCHANGE``), so ``root/name`` never stops existing. Where the system or the filesystem cannot
swap (another OS, NFS), the pointer first moves to a hard-linked copy of the old directory, so it never
names the directory while that is renamed away; without a pointer the old directory is renamed aside,
the new one renamed in, then the old one removed.

:func:`latest_checkpoint` and :func:`prune_checkpoints` read and tidy a checkpoint root
(``step_XXXXXXXX/`` directories, the ``latest`` pointer); a directory is complete once its
``trainer_state.json`` exists, the file a trainer writes last.

Every change to the filesystem goes through one of the module-level functions :func:`_rename`,
:func:`_exchange`, :func:`_link_copy`, :func:`_remove` and ``atomic_write_text``, so that a test can
crash a publication before or after any one of them (tests/trainer/test_checkpoint.py does).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_rl.config import TrainingConfig
from openclaw_rl.runtime.rundir import atomic_write_text

POINTER_FILE = "latest"
STATE_FILE = "trainer_state.json"
CHECKPOINT_PREFIX = "step_"

# renameat2(2) constants (linux/fcntl.h, linux/fs.h); the Python standard library does not expose the call.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1
# The kernel, the C library or the filesystem cannot swap: fall back to renames, do not fail.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint taken after ``step`` updates: ``step_XXXXXXXX``."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` is a finished checkpoint (its state file, written last, exists)."""
    return (directory / STATE_FILE).is_file()


def read_pointer(pointer: Path) -> str | None:
    """The name the pointer file holds, or None when there is no pointer (or it is empty)."""
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return name or None


# ---------------------------------------------------------------------- filesystem steps


def _rename(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` (``dst`` must not exist): atomic within one filesystem."""
    os.rename(src, dst)


@functools.cache
def _renameat2() -> Any | None:
    """The C library's ``renameat2``, or None where there is none (not Linux, glibc < 2.28)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step; False (nothing changed) where that is not possible."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _link_or_copy(src: str, dst: str) -> None:
    # Published files are never modified in place, so a hard link is as good as a copy, and free.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_copy(src: Path, dst: Path) -> None:
    """A copy of the tree ``src`` at ``dst`` whose files are hard links where the filesystem allows."""
    shutil.copytree(src, dst, copy_function=_link_or_copy)


def _remove(path: Path) -> None:
    """Remove a directory tree; a failure leaves litter that nothing names, never a wrong pointer."""
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    # A rename or a new file is durable only once its directory entry is: fsync the directory itself.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some platforms / filesystems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    """Flush every file and directory under ``directory`` to disk.

    Without it a power loss after the rename could publish a name whose files were still only in
    the page cache, i.e. a checkpoint that is complete by name and empty on disk.
    """
    for here, _dirs, files in os.walk(directory):
        for f in files:
            fd = os.open(os.path.join(here, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(here))


# ---------------------------------------------------------------------- the publication


def _default_tag() -> str:
    return str(os.getpid())


@dataclass(frozen=True)
class Publication:
    """Publishing ``root/name``: :meth:`begin` (temporary directory), write, :meth:`commit`.

    ``tag`` tells temporary directories of different writers apart; the default is this process's
    id. Processes that write into one directory together (FSDP ranks) pass the same ``tag``, and
    exactly one of them calls :meth:`begin` and :meth:`commit`.
    """

    root: Path
    name: str
    tag: str = field(default_factory=_default_tag)

    @property
    def final(self) -> Path:
        """Where the directory is published: ``root/name``."""
        return self.root / self.name

    @property
    def tmp(self) -> Path:
        """The temporary directory written before the rename (hidden: never taken for a checkpoint)."""
        return self.root / f".{self.name}.tmp{self.tag}"

    @property
    def _aside(self) -> Path:
        # Where the replaced directory waits, without a swap, until the pointer has moved.
        return self.root / f".{self.name}.old{self.tag}"

    @property
    def _stand_in(self) -> Path:
        # What the pointer names, without a swap, while root/name is being replaced.
        return self.root / f".{self.name}.prev{self.tag}"

    def begin(self) -> Path:
        """Create the empty temporary directory (first removing one left by an earlier crash); returns it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        return self.tmp

    def commit(self, pointer: Path | None = None) -> Path:
        """Put the written temporary directory in place as ``root/name``, point ``pointer`` at it.

        The replaced directory (same name published before) is removed only after the pointer has
        moved. ``pointer`` is a file next to the published directories holding one name; at every
        moment it names a complete directory. Returns ``root/name``.
        """
        if not self.tmp.is_dir():
            raise FileNotFoundError(f"{self.tmp}: nothing to publish (call begin() and write first)")
        _fsync_tree(self.tmp)
        final = self.final
        replaced: Path | None = None  # the previous root/name, wherever it now is
        stand_in: Path | None = None
        if not final.exists():
            _rename(self.tmp, final)
        elif _exchange(self.tmp, final):
            replaced = self.tmp  # the old directory now lives under the temporary name
        else:
            if pointer is not None and read_pointer(pointer) == self.name:
                # The pointer names the directory about to be renamed away: have it name a copy of
                # that directory meanwhile, so it never names a missing one.
                stand_in = self._stand_in
                if stand_in.exists():
                    _remove(stand_in)
                _link_copy(final, stand_in)
                _fsync_tree(stand_in)
                self._point(pointer, stand_in.name)
            replaced = self._aside
            if replaced.exists():
                _remove(replaced)
            _rename(final, replaced)
            _rename(self.tmp, final)
        _fsync_dir(self.root)
        if pointer is not None:
            self._point(pointer, self.name)
        for old in (replaced, stand_in):
            if old is not None:
                _remove(old)
        return final

    def _point(self, pointer: Path, name: str) -> None:
        atomic_write_text(pointer, name + "\n")
        _fsync_dir(pointer.parent)  # atomic_write_text flushes the file; this makes its rename durable


def publish(
    root: Path,
    name: str,
    write: Callable[[Path], None],
    *,
    pointer: Path | None = None,
    tag: str | None = None,
) -> Path:
    """Publish ``root/name`` in one call: :meth:`Publication.begin`, ``write(tmp)``, :meth:`Publication.commit`.

    ``write`` fills the (existing, empty) temporary directory it is given. If it raises, nothing is
    published and the temporary directory stays behind, hidden, for the next attempt to clear.
    """
    pub = Publication(Path(root), name) if tag is None else Publication(Path(root), name, tag)
    write(pub.begin())
    return pub.commit(pointer)


# ---------------------------------------------------------------------- a checkpoint root


def _complete_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(f"{CHECKPOINT_PREFIX}*") if is_complete(p))


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint the ``latest`` pointer names, or the newest complete ``step_*`` one if the
    pointer is missing or names nothing complete; None when there is none.

    Temporary directories of interrupted writes are hidden (``.step_*``) and never chosen unless the
    pointer names one (the stand-in copy of a publication interrupted without a swap)."""
    name = read_pointer(root / POINTER_FILE)
    if name is not None and is_complete(root / name):
        return root / name
    done = _complete_checkpoints(root)
    return done[-1] if done else None


def prune_checkpoints(root: Path, keep_name: str, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints, ``keep_name`` and the pointer's choice; remove
    the hidden leftovers of interrupted publications. Only the process that publishes calls it."""
    named = {keep_name, read_pointer(root / POINTER_FILE)}
    done = _complete_checkpoints(root)
    for p in done[:-keep] if keep > 0 else done:
        if p.name not in named:
            _remove(p)
    # After a crash mid-publication, a hidden directory may hold a whole old checkpoint (the swapped-out
    # one, the stand-in copy) or a partial write; nothing reads them, and they would fill the disk.
    for p in root.glob(f".{CHECKPOINT_PREFIX}*"):
        if p.is_dir() and p.name not in named:
            _remove(p)


def base_model_name(model: str) -> str:
    """The folder name a base model resolves to: the embedded model's cache folder, else the
    directory's own name (a checkpoint records its base as a path; machines differ in where it is)."""
    from openclaw_rl.runtime.models import EMBEDDED_FOLDER, EMBEDDED_NAMES

    if model.lower() in EMBEDDED_NAMES:
        return EMBEDDED_FOLDER
    return Path(model).expanduser().resolve().name


def _state(ckpt: Path) -> dict[str, Any] | None:
    """A checkpoint's ``trainer_state.json``, or None when it cannot be read (resuming says why)."""
    try:
        state = json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def config_mismatch(ckpt: Path, tc: TrainingConfig) -> str | None:
    """Why the checkpoint ``ckpt`` cannot go on training under ``[training]`` = ``tc``: another
    ``lora`` setting, or a changed rank or target list (no longer fits its adapter) or alpha (rescales
    what it learned). None when they agree, or the checkpoint cannot be read (resuming says so)."""
    state = _state(ckpt)
    if state is None:
        return None
    if bool(state.get("lora")) != tc.lora:
        saved_lora = str(bool(state.get("lora"))).lower()
        return f"checkpoint {ckpt} was saved with lora = {saved_lora} but [training] lora = {str(tc.lora).lower()}"
    if not tc.lora:
        return None
    try:
        saved = json.loads((ckpt / "policy" / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    changed = []
    if saved.get("r") is not None and saved["r"] != tc.lora_rank:
        changed.append(f"lora_rank = {tc.lora_rank} (the checkpoints: {saved['r']})")
    if saved.get("lora_alpha") is not None and saved["lora_alpha"] != tc.lora_alpha:
        changed.append(f"lora_alpha = {tc.lora_alpha} (the checkpoints: {saved['lora_alpha']})")
    targets = tc.lora_target_modules
    if isinstance(saved.get("target_modules"), list) and set(saved["target_modules"]) != set(targets):
        changed.append(
            f"lora_target_modules = {sorted(targets)} (the checkpoints: {sorted(saved['target_modules'])})"
        )
    if not changed:
        return None
    return (
        f"[training] {'; '.join(changed)}: this run's adapter was trained with the checkpoints' "
        f"settings ({ckpt.name}), and a LoRA's shape and scale cannot change under it. Set them back, "
        "or start a new run in another [global] log_dir"
    )


def base_mismatch(ckpt: Path, model: str) -> str | None:
    """A warning when the checkpoint ``ckpt`` was trained on another base model than ``model``
    names (its adapter would be applied to weights it never saw); None when they agree."""
    state = _state(ckpt)
    saved = state.get("base_model") if state is not None else None
    if not isinstance(saved, str) or Path(saved).name == base_model_name(model):
        return None
    return (
        f"[policy_service] model = {model!r}, but checkpoint {ckpt.name} was trained on the base "
        f"{saved}: what it learned goes on under weights it never saw; set the model back, or start a "
        "new run in another [global] log_dir"
    )


def damage(ckpt: Path) -> str | None:
    """What makes the checkpoint ``ckpt`` unreadable, checked cheaply (its state file and its weight
    files' headers, not the weights), or None; the dry run's check before a resume."""
    from safetensors import safe_open

    try:
        json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))
        for f in sorted((ckpt / "policy").glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as handle:
                handle.keys()
    except Exception as exc:  # whatever the reader raises (safetensors, json, OS), its words are the detail
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return (
            f"checkpoint {ckpt} cannot be read ({type(exc).__name__}: {detail}); move it aside to resume "
            "from the one before"
        )
    return None
