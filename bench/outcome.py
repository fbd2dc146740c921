"""The outcome track: do terminal and tool-call tasks get solved more often after training on outcome rewards?

Runs the real main job — launcher, policy service, environment workers playing terminal and
tool-call tasks in groups of ``--group-size`` attempts, embedded judge, LoRA trainer — with
``[env_service] reward = "outcome"``: every turn of an episode trains on the episode's verified
success (+1 / -1) relative to its group. Before and after, in the same invocation, the held-out
tasks are played greedily: the terminal tasks no training episode draws (``terminal.EVAL_TASKS``) and
held-out tool-call problems (a disjoint slice of GSM8K and a disjoint seed space of lookups).

    .venv/bin/python bench/outcome.py [--updates 16] [--batch 8] [--tool-call-n 16] [--seed 42]

Prints the base and trained success rates per task family and overall, and the share of groups
whose attempts all ended alike (no signal).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import final_policy, train  # noqa: E402
from openclaw_rl.config import load_config  # noqa: E402
from openclaw_rl.envs.terminal import EVAL_TASKS  # noqa: E402
from openclaw_rl.launcher.evaluate import EvalSizes, evaluate  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402
from openclaw_rl.runtime.metrics import read_metrics  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402


def write_config(work: Path, args: argparse.Namespace) -> Path:
    path = work / "outcome.toml"
    path.write_text(f"""
[global]
seed = {args.seed}
log_dir = "{work / "outcome"}"
[policy_service]
model = "smollm2-135m-instruct"
port = {free_port()}
max_concurrent = 16
weight_sync_interval = 4
max_tokens_default = {args.max_tokens}
[env_service]
num_envs = {args.num_envs}
group_size = {args.group_size}
interaction_types = ["terminal", "tool_call"]
reward = "outcome"
max_turns = 3
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
max_staleness = 8
opd_enabled = false
""")
    return path


def score(config: Path, checkpoint: Path | None, args: argparse.Namespace) -> dict[str, float]:
    """Held-out success of the base model or an exported policy, per family and overall."""
    cfg = load_config(config)
    ecfg = cfg.model_copy(deep=True)
    ecfg.policy_service.port = 0
    ecfg.global_.log_dir = tempfile.mkdtemp(prefix="ocl-eval-")
    service = PolicyService(ecfg)
    try:
        url = service.start()
        if checkpoint is not None:
            service.swap_weights(checkpoint, 1)
        summary = evaluate(
            ecfg,
            url,
            EvalSizes(
                chat=0, terminal=len(EVAL_TASKS), tool_call=args.tool_call_n, max_tokens=args.max_tokens
            ),
        )
    finally:
        service.stop()
        shutil.rmtree(ecfg.global_.log_dir, ignore_errors=True)
    term, tool = summary["terminal"], summary["tool_call"]
    solved = term["success_rate"] * term["n"] + tool["success_rate"] * tool["n"]
    return {
        "terminal": term["success_rate"],
        "tool_call": tool["success_rate"],
        "overall": solved / (term["n"] + tool["n"]),
        "n": term["n"] + tool["n"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tool-call-n", type=int, default=16, help="held-out tool-call episodes scored")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", help="keep the run directory here instead of a temp dir")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-outcome-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    conf = write_config(work, args)
    base = score(conf, None, args)
    print(f"base: {json.dumps(base)}", flush=True)
    wall, trained = train(conf, work / "outcome.log")
    after = score(conf, final_policy(conf), args)
    print(f"trained: {json.dumps(after)}", flush=True)
    rows = [r for r in read_metrics(load_config(conf).log_dir, "train") if "zero_adv_group_frac" in r]
    zero = sum(r["zero_adv_group_frac"] for r in rows) / len(rows) if rows else float("nan")
    print(f"\n{'held-out':<12}{'base':>7}{'trained':>9}{'change':>8}")
    for key in ("terminal", "tool_call", "overall"):
        print(f"{key:<12}{base[key]:>7.3f}{after[key]:>9.3f}{after[key] - base[key]:>+8.3f}")
    print(
        f"\n{base['n']} held-out episodes; {args.updates} updates, {trained} samples trained in {wall / 60:.1f} min; "
        f"groups with no signal (all attempts alike): {zero:.0%} (mean over updates)"
    )
    print(f"total {(time.monotonic() - t0) / 60:.1f} min on {os.cpu_count()} cores; run in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
