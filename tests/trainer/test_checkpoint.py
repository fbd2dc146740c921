"""Publishing checkpoints and exports (openclaw_rl/trainer/checkpoint.py): a crash at every step of a
publication, for the helper alone, the single-process trainer and the FSDP trainer (2 processes on
CPU, rank 0 killed with SIGKILL), always leaves ``latest`` on a complete checkpoint that resumes.

A :class:`FaultInjector` wraps the helper's filesystem steps (renames, the swap, copies, removals,
the pointer write). A dry run lists the steps of one publication; then, for every k, a fresh run
crashes just before step k. Throughout, before and after every step, the pointer must name a
complete directory: that is what "never on a missing directory" means, checked, not assumed.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from openclaw_rl.trainer import checkpoint
from openclaw_rl.trainer.checkpoint import (
    POINTER_FILE,
    STATE_FILE,
    is_complete,
    latest_checkpoint,
    prune_checkpoints,
    publish,
    read_pointer,
)

# The helper's steps that change the filesystem; each is a module-level name a test can replace.
OPS = ("_rename", "_exchange", "_link_copy", "_remove", "atomic_write_text")


class Crash(RuntimeError):
    """The simulated crash: raised in the middle of a publication, caught by nothing in it."""


def _raise_crash() -> None:
    raise Crash("simulated crash")


class FaultInjector:
    """Wraps :data:`OPS` in :mod:`openclaw_rl.trainer.checkpoint`: records each call in ``ops``, runs
    ``invariant`` before and after each, and calls ``crash`` instead of the ``crash_at``-th one."""

    def __init__(
        self,
        crash_at: int | None = None,
        crash: Callable[[], None] = _raise_crash,
        invariant: Callable[[], None] | None = None,
    ):
        self.crash_at = crash_at
        self.crash = crash
        self.invariant = invariant or (lambda: None)
        self.ops: list[str] = []

    def install(self, set_attr: Callable[[Any, str, Any], None] = setattr) -> None:
        """Replace the helper's steps (``set_attr`` is monkeypatch.setattr in-process, setattr in a child)."""
        for name in OPS:
            set_attr(checkpoint, name, self._wrap(name, getattr(checkpoint, name)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            self.invariant()
            if len(self.ops) == self.crash_at:
                self.crash()
            self.ops.append(name)
            out = real(*args, **kwargs)
            self.invariant()
            return out

        return step


def assert_pointer_names_a_complete_directory(root: Path) -> None:
    """The invariant: once ``latest`` exists, it names a complete directory."""
    name = read_pointer(root / POINTER_FILE)
    assert name is not None, f"{root}: no pointer"
    assert is_complete(root / name), f"{root}: the pointer names {name!r}, which is not a complete directory"


def switch_point(ops: list[str], swapped: bool) -> int:
    """The index of the step that makes the pointer's directory the new one: a crash before it (or at
    it) keeps the old checkpoint, a crash after it the new one. With a swap of the same name that is
    the swap itself (the pointer already names that name); otherwise the final pointer write."""
    if swapped and "_exchange" in ops:
        return ops.index("_exchange")
    return max(i for i, op in enumerate(ops) if op == "atomic_write_text")


def _no_exchange(a: Path, b: Path) -> bool:
    return False  # as on a system or filesystem without renameat2's RENAME_EXCHANGE


# ---------------------------------------------------------------------- the helper alone (fast)


def _fill(directory: Path, marker: str) -> None:
    """A fake checkpoint: a payload, then the state file (last, as the trainers write it)."""
    (directory / "payload.bin").write_text(marker)
    (directory / "sub").mkdir()
    (directory / "sub" / "more.bin").write_text(marker)
    (directory / STATE_FILE).write_text(json.dumps({"marker": marker}))


def _marker(directory: Path) -> str:
    """The marker of a fake checkpoint, after checking that its files all belong to one write."""
    state = json.loads((directory / STATE_FILE).read_text())["marker"]
    assert (directory / "payload.bin").read_text() == state == (directory / "sub" / "more.bin").read_text()
    return state


def _publish_fake(root: Path, name: str, marker: str, tag: str | None = None) -> Path:
    final = publish(root, name, lambda d: _fill(d, marker), pointer=root / POINTER_FILE, tag=tag)
    prune_checkpoints(root, name, keep=3)
    return final


@pytest.mark.parametrize("same_name", [False, True], ids=["next_step", "same_step"])
@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "rename_fallback"])
def test_a_crash_at_any_step_of_a_publication_leaves_the_pointer_on_a_complete_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool, same_name: bool
) -> None:
    if not swap:
        monkeypatch.setattr(checkpoint, "_exchange", _no_exchange)
    name = "step_00000003" if same_name else "step_00000004"

    def run(root: Path, crash_at: int | None) -> FaultInjector:
        for step in (1, 2, 3):  # three published checkpoints: the next publication also prunes one
            _publish_fake(root, f"step_{step:08d}", "old")
        inj = FaultInjector(crash_at, invariant=lambda: assert_pointer_names_a_complete_directory(root))
        with monkeypatch.context() as m:
            inj.install(m.setattr)
            if crash_at is None:
                _publish_fake(root, name, "new")
            else:
                with pytest.raises(Crash):
                    _publish_fake(root, name, "new")
        return inj

    ops = run(tmp_path / "dry", None).ops
    assert ops, "the publication made no filesystem step"
    moved = switch_point(ops, swap)
    for k in range(len(ops) + 1):
        root = tmp_path / f"crash{k}"
        run(root, k if k < len(ops) else None)
        latest = latest_checkpoint(root)
        assert latest == root / read_pointer(root / POINTER_FILE), (k, ops)  # not the fallback scan
        assert _marker(latest) == ("new" if k > moved else "old"), (k, ops)
        # The next attempt (a restarted process: another tag) publishes and clears every leftover.
        _publish_fake(root, name, "again", tag="restarted")
        assert _marker(latest_checkpoint(root)) == "again" and latest_checkpoint(root).name == name
        assert not list(root.glob(".step_*")), (k, ops, sorted(p.name for p in root.iterdir()))
        assert len(list(root.glob("step_*"))) == 3


