"""Where does an update's wall time go? The four stages of one update, timed one after another.

In lock-step the loops take turns, so one update's wall time is the sum of its stages:

1. **rollout**: environment episodes against the policy service until the judged turns give a batch
   (the student persona, ``group_size`` attempts per problem, through the real HTTP API);
2. **judge**: the embedded judge's votes and hints on every turn waiting for it;
3. **teacher**: the hinted teacher's log-prob pass on hinted turns (part of judging, timed apart);
4. **train**: one PPO update (scoring pass, forward and backward);
5. **sync**: exporting the policy and swapping it into the serving engine.

All of it runs in this one process on the real parts (``PolicyService``, ``EnvLoop``, ``JudgeLoop``,
``Trainer``), so the stages are timed exactly; the asynchronous run overlaps them
(``bench/learning.py`` reports trained samples per hour of the real launcher, async and lock-step).

The train stage was the biggest part; two changes cut it, and each batch is trained twice here, side by
side, to measure them: by a trainer as it was (``micro_batch_tokens = 4096``, every sample scored
by the proximal no-grad pass) and by one as it is (``micro_batch_tokens = 1024``: micro-batches of
similar lengths waste less padding on CPU; the first mini-batch's proximal log-probs come from its
own forward). The second one's weights are the ones served.

    .venv/bin/python bench/update_profile.py [--updates 4] [--batch 8] [--group-size 4] [--num-envs 2]

Prints seconds per update per stage, each stage's share, and the update time before / after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import load_config  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402

STAGES = ("rollout", "judge", "teacher", "train", "sync")
#: How the trainer ran before the profiling work, for the side-by-side train stage.
BEFORE_MICRO_BATCH_TOKENS = 4096


def write_config(work: Path, args: argparse.Namespace) -> Path:
    path = work / "profile.toml"
    path.write_text(f"""
[global]
seed = {args.seed}
log_dir = "{work / "profile"}"
[policy_service]
model = "smollm2-135m-instruct"
port = {free_port()}
max_concurrent = 16
weight_sync_interval = 1
max_tokens_default = {args.max_tokens}
[env_service]
num_envs = {args.num_envs}
group_size = {args.group_size}
interaction_types = ["chat"]
personas = ["student"]
max_turns = 3
[prm_service]
backend = "minilm"
vote_count = 3
[training]
lr = 2e-4
batch_size = {args.batch}
mini_batch_size = {max(1, args.batch // 2)}
micro_batch_tokens = 1024
checkpoint_interval = 1000
max_staleness = 8
""")
    return path


def profile(args: argparse.Namespace, work: Path) -> None:
    from openclaw_rl.envs.loop import EnvLoop
    from openclaw_rl.judge.loop import JudgeLoop
    from openclaw_rl.policy.server import PolicyService
    from openclaw_rl.trainer.ppo import Trainer

    cfg = load_config(write_config(work, args))
    service = PolicyService(cfg)
    url = service.start()
    store = Store(cfg.log_dir / "store.sqlite")
    judge_loop = JudgeLoop(cfg, store)
    judge = judge_loop.judge
    teacher_s = [0.0]
    real_add = judge._add_teacher

    async def timed_add(*args, **kwargs):  # the teacher pass, timed apart from the votes
        t0 = time.perf_counter()
        try:
            await real_add(*args, **kwargs)
        finally:
            teacher_s[0] += time.perf_counter() - t0

    judge._add_teacher = timed_add  # type: ignore[method-assign]
    trainer = Trainer(cfg, cfg.policy_service.model)
    before_cfg = cfg.model_copy(deep=True)
    before_cfg.training.micro_batch_tokens = BEFORE_MICRO_BATCH_TOKENS
    before_cfg.global_.log_dir = str(work / "before")
    before = Trainer(before_cfg, cfg.policy_service.model)
    score_all = before._score_old_and_ref
    before._score_old_and_ref = lambda active, first_mini_batch=0: score_all(active, 0)  # type: ignore[method-assign]
    totals = dict.fromkeys(STAGES, 0.0)
    train_before = 0.0
    per_round = args.num_envs * args.group_size
    samples = 0
    wall0 = time.perf_counter()
    try:
        for update in range(args.updates):
            while store.ready_count() < args.batch:
                t0 = time.perf_counter()
                EnvLoop(cfg, base_url=url, max_episodes=per_round).run()
                totals["rollout"] += time.perf_counter() - t0
                t0, teacher0 = time.perf_counter(), teacher_s[0]
                while asyncio.run(judge_loop.run_once()):
                    pass
                totals["judge"] += time.perf_counter() - t0 - (teacher_s[0] - teacher0)
                totals["teacher"] += teacher_s[0] - teacher0
            batch = store.claim_samples(args.batch, update + 1, trainer.policy_version)
            t0 = time.perf_counter()
            before.train_update([s.model_copy(deep=True) for s in batch])
            train_before += time.perf_counter() - t0
            t0 = time.perf_counter()
            trainer.train_update(batch)
            totals["train"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            path = trainer.export_policy(cfg.log_dir / "policy", trainer.policy_version)
            service.swap_weights(path, trainer.policy_version)
            totals["sync"] += time.perf_counter() - t0
            samples += len(batch)
            print(
                f"update {update + 1}: "
                + ", ".join(f"{k} {v:.0f}s" for k, v in totals.items())
                + f" (train as before: {train_before:.0f}s)",
                flush=True,
            )
    finally:
        service.stop()
        store.close()
    wall = time.perf_counter() - wall0 - train_before  # the side-by-side trainer is not part of an update
    n = args.updates
    print(
        f"\nper update (batch {args.batch}, group_size {args.group_size}, num_envs {args.num_envs}, "
        f"max_tokens {args.max_tokens}; {os.cpu_count()} cores):"
    )
    for k in STAGES:
        print(f"  {k:<8}{totals[k] / n:>8.1f} s  {totals[k] / wall:>6.1%}")
    print(f"  {'wall':<8}{wall / n:>8.1f} s   {samples / wall * 3600:.0f} trained samples/hour")
    old = wall + train_before - totals["train"]
    print(
        f"\ntrain stage, before / after on the same batches: {train_before / n:.1f} s / {totals['train'] / n:.1f} s "
        f"(x{totals['train'] / train_before:.2f})"
    )
    print(f"time per update, before / after: {old / n:.1f} s / {wall / n:.1f} s (x{wall / old:.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", help="keep run directories here")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        profile(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
