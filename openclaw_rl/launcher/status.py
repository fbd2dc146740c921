"""``openclaw-rl status``: the run's counters, for a running or a finished run."""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.runtime.metrics import read_metrics
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Counters, SampleStatus, Store, StoreError, store_problem


def progress_line(c: Counters, evaluation: dict[str, Any] | None = None, run_name: str | None = None) -> str:
    """The one-line summary the launcher prints while running (and ``status`` prints once).

    ``evaluation``: the newest live evaluation (:func:`openclaw_rl.launcher.eval_loop.latest_eval`), shown
    as ``eval=0.47 (base 0.34)`` at the end of the line; None before the first one. ``run_name``
    (``[global] run_name``) leads the line, so two runs' lines are told apart.
    """
    reward = "n/a" if c.reward_mean is None else f"{c.reward_mean:+.2f}"
    prefix = f"[progress] run={run_name} " if run_name else "[progress] "
    line = (
        f"{prefix}turns={c.turns} waiting={c.waiting} judged={c.judged} failed={c.failed} "
        f"samples ready={c.samples_ready} training={c.samples_claimed} trained={c.samples_trained} "
        f"dropped={c.samples_dropped} step={c.trainer_updates} checkpointed={c.trainer_step} "
        f"version={c.policy_version} reward_mean={reward}"
    )
    if c.user_adapters:  # per_user mode: the shared version stays 0 while each user's adapter moves on
        line += f" user_adapters={c.user_adapters} (newest v{c.newest_user_version})"
    return line + eval_field(evaluation)


def eval_field(evaluation: dict[str, Any] | None) -> str:
    """`` eval=0.47 (base 0.34)`` for the progress line; empty before the first evaluation."""
    if not evaluation or not isinstance(evaluation.get("score"), int | float):
        return ""
    base = evaluation.get("base_score")
    base_text = "n/a" if not isinstance(base, int | float) else f"{base:.2f}"
    return f" eval={evaluation['score']:.2f} (base {base_text})"


def run_progress_line(cfg: Config, store: Store) -> str:
    """:func:`progress_line` of a run: the store's counters and the newest evaluation in its
    ``metrics.jsonl`` (small: one row per update and per evaluation, so reading it is cheap)."""
    from openclaw_rl.launcher.eval_loop import latest_eval

    return progress_line(store.counters(), latest_eval(cfg.log_dir), cfg.global_.run_name)


def existing_store(cfg: Config) -> Store | None:
    """The run's store, or None (after saying so) when the run has none yet: a read-only command
    must not create an empty store where a user mistyped ``log_dir``."""
    path = RunDir.of(cfg).store
    problem = store_problem(path)
    if problem:
        raise StoreError(problem)  # the CLI's one "error:" line, exit 2, as for every other command
    if not path.is_file():
        # a relative log_dir is read from the folder the command runs in: say which one that was
        where = "" if path.is_absolute() else " ([global] log_dir is read from the current folder)"
        print(f"no run found: {path.absolute()} does not exist{where}")
        return None
    return Store(path)


def _replay_summary(cfg: Config) -> str | None:
    """For a folder an offline replay (``openclaw-rl train --log-dir``) wrote: what it holds. None for
    any other folder (a live run has a store; an empty folder has nothing to say)."""
    run = RunDir.of(cfg)
    if run.store.exists() or run.problem():
        return None
    from openclaw_rl.trainer.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run.checkpoints) if run.checkpoints.is_dir() else None
    published = run.read_published_policy()
    if ckpt is None and published is None:
        return None
    parts = [f"checkpoint {ckpt.name}" if ckpt else "no checkpoint"]
    if published is not None:
        parts.append(f"published policy version {published.version} ({published.path})")
    return f"[status] {run.root}: an offline replay (no live run, so no turns or samples): " + ", ".join(
        parts
    )