def test_the_steps_of_a_publication(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What each path does, so that the crash tests above really cover the swap and the fallback."""
    if checkpoint._renameat2() is None:
        pytest.skip("no renameat2 on this system")
    for step in (1, 2):
        _publish_fake(tmp_path / "a", f"step_{step:08d}", "old")

    def steps(root: Path, name: str) -> list[str]:
        inj = FaultInjector()
        with monkeypatch.context() as m:
            inj.install(m.setattr)
            _publish_fake(root, name, "new")
        return inj.ops

    assert steps(tmp_path / "a", "step_00000003") == ["_rename", "atomic_write_text"]
    assert steps(tmp_path / "a", "step_00000003") == ["_exchange", "atomic_write_text", "_remove"]
    monkeypatch.setattr(checkpoint, "_exchange", _no_exchange)
    assert steps(tmp_path / "a", "step_00000003") == [
        "_exchange",
        "_link_copy",
        "atomic_write_text",
        "_rename",
        "_rename",
        "atomic_write_text",
        "_remove",
        "_remove",
    ]
    # The stand-in copy shares the files (hard links): the fallback costs no second copy on disk.
    src = tmp_path / "src"
    src.mkdir()
    _fill(src, "x")
    checkpoint._link_copy(src, tmp_path / "copy")
    assert os.path.samefile(src / "payload.bin", tmp_path / "copy" / "payload.bin")


def test_republishing_without_a_pointer_replaces_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export (no pointer): the second write replaces the first; with the swap the directory
    exists at every step, in the fallback the old one is kept until the new one is in place."""
    root = tmp_path / "policy"
    publish(root, "v000001", lambda d: _fill(d, "first"))
    inj = FaultInjector(invariant=lambda: _marker(root / "v000001"))
    with monkeypatch.context() as m:
        inj.install(m.setattr)
        publish(root, "v000001", lambda d: _fill(d, "second"))
    assert _marker(root / "v000001") == "second" and sorted(p.name for p in root.iterdir()) == ["v000001"]
    monkeypatch.setattr(checkpoint, "_exchange", _no_exchange)
    publish(root, "v000001", lambda d: _fill(d, "third"))
    assert _marker(root / "v000001") == "third" and sorted(p.name for p in root.iterdir()) == ["v000001"]


def test_latest_ignores_interrupted_writes_and_broken_pointers(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    assert latest_checkpoint(root) is None
    _publish_fake(root, "step_00000001", "a")
    _publish_fake(root, "step_00000002", "b")
    (root / ".step_00000003.tmp99").mkdir()  # an interrupted write, even a complete-looking one
    _fill(root / ".step_00000003.tmp99", "c")
    (root / "step_00000004").mkdir()  # a directory without its state file is not a checkpoint
    assert latest_checkpoint(root) == root / "step_00000002"
    (root / POINTER_FILE).write_text("step_99999999\n")  # names nothing: the newest complete one
    assert latest_checkpoint(root) == root / "step_00000002"
    (root / POINTER_FILE).write_text("step_00000001\n")  # the pointer wins over newer directories
    assert latest_checkpoint(root) == root / "step_00000001"
    (root / POINTER_FILE).unlink()
    assert latest_checkpoint(root) == root / "step_00000002"


def test_a_failing_write_publishes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _publish_fake(root, "step_00000001", "a")

    def half(d: Path) -> None:
        (d / "payload.bin").write_text("half")
        raise Crash("disk full")

    with pytest.raises(Crash):
        publish(root, "step_00000002", half, pointer=root / POINTER_FILE)
    assert latest_checkpoint(root) == root / "step_00000001" and not (root / "step_00000002").exists()
    _publish_fake(root, "step_00000002", "b")  # the same process tries again: the stale temp is replaced
    assert _marker(latest_checkpoint(root)) == "b" and not list(root.glob(".step_*"))


# ---------------------------------------------------------------------- the single-process trainer


def _weights(trainer: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.params]


def _perturb(trainer: Any) -> None:
    with torch.no_grad():
        for p in trainer.params:
            p.add_(0.25)


@pytest.mark.slow
@pytest.mark.parametrize("same_step", [False, True], ids=["next_step", "same_step"])
@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "rename_fallback"])
def test_a_trainer_crashing_at_any_step_of_a_checkpoint_resumes_a_complete_one(
    make_cfg: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool, same_step: bool
) -> None:
    from openclaw_rl.trainer.ppo import Trainer

    if not swap:
        monkeypatch.setattr(checkpoint, "_exchange", _no_exchange)
    cfg = make_cfg()
    writer, reader = Trainer(cfg, cfg.policy_service.model), Trainer(cfg, cfg.policy_service.model)

    def run(root: Path, crash_at: int | None) -> tuple[FaultInjector, list[torch.Tensor], list[torch.Tensor]]:
        writer.checkpoint_root = root
        writer.step, writer.policy_version = 1, 1
        writer.save_checkpoint()
        old = _weights(writer)
        _perturb(writer)
        writer.step, writer.policy_version = (1 if same_step else 2), 2
        inj = FaultInjector(crash_at, invariant=lambda: assert_pointer_names_a_complete_directory(root))
        with monkeypatch.context() as m:
            inj.install(m.setattr)
            if crash_at is None:
                writer.save_checkpoint()
            else:
                with pytest.raises(Crash):
                    writer.save_checkpoint()
        return inj, old, _weights(writer)

    ops = run(tmp_path / "dry", None)[0].ops
    moved = switch_point(ops, swap)
    for k in range(len(ops) + 1):
        root = tmp_path / f"crash{k}"
        _inj, old, new = run(root, k if k < len(ops) else None)
        reader.checkpoint_root = root
        latest = reader.latest_checkpoint()
        assert latest is not None and latest == root / read_pointer(root / POINTER_FILE), (k, ops)
        assert reader.resume(), (k, ops)
        fresh = k > moved
        assert (reader.step, reader.policy_version) == ((writer.step, 2) if fresh else (1, 1)), (k, ops)
        assert all(torch.equal(a, b) for a, b in zip(_weights(reader), new if fresh else old, strict=True)), k
        # The retried save (what the restarted trainer does) publishes and clears the leftovers.
        writer.save_checkpoint()
        assert reader.latest_checkpoint() == root / f"step_{writer.step:08d}"
        assert not list(root.glob(".step_*")), (k, ops, sorted(p.name for p in root.iterdir()))


