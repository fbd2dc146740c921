"""Run metrics: one JSONL line per training update (and per live evaluation) plus TensorBoard event
files, and the end plot.

Both live under ``log_dir``: ``metrics.jsonl`` (the record ``openclaw-rl status`` reads and the plot
is drawn from) and ``tensorboard/<run_name>/`` (``tensorboard --logdir <log_dir>/tensorboard``). Rows carry a
``kind``: ``"train"`` (the trainer, one per update) or ``"eval"`` (the evaluator, one per evaluated
policy version; see :mod:`openclaw_rl.launcher.eval_loop`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training_curves.png"


#: Tokens per run of a repetition (``repeat_frac``, ``[training] opd_repeats``): eight tokens come
#: back in prose only in set phrases.
REPEAT_WINDOW = 8


def _repeat_starts(items: Sequence[Hashable], window: int) -> list[bool]:
    """For each run of ``window`` consecutive items, whether the same run occurred earlier."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    seen: set[tuple[Hashable, ...]] = set()
    starts = []
    for i in range(len(items) - window + 1):
        run = tuple(items[i : i + window])
        starts.append(run in seen)
        seen.add(run)
    return starts


def repeat_share(items: Sequence[Hashable], window: int) -> float:
    """The share of ``items``' runs of ``window`` consecutive items that repeat an earlier run.

    Near 0 for prose; close to 1 for a reply that says one thing over and over ("The answer is not
    available." eight times). 0 for fewer than ``2 * window`` items. One measure for two readers:
    the trainer over a response's token ids, the chat persona over its words.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(items) < 2 * window:
        return 0.0
    starts = _repeat_starts(items, window)
    return sum(starts) / len(starts)


def repeated_items(items: Sequence[Hashable], window: int) -> list[bool]:
    """Per item, whether it lies in a run of ``window`` items that repeats an earlier run of the
    same sequence: in "A B C D, A B C D" (window 4) the second "A B C D", its first item included
    (where the repetition was chosen)."""
    out = [False] * len(items)
    for i, repeats in enumerate(_repeat_starts(items, window)):
        if repeats:
            out[i : i + window] = [True] * window
    return out


class MetricsWriter:
    """Append-only metrics sink; every line is on disk when :meth:`write` returns, so a crash loses at
    most the line in flight.

    Several processes append to the same ``metrics.jsonl`` (the trainer and the evaluator): each row
    goes out as one ``write(2)`` on a descriptor opened with ``O_APPEND``, which the kernel positions
    at the end of the file atomically, so two writers' rows never interleave or overwrite each other.
    (A buffered text file could split a long row into several writes.) TensorBoard event files are
    per process (their names carry the pid), so the writers share ``tensorboard/`` safely too.
    """

    def __init__(self, log_dir: Path, tensorboard: bool = True, run_name: str | None = None):
        """``run_name`` (``[global] run_name``) is the TensorBoard run folder,
        ``<log_dir>/tensorboard/<run_name>``, so TensorBoard lists the run by its name."""
        self.path = Path(log_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            folder = Path(log_dir) / "tensorboard"
            self._tb = SummaryWriter(log_dir=str(folder / run_name if run_name else folder))

    def write(self, step: int, values: dict[str, Any], kind: str = "train", user: str | None = None) -> None:
        """Append one row; ``user``: the per_user update's user, kept in the row."""
        row = {"kind": kind, **values, "step": step, "time": time.time()}  # the step as written: an int
        if user is not None:
            row["user"] = user
        data = (json.dumps(row) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)  # one row, one write: atomic against the other writers
            while written < len(data):  # a short write (disk full, ...): finish the row rather than tear it
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def drop_user_rows(log_dir: Path, user: str) -> int:
    """Remove ``user``'s rows (their per_user updates) from ``metrics.jsonl``; returns how many.

    For ``openclaw-rl users delete``: afterwards no line of the file names them. The file is rewritten
    whole (atomically), so a row another process appends during the rewrite can be lost."""
    from openclaw_rl.runtime.rundir import atomic_write_text  # rundir stands above this module

    path = Path(log_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            kept.append(line)
            continue
        if isinstance(row, dict) and row.get("user") == user:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        atomic_write_text(path, "".join(f"{line}\n" for line in kept))
    return dropped


def read_metrics(log_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Every complete line of ``metrics.jsonl`` (a torn last line from a crash is skipped), oldest
    first; ``kind``: only the rows of that kind (other lines are not even parsed)."""
    path = Path(log_dir) / METRICS_FILE
    marker = None if kind is None else json.dumps({"kind": kind})[1:-1]  # '"kind": "eval"', as written
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return rows
    for line in text.splitlines():
        if marker is not None and marker not in line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and (kind is None or row.get("kind") == kind):
            rows.append(row)
    return rows


def plot_metrics(log_dir: Path) -> Path | None:
    """Draw reward, kl, clip_frac and (when present) the live eval score against training step as a
    PNG; the eval panel shows the mean score, each persona's score when there are several, and the
    base policy's score as a dashed reference line."""
    rows = read_metrics(log_dir)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = sorted(
        (r for r in rows if r.get("kind") == "eval"),
        key=lambda r: (r.get("step", 0), r.get("policy_version", 0)),
    )
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [
        ("reward_mean", "reward (batch mean, else its groups')"),
        ("kl", "KL to reference"),
        ("clip_frac", "clip fraction"),
    ]
    if evals:
        panels.append(("score", "held-out eval score"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels, strict=True):
        if key == "score":
            _plot_eval(ax, evals)
        else:
            # an update whose groups all scored alike carries no RL reward: its groups' mean stands in
            keys = (key, "group_reward_mean") if key == "reward_mean" else (key,)
            found = [(r["step"], next((r[k] for k in keys if _number(r.get(k))), None)) for r in train]
            pts = [(step, value) for step, value in found if value is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
            missing = [step for step, value in found if value is None]
            if missing and key == "reward_mean":  # updates that trained on no reward (OPD part only)
                for i, step in enumerate(missing):  # a line, not a point: they have no value to show
                    ax.axvline(
                        step,
                        color="grey",
                        alpha=0.6,
                        linewidth=1,
                        linestyle=":",
                        label="no RL reward" if i == 0 else None,
                    )
                ax.legend(fontsize=7, loc="best")
        ax.set_title(title)
        ax.set_xlabel("training step")
        lo, hi = ax.get_xlim()
        if hi - lo < 2:  # one update: matplotlib spans ±5% of it, and the locator falls back to fractions
            mid = round((lo + hi) / 2)
            ax.set_xlim(mid - 1, mid + 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole updates
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(log_dir) / PLOT_FILE
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _plot_eval(ax: Any, evals: list[dict[str, Any]]) -> None:
    """The eval curve (mean over personas), per-persona curves when there are several, base line."""
    pts = [(r["step"], r["score"]) for r in evals if _number(r.get("score"))]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4, label="mean")
    personas = sorted({k.removeprefix("score_") for r in evals for k in r if k.startswith("score_")})
    if len(personas) > 1:
        for name in personas:
            ppts = [(r["step"], r[f"score_{name}"]) for r in evals if _number(r.get(f"score_{name}"))]
            ax.plot([p[0] for p in ppts], [p[1] for p in ppts], linewidth=1, alpha=0.6, label=name)
    base = next((r["score"] for r in evals if r.get("policy_version") == 0 and _number(r.get("score"))), None)
    if base is None:
        base = next((r["base_score"] for r in reversed(evals) if _number(r.get("base_score"))), None)
    if base is not None:
        ax.axhline(base, color="grey", linestyle="--", linewidth=1, label=f"base {base:.2f}")
    ax.set_ylim(-0.03, 1.03)  # a score is a fraction: the whole range, so a small move looks small
    ax.legend(fontsize=7, loc="best")
