"""Run metrics: one JSONL line per training update plus TensorBoard event files, and the end plot.

Both live under ``log_dir``: ``metrics.jsonl`` (the record ``openclaw-rl status`` reads and the plot
is drawn from) and ``tensorboard/`` (``tensorboard --logdir <log_dir>/tensorboard``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training_curves.png"


class MetricsWriter:
    """Append-only metrics sink; every line is flushed so a crash loses at most the line in flight."""

    def __init__(self, log_dir: Path, tensorboard: bool = True):
        self.path = Path(log_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(log_dir) / "tensorboard"))

    def write(self, step: int, values: dict[str, Any], kind: str = "train") -> None:
        row = {"kind": kind, "step": step, "time": time.time(), **values}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(log_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of ``metrics.jsonl`` (a torn last line from a crash is skipped)."""
    path = Path(log_dir) / METRICS_FILE
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def plot_metrics(log_dir: Path) -> Path | None:
    """Draw reward, kl, clip_frac and (when present) eval score against training step as a PNG."""
    rows = read_metrics(log_dir)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward_mean", "reward (batch mean)"), ("kl", "KL to reference"), ("clip_frac", "clip fraction")]
    if evals:
        panels.append(("score", "eval score"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels, strict=True):
        source = evals if key == "score" else train
        pts = [(r["step"], r[key]) for r in source if isinstance(r.get(key), int | float)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(log_dir) / PLOT_FILE
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