@pytest.mark.slow
def test_a_trainer_crashing_while_writing_keeps_the_previous_checkpoint(
    make_cfg: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from openclaw_rl.trainer.ppo import Trainer

    cfg = make_cfg()
    t = Trainer(cfg, cfg.policy_service.model)
    t.step = 1
    first = t.save_checkpoint()
    t.step = 2

    def boom(*args: Any, **kwargs: Any) -> None:
        raise Crash("killed while writing the optimizer state")

    with monkeypatch.context() as m:
        m.setattr(torch, "save", boom)
        with pytest.raises(Crash):
            t.save_checkpoint()
    # an error while writing removes the half-written copy (on a full disk it would only take more room)
    assert not list(t.checkpoint_root.glob(".step_00000002.tmp*"))
    assert t.latest_checkpoint() == first
    u = Trainer(cfg, cfg.policy_service.model)
    assert u.resume() and u.step == 1


@pytest.mark.slow
def test_run_name_is_in_the_checkpoint_state_and_the_exported_policy(make_cfg: Callable[..., Any]) -> None:
    from openclaw_rl.trainer.ppo import POLICY_META, POLICY_SUBDIR, Trainer

    cfg = make_cfg()
    cfg.global_.run_name = "ckpt-meta.run_7"
    t = Trainer(cfg, cfg.policy_service.model)
    ckpt = t.save_checkpoint()
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["run_name"] == "ckpt-meta.run_7" and state["step"] == 0
    assert json.loads((ckpt / POLICY_SUBDIR / POLICY_META).read_text())["run_name"] == "ckpt-meta.run_7"
    out = t.export_policy(t.checkpoint_root.parent / "exports", 3)
    meta = json.loads((out / POLICY_META).read_text())
    assert meta["run_name"] == "ckpt-meta.run_7" and meta["version"] == 3 and meta["kind"] == "lora"


# ---------------------------------------------------------------------- the FSDP trainer (2 processes)

RUN_NAME = "fsdp-crash"


def _fsdp_raw(model_dir: Path, log_dir: Path) -> dict[str, Any]:
    return {
        "global": {"log_dir": str(log_dir), "seed": 0, "run_name": RUN_NAME},
        "policy_service": {"model": str(model_dir)},
        "training": {
            "backend": "fsdp",
            "lora": True,
            "lr": 1e-2,
            "batch_size": 2,
            "mini_batch_size": 2,
            "kl_coef": 0.01,
            "checkpoint_interval": 1000,
        },
    }


def _exported(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(path / "adapter_model.safetensors")).items()}


