"""Offline replay: ``openclaw-rl train --config FILE --samples FILE.jsonl [--steps N] [--resume]``.

Trains on recorded samples without any service running — the simplest way to exercise the engine
and a way to re-train from a run's recorded samples. Updates take ``batch_size`` samples at a time,
cycling through the file (epochs). ``--steps N`` is the *total* number of updates the run should
reach, so a resumed run continues to N rather than adding N more; without it the run does
``[training] max_steps`` updates or, if unset, one pass over the file. A checkpoint is saved every
``checkpoint_interval`` updates and at the end (also on Ctrl-C), and the final policy is exported
to ``{log_dir}/policy/`` (the run directory's one folder of exported policies) and published there:
``openclaw-rl serve [--log-dir DIR]`` or a run on that ``log_dir`` serves it.

Without ``--resume`` the replay starts from the base model, so a ``log_dir`` that already holds
checkpoints (a run's) is refused rather than overwritten; ``--log-dir`` trains into another folder.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from typing import TYPE_CHECKING

from openclaw_rl.config import Config
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.trainer.sample_file import SampleFileError, numbered_samples
from openclaw_rl.types import Sample

if TYPE_CHECKING:
    from openclaw_rl.trainer.ppo import Trainer


def train_command(cfg: Config, samples_path: str, steps: int | None, resume: bool) -> int:
    """Run offline replay; returns a process exit code (0 ok, 2 bad input, 130 stopped)."""
    try:
        numbered = numbered_samples(samples_path)
    except SampleFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    samples = [sample for _, sample in numbered]
    lines = [f"{samples_path}:{lineno} ({sample.sample_id})" for lineno, sample in numbered]
    if not samples:
        print(f"error: {samples_path}: no samples in file", file=sys.stderr)
        return 2
    if steps is not None and steps < 1:
        print(f"error: --steps must be >= 1, got {steps}", file=sys.stderr)
        return 2
    run = RunDir.of(cfg)
    problem = run.problem() or run.prepare() or (None if resume else _holds_a_run(run))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    lock = run.hold()  # a replay beside a live run would train and checkpoint over it
    if isinstance(lock, str):
        print(f"error: {lock}", file=sys.stderr)
        return 2
    # SIGTERM (kill, timeout, a job scheduler) stops a replay as Ctrl-C does: checkpointed and
    # published, not lost since the last checkpoint
    previous = (
        signal.signal(signal.SIGTERM, _interrupt)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        return _replay(cfg, run, samples, lines, steps, resume)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        lock.release()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _replay(
    cfg: Config, run: RunDir, samples: list[Sample], lines: list[str], steps: int | None, resume: bool
) -> int:
    """The replay itself, on a folder held for it. ``lines``: each sample's file and line."""
    tc = cfg.training
    from openclaw_rl.trainer.ppo import CheckpointError, Trainer

    try:
        trainer = Trainer(cfg, cfg.policy_service.model)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # the whole file, before any update: a bad line 900 must not half-train a run
        trainer.check_samples(samples, lines)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    window = cfg.policy_service.max_model_len
    longest = max(range(len(samples)), key=lambda i: samples[i].num_tokens)
    if samples[longest].num_tokens > window:
        print(
            f"[training] warning: {lines[longest]} has {samples[longest].num_tokens} tokens, more than "
            f"[policy_service] max_model_len = {window}: the policy never saw such a prompt, and its "
            "update needs memory in proportion",
            flush=True,
        )
    print(
        f"[training] algorithm={tc.algorithm}, asymmetric_clip={str(tc.asymmetric_clip).lower()}, "
        f"opd_enabled={str(tc.opd_enabled).lower()}, lora={str(tc.lora).lower()}, "
        f"samples={len(samples)}",
        flush=True,
    )
    if resume:
        try:
            resumed = trainer.resume()
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if resumed:
            print(
                f"[training] resumed at step={trainer.step}, policy_version={trainer.policy_version}",
                flush=True,
            )
        else:
            print(f"[training] no checkpoint under {trainer.checkpoint_root}; starting fresh", flush=True)
    target = steps or tc.max_steps or math.ceil(len(samples) / tc.batch_size)
    published = run.read_published_policy()
    if trainer.step >= target and published is not None and (published.step or 0) >= trainer.step:
        # nothing to train, and what the checkpoint holds is already published: no new version
        print(
            f"[training] already at step={trainer.step} (target {target}); nothing to train, "
            f"version {published.version} stays the newest. Ask for more with --steps N > {trainer.step}",
            flush=True,
        )
        return 0
    bs = min(tc.batch_size, len(samples))
    try:
        while trainer.step < target:
            # Continue the replay where the previous (possibly resumed) run left off.
            start = (trainer.step * bs) % len(samples)
            batch = [samples[(start + j) % len(samples)] for j in range(bs)]
            try:
                trainer.train_update(batch)
            except ValueError as exc:  # what only a batch shows (top-K sizes across samples)
                print(f"error: {lines[start]} and the {bs - 1} after it: {exc}", file=sys.stderr)
                return 2
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False
    finally:
        # On success, Ctrl-C or a crash: keep what was learned so far.
        if trainer.step > 0:
            trainer.save_checkpoint_once()
    if interrupted:
        if trainer.step == 0 or (published is not None and (published.step or 0) >= trainer.step):
            print(f"[training] stopped at step={trainer.step}; nothing new to publish", flush=True)
            return 130
        version = _publish(cfg, run, trainer)
        print(
            f"[training] stopped at step={trainer.step}; checkpoint kept, published version {version}",
            flush=True,
        )
        return 130
    version = _publish(cfg, run, trainer)
    print(
        f"[training] done: step={trainer.step}, exported and published version {version}: "
        f"{run.policies / f'v{version:06d}'}",
        flush=True,
    )
    return 0


def _publish(cfg: Config, run: RunDir, trainer: Trainer) -> int:
    """Export and publish the trained policy; its version. The next after the folder's newest
    publish, as the live loop counts them: a resumed replay never re-exports over a version a
    service may be serving."""
    published = run.read_published_policy()
    version = (published.version if published else 0) + 1
    out = trainer.export_policy(run.policies, version)
    run.publish_policy(version, out, step=trainer.step, keep=cfg.training.keep_policies)
    return version


def _holds_a_run(run: RunDir) -> str | None:
    """Why replaying from the base model into ``run`` would overwrite a run's state, or None."""
    from openclaw_rl.trainer.checkpoint import latest_checkpoint

    existing = latest_checkpoint(run.checkpoints)
    per_user = run.checkpoints / "users"
    if existing is not None:
        what = f"{run.checkpoints} already holds checkpoints (the newest: {existing.name})"
    elif per_user.is_dir() and any(per_user.iterdir()):
        what = f"{per_user} already holds per-user checkpoints"
    elif run.read_published_policy() is not None or run.published_users():
        what = f"{run.policies} already holds published policies"
    elif run.store.is_file():  # a live run that has not checkpointed yet would resume from the replay
        what = f"{run.root} already holds a run's store"
    else:
        return None
    return (
        f"{what}; training from the base model would overwrite or outrank them. Pass --resume to "
        "continue from the checkpoints, or --log-dir DIR to train into another folder."
    )
