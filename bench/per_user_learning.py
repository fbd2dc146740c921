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

    .venv/bin/python bench/per_user_learning.py [--updates 16] [--batch 4] [--chat-n 32] [--seed 42] [--no-shared]

``--updates`` is per user: the per_user run makes ``2 x updates`` updates in all, the shared run
the same number, so both see the same traffic.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from learning import chat_run_sections, final_policy, score, toml_text, train  # noqa: E402

from openclaw_rl.config import EMBEDDED_MODEL, load_config  # noqa: E402
from openclaw_rl.runtime.rundir import RunDir  # noqa: E402

USERS = {"student": "sim-student", "analyst": "sim-analyst"}


def write_config(work: Path, mode: str, args: argparse.Namespace) -> Path:
    """The config of the run in ``mode`` (shared or per_user): both simulated users, one port."""
    label = f"{mode}-s{args.seed}"
    path = work / f"{label}.toml"
    sections: dict[str, dict[str, Any]] = {
        "global": {"run_name": label, "seed": args.seed, "log_dir": str(work / label)},
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
    path.write_text(toml_text(sections))
    return path


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
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", help="keep run directories here")
    ap.add_argument(
        "--no-shared",
        action="store_true",
        help="skip the shared-mode comparison run (half the time; its row is left out)",
    )
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-per-user-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    per_user, shared = write_config(work, "per_user", args), write_config(work, "shared", args)
    base = {p: score(per_user, None, args.chat_n, args.max_tokens, persona=p) for p in USERS}
    print(f"base: student {base['student']:.3f}, analyst {base['analyst']:.3f} (n={args.chat_n})", flush=True)

    wall, samples = train(per_user, per_user.with_suffix(".log"))
    run = RunDir.of(load_config(per_user))
    adapters = {}
    for persona, user in USERS.items():
        published = run.read_published_policy(user)
        if published is None:
            raise SystemExit(
                f"per_user run: no adapter was published for {user}; see {per_user.with_suffix('.log')}"
            )
        adapters[persona] = published.path
    cross = {
        (adapter, persona): score(per_user, adapters[adapter], args.chat_n, args.max_tokens, persona=persona)
        for adapter in USERS
        for persona in USERS
    }
    print(f"per_user run: {wall / 60:.1f} min, {samples} samples trained", flush=True)

    together: dict[str, float] = {}
    if not args.no_shared:
        wall_s, samples_s = train(shared, shared.with_suffix(".log"))
        shared_policy = final_policy(shared)
        together = {p: score(shared, shared_policy, args.chat_n, args.max_tokens, persona=p) for p in USERS}
        print(f"shared run: {wall_s / 60:.1f} min, {samples_s} samples trained", flush=True)

    print(f"\n{'policy':<28}{'student':>9}{'analyst':>9}")
    print(f"{'base':<28}{base['student']:>9.3f}{base['analyst']:>9.3f}")
    for adapter in USERS:
        row = f"{adapter + ' adapter (per_user)':<28}"
        print(row + "".join(f"{cross[(adapter, p)]:>9.3f}" for p in USERS))
    if together:
        print(f"{'shared policy':<28}{together['student']:>9.3f}{together['analyst']:>9.3f}")
    print()
    for persona in USERS:
        other = next(p for p in USERS if p != persona)
        own, theirs = cross[(persona, persona)], cross[(other, persona)]
        print(
            f"{persona}: own adapter {own - base[persona]:+.3f} over base (target >= +0.15); "
            f"own - other's adapter = {own - theirs:+.3f} (target >= 0.15)"
            + (f"; shared policy {together[persona] - base[persona]:+.3f} over base" if together else "")
        )
    print(
        f"\n({args.updates} updates of batch {args.batch} per user; n={args.chat_n} held-out problems per "
        f"user; lr {args.lr:g}; seed {args.seed}; total {(time.monotonic() - t0) / 60:.1f} min)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