# --- code that runs inside the spawned processes (module level: importable by spawn) -------------


def _fsdp_save_then_crash(
    rank: int, world: int, raw: dict[str, Any], same_step: bool, crash_at: int | None, out: str
) -> None:
    """Save step 1; change the weights; save again (step 1 or 2) with rank 0 SIGKILLed before the
    ``crash_at``-th filesystem step of the publication (None: no crash, the steps go to ops.json)."""
    from openclaw_rl.config import build_config
    from openclaw_rl.trainer.fsdp import FSDPTrainer

    trainer = FSDPTrainer(build_config(raw, environ={}), raw["policy_service"]["model"])
    if rank != 0:
        trainer.follow()
        return
    root = trainer.checkpoint_root
    try:
        trainer.step, trainer.policy_version = 1, 1  # only rank 0's step names the checkpoint
        trainer.save_checkpoint()
        trainer.export_policy(Path(out) / "old", 1)
        with torch.no_grad():  # this rank's shards of the adapter: the gathered weights change
            for p in trainer.params:
                (p.to_local() if hasattr(p, "to_local") else p).add_(0.25)
        trainer.step, trainer.policy_version = (1 if same_step else 2), 2
        trainer.export_policy(Path(out) / "new", 2)

        def invariant() -> None:
            try:
                assert_pointer_names_a_complete_directory(root)
            except AssertionError as exc:
                # Leave it for the test to read, and die at once: an exception here would leave the
                # followers waiting in a collective that rank 0 never joins.
                Path(out, "violation.txt").write_text(str(exc))
                os.kill(os.getpid(), signal.SIGKILL)

        inj = FaultInjector(crash_at, crash=lambda: os.kill(os.getpid(), signal.SIGKILL), invariant=invariant)
        inj.install()
        trainer.save_checkpoint()
        Path(out, "ops.json").write_text(json.dumps(inj.ops))
    finally:
        trainer.release_followers()


