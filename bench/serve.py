"""Serving benchmark: N concurrent multi-turn sessions against a real policy service over loopback HTTP.

For each concurrency level (default 1 and 8) every session runs ``--turns`` chat turns in sequence
(the conversation grows, sessions carry ``X-Session-Id``), all sessions at once. Printed per level:
request throughput, mean and p99 latency, generated tokens/s; then the ratio of aggregate tokens/s at
the highest level to the lowest, measured side by side in this one run. The ratio comes from batching:
the engine decodes all active sessions in one forward pass per token.

    .venv/bin/python bench/serve.py                          # embedded SmolLM2-135M, 1 vs 8 sessions
    .venv/bin/python bench/serve.py --sessions 1,4,8 --max-tokens 48 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from _args import positive_int, positive_ints

from openclaw_rl.config import build_config
from openclaw_rl.policy.server import PolicyService

TOPICS = [
    "a lighthouse keeper",
    "a robot gardener",
    "a lost cat",
    "a mountain village",
    "a jazz musician",
    "a desert caravan",
    "an old library",
    "a submarine crew",
    "a chess prodigy",
    "a winter festival",
]


async def session(
    client: httpx.AsyncClient,
    sid: str,
    topic: str,
    turns: int,
    max_tokens: int,
    latencies: list[float],
    tokens: list[int],
) -> None:
    messages = [{"role": "user", "content": f"Write a long, detailed story about {topic}."}]
    for t in range(turns):
        start = time.perf_counter()
        r = await client.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": sid},
            json={"messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": t},
        )
        r.raise_for_status()
        body = r.json()
        latencies.append(time.perf_counter() - start)
        tokens.append(body["usage"]["completion_tokens"])
        messages += [body["choices"][0]["message"], {"role": "user", "content": "Continue the story."}]


async def level(url: str, n: int, turns: int, max_tokens: int) -> dict[str, float]:
    latencies: list[float] = []
    tokens: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(
            *[
                session(
                    client, f"bench-{n}-{i}", TOPICS[i % len(TOPICS)], turns, max_tokens, latencies, tokens
                )
                for i in range(n)
            ]
        )
        wall = time.perf_counter() - start
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    return {
        "sessions": n,
        "requests": len(lat),
        "wall_s": wall,
        "req_per_s": len(lat) / wall,
        "mean_latency_s": statistics.mean(lat),
        "p99_latency_s": p99,
        "tokens": sum(tokens),
        "tokens_per_s": sum(tokens) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--sessions", type=positive_ints, default="1,8", help="comma-separated concurrency levels"
    )
    ap.add_argument("--turns", type=positive_int, default=3, help="turns per session")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over all levels (interleaved); the ratio uses each level's best round",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = args.sessions
    with tempfile.TemporaryDirectory() as tmp:
        cfg = build_config(
            {
                "global": {"log_dir": str(Path(tmp) / "logs")},
                "policy_service": {
                    "model": args.model,
                    "host": "127.0.0.1",
                    "port": 0,
                    "max_concurrent": max(64, max(levels)),
                },
            },
            environ={},
        )
        svc = PolicyService(cfg)
        url = svc.start()
        try:
            asyncio.run(level(url, 1, 1, 4))  # warm-up
            results = [
                asyncio.run(level(url, n, args.turns, args.max_tokens))
                for _ in range(args.repeat)
                for n in levels
            ]
        finally:
            svc.stop()
    print(
        f"\nmodel={args.model} threads={args.threads} turns/session={args.turns} max_tokens={args.max_tokens}"
    )
    print(
        f"{'sessions':>8} {'requests':>8} {'req/s':>8} {'mean lat s':>10} {'p99 lat s':>10} {'tokens':>7} {'tokens/s':>9}"
    )
    for r in results:
        print(
            f"{r['sessions']:>8} {r['requests']:>8} {r['req_per_s']:>8.2f} {r['mean_latency_s']:>10.2f} "
            f"{r['p99_latency_s']:>10.2f} {r['tokens']:>7} {r['tokens_per_s']:>9.1f}"
        )
    best = {
        n: max((r for r in results if r["sessions"] == n), key=lambda r: r["tokens_per_s"]) for n in levels
    }
    lo, hi = best[min(levels)], best[max(levels)]
    print(
        f"\naggregate tokens/s, {hi['sessions']} sessions vs {lo['sessions']}: "
        f"{hi['tokens_per_s'] / lo['tokens_per_s']:.2f}x (target >= 3x from batching)"
    )


if __name__ == "__main__":
    main()
