"""Every user their own agent: two simulated users with opposite tastes trained at once, per user and shared.

The student (plain prose in their own voice) and the analyst (a heading, bulleted working, a formal
register) are the two users of one run of the real main job. In ``per_user`` mode each gets their
own adapter, trained only on their own next states; in ``shared`` mode (the comparison) one policy
learns from both. Afterwards every policy is scored on both users' held-out problems (never trained
on), the base model in the same invocation:

* per user: each adapter's gain on its own user (target >= +0.15 each);
* cross-evaluation: each user's own adapter against the other user's adapter on that user's score
  (target: own beats other's by >= 0.15);
* shared: the one policy's gain on each user.

    .venv/bin/python bench/per_user_learning.py [--updates 16] [--batch 4] [--chat-n 32] [--seeds 42,7] [--no-shared]
        [--set [SECTION.]KEY=VALUE ...]

``--updates`` is per user: the per_user run makes ``2 x updates`` updates in all, the shared run
the same number, so both see the same traffic. The trainer gives the turn to the user with more
samples waiting (docs/users.md), so the split between the two users follows their traffic; each
run's line prints how many updates each adapter got. Each seed is a run of its own (the base is scored
once: its held-out replies are greedy); the table gives each seed's figures and their mean.
``--rescore DIR --seeds S`` trains nothing: it scores the runs of seeds S kept in DIR (``--keep``)
again with the current scorer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from learning import (  # noqa: E402
    add_set_option,
    chat_run_sections,
    final_policy,
    score,
    toml_text,
    train,
    with_overrides,
)

from openclaw_rl.config import EMBEDDED_MODEL, load_config  # noqa: E402
from openclaw_rl.runtime.metrics import read_metrics  # noqa: E402
from openclaw_rl.runtime.rundir import RunDir  # noqa: E402

USERS = {"student": "sim-student", "analyst": "sim-analyst"}


def write_config(work: Path, mode: str, seed: int, args: argparse.Namespace) -> Path:
    """The config of the run in ``mode`` (shared or per_user): both simulated users, one port."""
    label = f"{mode}-s{seed}"
    path = work / f"{label}.toml"
    sections: dict[str, dict[str, Any]] = {
        "global": {"run_name": label, "seed": seed, "log_dir": str(work / label)},
        **chat_run_sections(args, EMBEDDED_MODEL, ["student", "analyst"], "gsm8k"),
        "training": {
            "lr": args.lr,
            "batch_size": args.batch,
            "mini_batch_size": max(1, args.batch // 2),
            "micro_batch_tokens": 1024,
            # both users' updates count towards max_steps: 16 each
            "checkpoint_interval": 2 * args.updates,
            "max_steps": 2 * args.updates,
            "max_staleness": 2 * args.sync,
            "eval_interval": 0,
        },
        "users": {"mode": mode},
    }
    path.write_text(toml_text(with_overrides(sections, args.set)))
    return path


def seed_list(text: str) -> list[int]:
    """``--seeds 42,7`` as ``[42, 7]``."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def run_seed(work: Path, seed: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One seed's per_user run (and shared run, unless ``--no-shared``), trained, then scored on
    both users by :func:`score_seed`."""
    per_user = write_config(work, "per_user", seed, args)
    wall, samples = train(per_user, per_user.with_suffix(".log"))
    trained = {user: 0 for user in USERS.values()}
    for row in read_metrics(RunDir.of(load_config(per_user)).root, kind="train"):
        if row.get("user") in trained:
            trained[row["user"]] += 1
    print(
        f"per_user run, seed {seed}: {wall / 60:.1f} min, {samples} samples trained; updates "
        + ", ".join(f"{user} {n}" for user, n in trained.items()),
        flush=True,
    )
    if not args.no_shared:
        shared = write_config(work, "shared", seed, args)
        wall_s, samples_s = train(shared, shared.with_suffix(".log"))
        print(f"shared run, seed {seed}: {wall_s / 60:.1f} min, {samples_s} samples trained", flush=True)
    return score_seed(work, seed, args)


def score_seed(work: Path, seed: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """``{policy: {persona: score}}`` of one seed's trained runs in ``work``: the policies
    ``"<persona> adapter"`` and, when its shared run is there and wanted, ``"shared"``."""
    per_user = work / f"per_user-s{seed}.toml"
    run = RunDir.of(load_config(per_user))
    scores: dict[str, dict[str, float]] = {}
    for adapter, user in USERS.items():
        published = run.read_published_policy(user)
        if published is None:
            raise SystemExit(
                f"per_user run (seed {seed}): no adapter was published for {user}; "
                f"see {per_user.with_suffix('.log')}"
            )
        scores[f"{adapter} adapter"] = {
            p: score(per_user, published.path, args.chat_n, args.max_tokens, persona=p) for p in USERS
        }
    shared = work / f"shared-s{seed}.toml"
    if not args.no_shared and shared.is_file():
        policy = final_policy(shared)
        scores["shared"] = {p: score(shared, policy, args.chat_n, args.max_tokens, persona=p) for p in USERS}
    return scores


def report(
    base: dict[str, float], runs: dict[int, dict[str, dict[str, float]]], args: argparse.Namespace
) -> None:
    """The score table (one row per policy and seed, then the means) and the targets' lines."""
    print(f"\n{'policy':<34}{'student':>9}{'analyst':>9}")
    print(f"{'base':<34}{base['student']:>9.3f}{base['analyst']:>9.3f}")

    def avg(policy: str, persona: str) -> float:
        return mean(scores[policy][persona] for scores in runs.values())

    for seed, scores in runs.items():
        for policy, by_persona in scores.items():
            print(f"{policy + f' (seed {seed})':<34}" + "".join(f"{by_persona[p]:>9.3f}" for p in USERS))
    if len(runs) > 1:
        for policy in next(iter(runs.values())):
            print(f"{policy + ' (mean)':<34}" + "".join(f"{avg(policy, p):>9.3f}" for p in USERS))

    seeds = ", ".join(str(s) for s in runs)
    print()
    for persona in USERS:
        other = next(p for p in USERS if p != persona)
        gains = [s[f"{persona} adapter"][persona] - base[persona] for s in runs.values()]
        margins = [s[f"{persona} adapter"][persona] - s[f"{other} adapter"][persona] for s in runs.values()]
        line = (
            f"{persona}: own adapter {mean(gains):+.3f} over base (seeds {seeds}: "
            + " / ".join(f"{g:+.3f}" for g in gains)
            + "; target >= +0.15); own - other's adapter "
            + f"{mean(margins):+.3f} ("
            + " / ".join(f"{m:+.3f}" for m in margins)
            + "; target >= 0.15)"
        )
        if not args.no_shared:
            line += f"; shared policy {avg('shared', persona) - base[persona]:+.3f} over base"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=16, help="updates per user")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--sync", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--chat-n", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=seed_list, default=[42, 7], help="comma-separated; one run per seed")
    ap.add_argument("--keep", help="keep run directories here")
    add_set_option(
        ap, "a setting of every run, as bench/learning.py takes it, e.g. --set prm_service.hint_memory=4"
    )
    ap.add_argument(
        "--no-shared",
        action="store_true",
        help="skip the shared-mode comparison run (half the time; its row is left out)",
    )
    ap.add_argument(
        "--rescore",
        metavar="DIR",
        help="train nothing: score the base and the runs of --seeds kept in DIR (--keep) again with the "
        "current scorer (--chat-n and --max-tokens as the runs had them)",
    )
    args = ap.parse_args()
    work = Path(args.rescore or args.keep or tempfile.mkdtemp(prefix="ocl-per-user-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    first = (
        work / f"per_user-s{args.seeds[0]}.toml"
        if args.rescore
        else write_config(work, "per_user", args.seeds[0], args)
    )
    base = {p: score(first, None, args.chat_n, args.max_tokens, persona=p) for p in USERS}
    print(f"base: student {base['student']:.3f}, analyst {base['analyst']:.3f} (n={args.chat_n})", flush=True)
    again = score_seed if args.rescore else run_seed
    runs = {seed: again(work, seed, args) for seed in args.seeds}
    report(base, runs, args)
    print(
        f"\n({2 * args.updates} updates of batch {args.batch}, shared between the users; n={args.chat_n} held-out problems per "
        f"user; lr {args.lr:g}; total {(time.monotonic() - t0) / 60:.1f} min)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
