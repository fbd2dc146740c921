"""Where does an update's wall time go? The four stages of one update, timed one after another.

In lock-step the loops take turns, so one update's wall time is the sum of its stages:

1. **rollout**: environment episodes against the policy service until the judged turns give a batch
   (the student persona, ``group_size`` attempts per problem, through the real HTTP API);
2. **judge**: the embedded judge's votes and hints on every turn waiting for it;
3. **teacher**: the hinted teacher's log-prob pass on hinted turns (part of judging, timed apart);
4. **train**: one PPO update (scoring pass, forward and backward);
5. **sync**: exporting the policy and swapping it into the serving engine.

All of it runs in this one process on the real parts (``PolicyService``, ``EnvLoop``, ``JudgeLoop``,
``Trainer``), so the stages are timed exactly; the asynchronous run overlaps them (see
``bench/learning.py`` and ``--compare-async`` below for samples per hour of the real launcher).

    .venv/bin/python bench/update_profile.py [--updates 4] [--batch 8] [--group-size 4] [--num-envs 2]
    .venv/bin/python bench/update_profile.py --compare-async [--minutes 10]

Prints seconds per update per stage and each stage's share of the wall time. With
``--compare-async`` it instead runs the real launcher twice on the same workload for a fixed wall
time, ``async_mode = true`` then ``false``, and prints trained samples per hour of each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
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


def write_config(work: Path, args: argparse.Namespace, async_mode: bool = False) -> Path:
    path = work / f"profile-{'async' if async_mode else 'lockstep'}.toml"
    path.write_text(f"""
[global]
seed = {args.seed}
log_dir = "{work / ('async' if async_mode else 'lockstep')}"
async_mode = {str(async_mode).lower()}
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

    async def timed_add(turn, result):  # the teacher pass, timed apart from the votes
        t0 = time.perf_counter()
        try:
            await real_add(turn, result)
        finally:
            teacher_s[0] += time.perf_counter() - t0

    judge._add_teacher = timed_add  # type: ignore[method-assign]
    trainer = Trainer(cfg, cfg.policy_service.model)
    totals = dict.fromkeys(STAGES, 0.0)
    per_round = args.num_envs * args.group_size
    samples = 0
    wall0 = time.perf_counter()
    try:
        for update in range(args.updates):
            while store.ready_count() < args.batch:
                t0 = time.perf_counter()
                EnvLoop(cfg, base_url=url, max_episodes=per_round).run()
                totals["rollout"] += time.perf_counter() - t0
                t0, before = time.perf_counter(), teacher_s[0]
                while asyncio.run(judge_loop.run_once()):
                    pass
                totals["judge"] += time.perf_counter() - t0 - (teacher_s[0] - before)
                totals["teacher"] += teacher_s[0] - before
            batch = store.claim_samples(args.batch, update + 1, trainer.policy_version)
            t0 = time.perf_counter()
            trainer.train_update(batch)
            totals["train"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            path = trainer.export_policy(cfg.log_dir / "policy", trainer.policy_version)
            service.swap_weights(path, trainer.policy_version)
            totals["sync"] += time.perf_counter() - t0
            samples += len(batch)
            print(f"update {update + 1}: " + ", ".join(f"{k} {v:.0f}s" for k, v in totals.items()), flush=True)
    finally:
        service.stop()
        store.close()
    wall = time.perf_counter() - wall0
    n = args.updates
    print(f"\nper update (batch {args.batch}, group_size {args.group_size}, num_envs {args.num_envs}, "
          f"max_tokens {args.max_tokens}; {os.cpu_count()} cores):")
    for k in STAGES:
        print(f"  {k:<8}{totals[k] / n:>8.1f} s  {totals[k] / wall:>6.1%}")
    print(f"  {'wall':<8}{wall / n:>8.1f} s   {samples / wall * 3600:.0f} trained samples/hour")


def compare_async(args: argparse.Namespace, work: Path) -> None:
    rows = []
    for async_mode in (True, False):
        conf = write_config(work, args, async_mode)
        cfg = load_config(conf)
        log = work / f"{'async' if async_mode else 'lockstep'}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "openclaw_rl.launcher", "--config", str(conf)], cwd=ROOT,
                                    stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            t0 = time.monotonic()
            time.sleep(args.minutes * 60)
            proc.send_signal(signal.SIGINT)  # Ctrl-C: final checkpoint, claimed samples become trained
            proc.wait(timeout=300)
        wall = time.monotonic() - t0
        store = Store(cfg.log_dir / "store.sqlite")
        c = store.counters()
        store.close()
        rows.append(("async" if async_mode else "lock-step", c.trainer_step, c.samples_trained, wall))
        print(f"{rows[-1][0]}: {c.trainer_step} updates, {c.samples_trained} samples trained in {wall / 60:.1f} min",
              flush=True)
    print(f"\n{'mode':<10}{'updates':>8}{'samples':>9}{'samples/hour':>14}")
    for name, steps, trained, wall in rows:
        print(f"{name:<10}{steps:>8}{trained:>9}{trained / wall * 3600:>14.0f}")
    a, lock = rows[0], rows[1]
    if lock[2]:
        print(f"async / lock-step: x{(a[2] / a[3]) / (lock[2] / lock[3]):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--compare-async", action="store_true", help="samples/hour of the real launcher, async vs lock-step")
    ap.add_argument("--minutes", type=float, default=10.0, help="--compare-async: wall time of each run")
    ap.add_argument("--keep", help="keep run directories here")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        compare_async(args, work) if args.compare_async else profile(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