def status_command(cfg: Config) -> int:
    """``openclaw-rl status``: the progress line, the last update, and sessions to learn."""
    from openclaw_rl.launcher.eval_loop import learned_line

    replay = _replay_summary(cfg)
    if replay is not None:
        print(replay)
        return 0
    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        print(run_progress_line(cfg, store))
        served = store.get_meta("policy_version", 0)  # what serving wrote when it loaded a version
    finally:
        store.close()
    try:
        published = RunDir.of(cfg).read_published_policy()
    except (OSError, ValueError, KeyError, TypeError):
        published = None  # a damaged pointer: the progress line's served version is what there is
    if published is not None and isinstance(served, int) and published.version > served:
        # the trainer published after serving stopped (a launcher killed, a swap refused): the
        # version the line shows is the one served last, this one the next start serves
        print(
            f"[status] published policy version {published.version} (step {published.step}) is newer "
            f"than the served version {served}; a run started on this log_dir serves it"
        )
    last = [r for r in read_metrics(cfg.log_dir) if r.get("kind") == "train"][-1:]
    if last:
        r = last[0]
        print(
            f"[train] last update step={r['step']} loss={r.get('loss', float('nan')):.4g} "
            f"kl={r.get('kl', float('nan')):.4g} clip_frac={r.get('clip_frac', float('nan')):.4g}"
            + (f" judge_agreement={r['judge_agreement']:.2f}" if "judge_agreement" in r else "")
            + (
                " judge_agreement=n/a (no turn scored apart from its group since the update before)"
                if "judge_agreement" not in r and "truth_mean" in r
                else ""
            )
        )
    learned = learned_line(cfg.log_dir)
    if learned:
        print(learned)
    return 0


def samples_command(cfg: Config, out: str, status: SampleStatus | None) -> int:
    """``openclaw-rl samples --out F.jsonl``: the run's recorded samples (``status``: only those) as
    the JSONL that ``openclaw-rl train --samples`` replays (docs/training.md)."""
    from openclaw_rl.trainer.sample_file import write_samples

    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        samples = store.samples(status)
    finally:
        store.close()
    try:
        path = write_samples(out, samples)
    except OSError as exc:
        print(f"error: --out {out}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
        return 2
    which = f" {status}" if status else ""
    print(f"{len(samples)}{which} sample(s) written to {path}")
    return 0


def _shown(text: str) -> str:
    # a control character (an escape sequence a client put in its session id) is shown, not obeyed
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _columns(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def columns(text: str) -> int:
    """How many terminal columns ``text`` takes as :func:`fit` shows it."""
    return sum(_columns(ch) for ch in _shown(text))


def _head(chars: list[str], width: int) -> tuple[list[str], int]:
    """The first of ``chars`` that fit in ``width`` columns, and the columns they take."""
    out, used = [], 0
    for ch in chars:
        w = _columns(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return out, used


def fit(text: str, width: int) -> str:
    """``text`` padded to ``width`` terminal columns (a CJK character takes two: "我的会话" is 8
    columns wide, so padding by characters would shift the columns after it); a longer one keeps
    its head and its tail around a "…" (a session's ``/auto-...`` tail is what tells it apart)."""
    chars = list(_shown(text))
    whole, used = _head(chars, width)
    if len(whole) == len(chars):
        return "".join(whole) + " " * (width - used)
    tail, tail_used = _head(chars[::-1], (width - 1) // 2)
    head, head_used = _head(chars, width - 1 - tail_used)
    return "".join(head) + "…" + "".join(tail[::-1]) + " " * (width - 1 - head_used - tail_used)


def turns_command(cfg: Config, last: int, user: str | None) -> int:
    """``openclaw-rl turns``: the newest recorded turns, one line each, with the id a client rates
    (``POST /v1/feedback``): clients such as OpenClaw do not show it."""
    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        rows = store.recent_turns(last, user)
    finally:
        store.close()
    if not rows:
        print("no turns recorded" + (f" for user {user!r}" if user is not None else ""))
        return 0
    # whole session ids up to 64 columns: an operator copies them (close_session, feedback by
    # session), and a named user's are `user/auto-...`, whose first 14 columns say little
    # (64 and 32: an opaque gateway user is `idp_...-<hash>`, whose hash is what tells two apart)
    sw = min(64, max(7, *(columns(turn.session_id) for turn, _, _ in rows)))
    uw = min(32, max(4, *(columns(turn.user) for turn, _, _ in rows)))
    print(
        f"{'response id':<38} {'user':<{uw}} {'session':<{sw}} {'turn':>4} {'type':<4} {'v':>3} {'judged':>6}  reply"
    )
    for turn, status, score in rows:
        # a score only while it stands: a turn rated again (feedback) waits for its new judgement
        judged = f"{score:+d}" if status == "judged" and score is not None else status
        reply = " ".join(turn.response_text.split()) or ("(tool call)" if turn.tool_calls else "(empty)")
        print(
            f"{turn.response_id or '-':<38} {fit(turn.user, uw)} {fit(turn.session_id, sw)} "
            f"{turn.turn_index:>4} {turn.turn_type:<4} {turn.policy_version:>3} {judged:>6}  {reply[:60]!r}"
        )
    return 0
