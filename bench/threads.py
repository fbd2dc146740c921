"""Thread shares: a PPO update timed while the serving engine generates, with and without them.

The launcher gives the serving engine and the trainer half of the cores each
(``launcher/wiring.thread_shares``). Without it both ask torch for a thread per core, and on a small
machine their spinning intra-op threads take turns on the same cores. This runs both ways in one
invocation, alternating, on the same batch:

* a generator process (the real ``PolicyService`` behind HTTP, with 4 sessions generating without
  pause through the ``openai``-compatible route) with T threads;
* in this process, ``Trainer.train_update`` on a fixed batch of 4 samples with T threads;

for T = the launcher's share and T = every core. Prints each update's seconds and the ratio.

    .venv/bin/python bench/threads.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GENERATOR = """
import os, sys, threading, httpx
sys.path.insert(0, {root!r})
from openclaw_rl.config import build_config
from openclaw_rl.policy.server import PolicyService
cfg = build_config({{"global": {{"log_dir": {log!r}}}, "policy_service": {{"port": 0, "max_tokens_default": 64}}}},
                   environ={{}})
service = PolicyService(cfg)
url = service.start()
def session(i):
    with httpx.Client(timeout=600) as c:
        while True:
            c.post(url + "/v1/chat/completions", json={{"messages": [{{"role": "user", "content": f"Count to {{i + 20}}."}}],
                                                     "temperature": 0.7}})
for i in range(4):
    threading.Thread(target=session, args=(i,), daemon=True).start()
print("generating", flush=True)
sys.stdin.read()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import torch

    from openclaw_rl.config import build_config
    from openclaw_rl.launcher.wiring import thread_shares
    from openclaw_rl.trainer.ppo import Trainer
    from openclaw_rl.types import Sample

    cores = len(os.sched_getaffinity(0))
    share = thread_shares(cores)["training"]
    work = Path(tempfile.mkdtemp(prefix="ocl-threads-"))
    cfg = build_config(
        {
            "global": {"log_dir": str(work / "train")},
            "training": {"batch_size": 4, "mini_batch_size": 2, "micro_batch_tokens": 1024, "lr": 1e-4},
        },
        environ={},
    )
    trainer = Trainer(cfg, cfg.policy_service.model)
    tok = trainer.tokenizer
    batch = []
    for i in range(4):  # chat-sized samples: ~250 prompt and 64 response tokens
        prompt = tok.encode(f"Problem {i}: " + "Tom has 3 apples and buys 4 more bags of 6. " * 18)
        response = tok.encode("He has 3 + 4 * 6 = 27 apples. " * 6)[:64]
        batch.append(
            Sample(
                sample_id=f"s{i}",
                session_id="b",
                turn_index=i,
                prompt_ids=prompt,
                response_ids=response,
                rollout_logprobs=[-1.0] * len(response),
                loss_mask=[1] * len(response),
                reward=1.0 if i % 2 else -1.0,
            )
        )
    trainer.train_update(batch)  # warm-up
    times: dict[int, list[float]] = {share: [], cores: []}
    for _ in range(args.rounds):
        for threads in (share, cores):
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            gen = subprocess.Popen(
                [sys.executable, "-c", GENERATOR.format(root=str(ROOT), log=str(work / "serve"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            try:
                assert gen.stdout is not None and gen.stdout.readline().strip() == "generating"
                time.sleep(3)  # the sessions are under way
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                trainer.train_update(batch)
                times[threads].append(time.perf_counter() - t0)
            finally:
                gen.kill()
                gen.wait()
            print(f"threads={threads} per process: update {times[threads][-1]:.1f} s", flush=True)
    a, b = statistics.median(times[share]), statistics.median(times[cores])
    print(f"\n{cores} cores; a PPO update (batch 4) next to a generating engine, median of {args.rounds}:")
    print(f"  {share} thread(s) each (the launcher's shares): {a:.1f} s")
    print(f"  {cores} threads each (torch's default):          {b:.1f} s")
    print(f"  default / shares: x{b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
