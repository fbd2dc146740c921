"""Thread shares: a PPO update timed with the serving engine generating and idle, per thread count.

The launcher gives the serving engine and the trainer half of the cores each
(``launcher/wiring.thread_shares``). Without it both ask torch for a thread per core, and on a small
machine their spinning intra-op threads take turns on the same cores. While serving is idle, though,
the trainer's share leaves the other half of the machine unused, so the training loop takes every
core for a pass whenever serving answers no request and no turn waits for the judge
(``trainer/loop.CoreBudget``, ``[training] use_idle_cores``). This times, in one invocation,
alternating, on the same batch of 4 chat-sized samples (``Trainer.train_update`` in this process):

* next to a generator process (the real ``PolicyService`` behind HTTP, 4 sessions generating without
  pause through the ``openai``-compatible route): both on their shares; both on every core (torch's
  default); the engine on its share and the trainer on every core (what the budget must avoid);
* with serving idle: the trainer on its share, and on every core (what the budget does).

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

    def timed(threads: int) -> float:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        trainer.train_update(batch)
        return time.perf_counter() - t0

    # (engine threads or None for an idle engine, trainer threads)
    cases = [(share, share), (cores, cores), (share, cores), (None, share), (None, cores)]
    times: dict[tuple[int | None, int], list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for engine, threads in cases:
            if engine is None:
                times[(engine, threads)].append(timed(threads))
            else:
                env = {**os.environ, "OMP_NUM_THREADS": str(engine), "MKL_NUM_THREADS": str(engine)}
                gen = subprocess.Popen(
                    [sys.executable, "-c", GENERATOR.format(root=str(ROOT), log=str(work / "serve"))],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
                try:
                    assert gen.stdout is not None
                    for line in gen.stdout:  # the service's own start-up lines come first
                        if line.strip() == "generating":
                            break
                    else:
                        raise SystemExit("the generator process ended before generating")
                    time.sleep(3)  # the sessions are under way
                    times[(engine, threads)].append(timed(threads))
                finally:
                    gen.kill()
                    gen.wait()
            print(
                f"engine {'idle' if engine is None else f'{engine} thread(s)'}, trainer {threads} thread(s): "
                f"update {times[(engine, threads)][-1]:.1f} s",
                flush=True,
            )
    med = {c: statistics.median(t) for c, t in times.items()}
    print(f"\n{cores} cores; a PPO update (batch 4), median of {args.rounds}:")
    print("  next to a generating engine:")
    print(
        f"    engine {share} / trainer {share} thread(s) (the launcher's shares): {med[(share, share)]:.1f} s"
    )
    print(f"    engine {cores} / trainer {cores} (torch's default):              {med[(cores, cores)]:.1f} s")
    print(
        f"    engine {share} / trainer {cores} (trainer borrows busy cores):    {med[(share, cores)]:.1f} s"
    )
    print(
        f"    default / shares: x{med[(cores, cores)] / med[(share, share)]:.2f}; "
        f"borrowing / shares: x{med[(share, cores)] / med[(share, share)]:.2f}"
    )
    print("  serving idle:")
    print(f"    trainer {share} thread(s) (its share): {med[(None, share)]:.1f} s")
    print(f"    trainer {cores} threads (idle cores taken): {med[(None, cores)]:.1f} s")
    print(f"    share / every core: x{med[(None, share)] / med[(None, cores)]:.2f} faster on every core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
