"""``openclaw-rl status``: the run's counters, for a running or a finished run."""

from __future__ import annotations

from openclaw_rl.config import Config
from openclaw_rl.runtime.metrics import read_metrics
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Counters, Store


def progress_line(c: Counters) -> str:
    """The one-line summary the launcher prints while running (and ``status`` prints once)."""
    reward = "n/a" if c.reward_mean is None else f"{c.reward_mean:+.2f}"
    return (f"[progress] turns={c.turns} waiting={c.waiting} judged={c.judged} failed={c.failed} "
            f"samples ready={c.samples_ready} training={c.samples_claimed} trained={c.samples_trained} "
            f"dropped={c.samples_dropped} step={c.trainer_updates} checkpointed={c.trainer_step} "
            f"version={c.policy_version} reward_mean={reward}")


def status_command(cfg: Config) -> int:
    path = RunDir.of(cfg).store
    if not path.is_file():
        print(f"no run found: {path} does not exist")
        return 1
    store = Store(path)
    try:
        print(progress_line(store.counters()))
    finally:
        store.close()
    last = [r for r in read_metrics(cfg.log_dir) if r.get("kind") == "train"][-1:]
    if last:
        r = last[0]
        print(f"[train] last update step={r['step']} loss={r.get('loss', float('nan')):.4g} "
              f"kl={r.get('kl', float('nan')):.4g} clip_frac={r.get('clip_frac', float('nan')):.4g}")
    return 0
