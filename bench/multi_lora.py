"""Per-user adapters served together: 8 users' adapters in one batch against 8 sessions of one adapter.

Three arms on the embedded model (SmolLM2-135M), in this one run, each over ``--rounds`` rounds of
``--sessions`` concurrent requests of ``--max-tokens`` greedy tokens:

* ``one adapter``: per_user mode, every session is the same user (one adapter slot in use);
* ``N adapters``: per_user mode, every session a different user with their own adapter (batched
  LoRA: one base matmul per layer, each row's own low-rank term);
* ``naive swap``: shared mode, the way a single-LoRA server serves many users: merge the request's
  user's adapter into the weights, generate, next request (requests of different users cannot share
  a batch, since the merged weights are global).

Printed: aggregate generated tokens/s per arm, the ratios ``N adapters / one adapter`` (the target is
>= 0.8) and ``N adapters / naive swap``, the memory one resident adapter takes and how many users'
adapters fit in 24 GB beside the model.

    .venv/bin/python bench/multi_lora.py [--sessions 8] [--max-tokens 32] [--rounds 3] [--rank 16]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import build_config  # noqa: E402
from openclaw_rl.policy.engine import Final, GenRequest, SamplingParams  # noqa: E402
from openclaw_rl.policy.protocol import ChatMessage  # noqa: E402
from openclaw_rl.policy.transformers_engine import TransformersEngine  # noqa: E402
from openclaw_rl.runtime.models import load_model  # noqa: E402

TOPICS = [
    "the sea",
    "a lighthouse",
    "a robot gardener",
    "a lost cat",
    "jazz",
    "a desert",
    "a library",
    "chess",
]


def make_adapters(n: int, rank: int, root: Path) -> list[Path]:
    """``n`` random LoRA adapters of the embedded model on the trainer's target modules."""
    from peft import LoraConfig, get_peft_model

    from openclaw_rl.config import TrainingConfig

    targets = TrainingConfig().lora_target_modules
    out = []
    for i in range(n):
        base, _ = load_model("smollm2-135m-instruct", "cpu", "float32")
        torch.manual_seed(100 + i)
        model = get_peft_model(
            base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
        )
        path = root / f"user{i}"
        model.save_pretrained(path)
        out.append(path)
    return out


def config(root: Path, per_user: bool, slots: int, sessions: int, rank: int):
    return build_config(
        {
            "global": {"log_dir": str(root)},
            "policy_service": {"max_concurrent": sessions, "batch_wait_ms": 20, "prefix_cache_mb": 0},
            "training": {"lora_rank": rank},
            "env_service": {"enabled": False},
            "users": {"mode": "per_user" if per_user else "shared", "max_resident": slots},
        },
        environ={},
    )


async def one(engine: TransformersEngine, user: str | None, topic: str, max_tokens: int) -> int:
    req = GenRequest(
        [ChatMessage(role="user", content=f"Write a short story about {topic}.")],
        None,
        SamplingParams(temperature=0, max_tokens=max_tokens),
    )
    req.adapter = user
    async for ev in engine.generate(req):
        if isinstance(ev, Final):
            if ev.error:
                raise RuntimeError(ev.error)
            return len(ev.response_ids)
    raise RuntimeError("no final event")


async def concurrent(engine: TransformersEngine, users: list[str | None], max_tokens: int) -> int:
    counts = await asyncio.gather(
        *[one(engine, u, TOPICS[i % len(TOPICS)], max_tokens) for i, u in enumerate(users)]
    )
    return sum(counts)


def timed_rounds(fn, rounds: int) -> float:
    """tokens/s over ``rounds`` calls of ``fn`` (returns tokens), after one warm-up call."""
    fn()
    start, tokens = time.perf_counter(), 0
    for _ in range(rounds):
        tokens += fn()
    return tokens / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="ocl-multi-lora-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the adapters it made
    paths = make_adapters(args.sessions, args.rank, work / "adapters")
    users = [f"user{i}" for i in range(args.sessions)]

    multi = TransformersEngine(config(work / "multi", True, args.sessions, args.sessions, args.rank))
    multi.start()
    for user, path in zip(users, paths, strict=True):
        multi.swap_adapter(user, path, 1)
    try:
        same = timed_rounds(
            lambda: asyncio.run(concurrent(multi, [users[0]] * args.sessions, args.max_tokens)), args.rounds
        )
        mixed = timed_rounds(lambda: asyncio.run(concurrent(multi, users, args.max_tokens)), args.rounds)
        bytes_per_slot = multi._adapters.table.bytes_per_slot if multi._adapters else 0
        model_bytes = sum(
            p.numel() * p.element_size() for n, p in multi.model.named_parameters() if "lora_" not in n
        )
    finally:
        multi.stop()

    naive = TransformersEngine(config(work / "naive", False, 1, args.sessions, args.rank))
    naive.start()
    try:

        def swap_each() -> int:
            total = 0
            for i, path in enumerate(paths):
                naive.swap_weights(path, i + 1)
                total += asyncio.run(one(naive, None, TOPICS[i % len(TOPICS)], args.max_tokens))
            return total

        swapped = timed_rounds(swap_each, args.rounds)
    finally:
        naive.stop()

    print(
        f"{args.sessions} concurrent sessions, {args.max_tokens} greedy tokens each, rank {args.rank}, "
        f"{args.rounds} rounds per arm (after a warm-up round), torch threads {torch.get_num_threads()}"
    )
    print(f"one adapter ({args.sessions} sessions of one user)     {same:8.1f} tokens/s")
    print(f"{args.sessions} adapters (one per session, batched) {mixed:8.1f} tokens/s")
    print(f"naive swap (merge per request)           {swapped:8.1f} tokens/s")
    print(f"ratio {args.sessions} adapters / one adapter = {mixed / same:.2f}   (target >= 0.8)")
    print(f"ratio {args.sessions} adapters / naive swap  = {mixed / swapped:.2f}")
    budget = 24 * 2**30 - model_bytes - 2 * 2**30  # 2 GiB kept for activations, KV cache and the process
    print(
        f"memory per resident adapter: {bytes_per_slot / 2**20:.1f} MiB (float32, rank {args.rank}, "
        f"7 projections x 30 layers); base model {model_bytes / 2**20:.0f} MiB; "
        f"adapters that fit in 24 GB beside it (2 GiB kept for the rest): {budget // max(bytes_per_slot, 1)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
