"""Does the agent learn? Held-out personalisation before and after training, per method, in one run.

For each method (combined, Binary RL only, OPD only) this runs the real main job — launcher, policy
service, environment workers playing the *student* persona, embedded judge, LoRA trainer, weight
swaps — from the base model for a fixed number of updates, then scores the final policy on held-out
GSM8K problems (never used for training) with the persona's fixed scorer. The base score
is measured once, by the same scorer on the same problems, in the same invocation.

    .venv/bin/python bench/learning.py [--updates 16] [--batch 8] [--chat-n 32] \
        [--runs combined:42,combined:7,binary:42,opd:42,combined-lockstep:42]

A run is ``method:seed``; ``<method>-lockstep`` runs the same method with ``async_mode = false``
(serving paused while the trainer trains), the baseline the asynchronous run with
``max_staleness = 2 x weight_sync_interval`` is compared with. Prints a table: run, base score,
trained score, change, wall time, samples trained, trained samples per hour.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import PACKAGED_DATA, load_config  # noqa: E402
from openclaw_rl.envs.evaluate import EvalSizes, evaluate  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402

METHODS = {
    "combined": {"opd_enabled": "true", "binary_rl_weight": 1.0, "opd_weight": 1.0},
    "binary": {"opd_enabled": "false", "binary_rl_weight": 1.0, "opd_weight": 1.0},
    "opd": {"opd_enabled": "true", "binary_rl_weight": 0.0, "opd_weight": 1.0},
}


def write_config(work: Path, run: str, args: argparse.Namespace) -> Path:
    """The config of one run, ``method[-lockstep]:seed``."""
    name, seed = run.split(":")
    method = name.removesuffix("-lockstep")
    m = METHODS[method]
    data = args.data if args.data in PACKAGED_DATA else Path(args.data).resolve()
    label = f"{name}-s{seed}"
    path = work / f"{label}.toml"
    path.write_text(f"""
[global]
seed = {seed}
log_dir = "{work / label}"
async_mode = {str(not name.endswith("-lockstep")).lower()}
[policy_service]
model = "{args.model}"
port = {free_port()}
max_concurrent = 8
weight_sync_interval = {args.sync}
max_tokens_default = {args.max_tokens}
[env_service]
num_envs = {args.num_envs}
group_size = {args.group_size}
interaction_types = ["chat"]
personas = ["student"]
max_turns = 3
data_path = "{data}"
[prm_service]
backend = "minilm"
vote_count = 3
[training]
lr = {args.lr}
batch_size = {args.batch}
mini_batch_size = {max(1, args.batch // 2)}
micro_batch_tokens = 1024
checkpoint_interval = {args.updates}
max_steps = {args.updates}
max_staleness = {2 * args.sync}
opd_enabled = {m["opd_enabled"]}
binary_rl_weight = {m["binary_rl_weight"]}
opd_weight = {m["opd_weight"]}
""")
    return path


def score(config: Path, checkpoint: Path | None, n: int, max_tokens: int) -> float:
    """Held-out student personalisation of the base model or an exported policy directory."""
    cfg = load_config(config)
    ecfg = cfg.model_copy(deep=True)
    ecfg.policy_service.port = 0
    ecfg.global_.log_dir = tempfile.mkdtemp(prefix="ocl-eval-")
    service = PolicyService(ecfg)
    try:
        url = service.start()
        if checkpoint is not None:
            service.swap_weights(checkpoint, 1)
        # Problems are sent 8 at a time (the engine batches them); greedy, so the score does not
        # depend on the order.
        summary = evaluate(
            ecfg, url, EvalSizes(chat=n, terminal=0, tool_call=0, max_tokens=max_tokens), concurrency=8
        )
    finally:
        service.stop()
        shutil.rmtree(ecfg.global_.log_dir, ignore_errors=True)
    return float(summary["chat"]["student"]["personalization"])


def train(config: Path, log_file: Path) -> tuple[float, int]:
    """Run the main job to max_steps; returns (wall seconds, samples trained)."""
    start = time.monotonic()
    with log_file.open("w") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_rl.launcher", "--config", str(config)],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    if proc.returncode != 0:
        raise SystemExit(f"training run failed (exit {proc.returncode}); see {log_file}")
    cfg = load_config(config)
    store = Store(cfg.log_dir / "store.sqlite")
    trained = store.counters().samples_trained
    store.close()
    return time.monotonic() - start, trained


def final_policy(config: Path) -> Path:
    cfg = load_config(config)
    ckpt = cfg.log_dir / "checkpoints"
    return ckpt / (ckpt / "latest").read_text().strip() / "policy"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs",
        default="combined:42,combined:7,binary:42,opd:42,combined-lockstep:42",
        help="comma-separated method:seed (method: combined, binary, opd, or one of them + -lockstep)",
    )
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sync", type=int, default=4, help="weight_sync_interval")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4, help="episodes per task (group-relative advantages)")
    ap.add_argument("--chat-n", type=int, default=32, help="held-out problems scored")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default="gsm8k", help="packaged data set name or JSON file")
    ap.add_argument("--keep", help="keep run directories here instead of a temp dir")
    args = ap.parse_args()
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for r in runs:
        name, _, seed = r.partition(":")
        if name.removesuffix("-lockstep") not in METHODS or not seed.isdigit():
            raise SystemExit(
                f"bad run {r!r}: write method:seed with method one of {sorted(METHODS)} "
                f"(optionally + -lockstep), e.g. combined:42"
            )

    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    base_cfg = write_config(work, runs[0], args)
    base = score(base_cfg, None, args.chat_n, args.max_tokens)
    print(f"base model: held-out student personalisation = {base:.3f} (n={args.chat_n})", flush=True)
    rows = []
    for run in runs:
        conf = write_config(work, run, args)
        wall, trained = train(conf, conf.with_suffix(".log"))
        after = score(conf, final_policy(conf), args.chat_n, args.max_tokens)
        rows.append((run, after, wall, trained))
        print(
            f"{run}: {base:.3f} -> {after:.3f} after {args.updates} updates "
            f"({trained} samples, {wall / 60:.1f} min)",
            flush=True,
        )
        (work / "learning.json").write_text(
            json.dumps(
                {
                    "base": base,
                    "updates": args.updates,
                    "batch": args.batch,
                    "n": args.chat_n,
                    "rows": [{"run": r, "trained": a, "wall_s": w, "samples": s} for r, a, w, s in rows],
                },
                indent=2,
            )
        )
    print()
    print(f"{'run':<22}{'base':>7}{'trained':>9}{'change':>8}{'minutes':>9}{'samples':>9}{'per hour':>10}")
    for run, after, wall, trained in rows:
        print(
            f"{run:<22}{base:>7.3f}{after:>9.3f}{after - base:>+8.3f}{wall / 60:>9.1f}{trained:>9}"
            f"{trained / wall * 3600:>10.0f}"
        )
    print(
        f"\n(n={args.chat_n} held-out problems; one problem moves a score by {1 / args.chat_n:.3f} at most)"
    )
    print(f"total {(time.monotonic() - t0) / 60:.1f} min on {os.cpu_count()} cores; runs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