def _fsdp_resume_each(rank: int, world: int, raws: list[dict[str, Any]], outs: list[str]) -> None:
    """One process: resume every crashed run, export what it loaded, save again (the restart)."""
    from openclaw_rl.config import build_config
    from openclaw_rl.trainer.fsdp import FSDPTrainer

    for raw, out in zip(raws, outs, strict=True):
        trainer = FSDPTrainer(build_config(raw, environ={}), raw["policy_service"]["model"])
        root = trainer.checkpoint_root
        latest = trainer.latest_checkpoint()
        named = read_pointer(root / POINTER_FILE)
        resumed = trainer.resume()
        trainer.export_policy(Path(out) / "resumed", 99)
        state = json.loads((latest / STATE_FILE).read_text()) if latest else {}
        meta = json.loads((latest / "policy" / "openclaw_policy.json").read_text()) if latest else {}
        again = trainer.save_checkpoint()
        Path(out, "resume.json").write_text(
            json.dumps(
                {
                    "latest": str(latest),
                    "named": str(root / named) if named else None,
                    "resumed": resumed,
                    "step": trainer.step,
                    "version": trainer.policy_version,
                    "state": state,
                    "meta": meta,
                    "again": str(again),
                    "latest_after": str(trainer.latest_checkpoint()),
                    "leftovers": sorted(p.name for p in root.glob(".step_*")),
                }
            )
        )


# -------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("same_step", [True, False], ids=["same_step", "next_step"])
def test_fsdp_rank0_killed_at_any_step_of_a_checkpoint_resumes_a_complete_one(
    tiny_model_dir: Path, tmp_path: Path, same_step: bool
) -> None:
    from openclaw_rl.trainer.fsdp import spawn

    def run(name: str, crash_at: int | None) -> tuple[dict[str, Any], Path]:
        out = tmp_path / name
        out.mkdir()
        raw = _fsdp_raw(tiny_model_dir, out / "logs")
        died: Exception | None = None
        try:
            spawn(_fsdp_save_then_crash, 2, raw, same_step, crash_at, str(out))
        except Exception as exc:  # rank 0 killed itself: spawn says so
            died = exc
        assert not (out / "violation.txt").exists(), (out / "violation.txt").read_text()
        if crash_at is None:
            assert died is None, died
        else:
            assert died is not None and "SIGKILL" in str(died), died
        return raw, out

    runs = [run("dry", None)]
    ops = json.loads((runs[0][1] / "ops.json").read_text())
    # Same step: the swap replaces the published directory; next step: a plain rename.
    assert ops[0] == ("_exchange" if same_step else "_rename") and "atomic_write_text" in ops, ops
    runs += [run(f"crash{k}", k) for k in range(len(ops))]
    spawn(_fsdp_resume_each, 1, [r for r, _ in runs], [str(o) for _, o in runs])

    moved = switch_point(ops, swapped=True)
    for k, (_raw, out) in enumerate([*runs[1:], runs[0]]):  # crash 0..n-1, then the run without a crash
        got = json.loads((out / "resume.json").read_text())
        assert got["latest"] == got["named"] and got["resumed"], (k, ops, got)
        fresh = k > moved
        assert (got["step"], got["version"]) == (((1 if same_step else 2), 2) if fresh else (1, 1)), (k, got)
        want = _exported(out / "new" / "v000002" if fresh else out / "old" / "v000001")
        resumed = _exported(out / "resumed" / "v000099")
        for key, v in want.items():
            torch.testing.assert_close(resumed[key], v)
        assert got["state"]["run_name"] == RUN_NAME and got["meta"]["run_name"] == RUN_NAME
        assert got["state"]["backend"] == "fsdp" and got["state"]["num_processes"] == 2
        assert got["latest_after"] == got["again"] and got["leftovers"] == [], got
    # The two saves differed (the test would be blind otherwise).
    old, new = _exported(runs[0][1] / "old" / "v000001"), _exported(runs[0][1] / "new" / "v000002")
    assert any(not torch.equal(old[k], new[k]) for k in old)


def test_resuming_under_another_lora_shape_names_the_keys(make_cfg: Callable[..., Any]) -> None:
    """`openclaw-rl train --resume` after lora_rank / lora_alpha changed: one message naming both
    keys and both values (not a state-dict size error with "move it aside")."""
    from openclaw_rl.trainer.ppo import CheckpointError, Trainer

    cfg = make_cfg(lora_rank=8, lora_alpha=16)
    Trainer(cfg, cfg.policy_service.model).save_checkpoint()
    changed = make_cfg(lora_rank=4, lora_alpha=32)
    with pytest.raises(CheckpointError) as err:
        Trainer(changed, changed.policy_service.model).resume()
    message = str(err.value)
    assert (
        "lora_rank = 4 (the checkpoints: 8)" in message and "lora_alpha = 32 (the checkpoints: 16)" in message
    )
    assert "move it aside" not in message
    same = make_cfg(lora_rank=8, lora_alpha=16)
    assert Trainer(same, same.policy_service.model).resume()
