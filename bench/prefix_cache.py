"""Prefix-cache benchmark: the embedded engine with its prefix cache on vs off, side by side in one run.

Three measurements on the real embedded model (SmolLM2-135M-Instruct), each engine in this process
sharing one loaded copy of the weights, requests tokenised with the chat template as the server does
(each turn's prompt is re-rendered from the messages, the previous answer included as text):

1. time to first token of turns 2 and 3 of one session whose system prompt is ~7,000 tokens of
   tool-schema-like JSON (what an agent client sends every turn), cache off vs on, the two engines'
   turns interleaved so that the machine's drift hits both alike (target: >= 5x faster with the cache);
2. aggregate generated tokens/s of 8 concurrent 3-turn sessions sharing a ~1,000-token system
   prompt, cache off vs on;
3. the cache's memory at a small bound (64 MB, less than the ~46 MB shared prompt plus the sessions'
   histories):
   the most bytes seen held (polled every 20 ms, and the cache's own peak) vs the bound, with the
   same workload as 2.

    .venv/bin/python bench/prefix_cache.py            # ~10 minutes on 2 busy cores
    .venv/bin/python bench/prefix_cache.py --quick    # shorter prompts, fewer sessions
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import build_config  # noqa: E402
from openclaw_rl.policy.engine import Delta, Final, GenRequest, SamplingParams  # noqa: E402
from openclaw_rl.policy.protocol import ChatMessage  # noqa: E402
from openclaw_rl.policy.transformers_engine import TransformersEngine  # noqa: E402
from openclaw_rl.runtime.models import load_model  # noqa: E402

VERBS = [
    "read",
    "write",
    "list",
    "search",
    "delete",
    "move",
    "copy",
    "fetch",
    "run",
    "open",
    "close",
    "summarise",
    "translate",
    "compile",
    "deploy",
    "schedule",
    "query",
    "render",
    "index",
    "archive",
]
NOUNS = [
    "file",
    "directory",
    "issue",
    "pull_request",
    "calendar_event",
    "email",
    "spreadsheet",
    "image",
    "database_row",
    "web_page",
    "terminal",
    "container",
    "branch",
    "commit",
    "invoice",
    "contact",
]
TYPES = ["string", "integer", "boolean", "number", "array"]
QUESTIONS = [
    "List the files in the project.",
    "Open the README and summarise it.",
    "Which tests fail?",
    "Fix the first failure.",
    "Write a commit message.",
    "What should we do next?",
]
TOPICS = [
    "the build",
    "the database",
    "the web page",
    "the invoices",
    "the calendar",
    "the images",
    "the emails",
    "the containers",
    "the branches",
    "the contacts",
]


def system_prompt(tokenizer: Any, target_tokens: int, seed: int = 0) -> str:
    """Agent-style instructions followed by tool schemas (varied JSON) until ``target_tokens``."""
    rng = random.Random(seed)
    parts = ["You are a capable software agent. Use the tools below; answer briefly. Tools:"]
    n = 0
    while len(tokenizer("\n".join(parts), add_special_tokens=False)["input_ids"]) < target_tokens:
        verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
        args = {
            f"{rng.choice(NOUNS)}_{k}": {
                "type": rng.choice(TYPES),
                "description": f"the {rng.choice(NOUNS).replace('_', ' ')} "
                f"to {rng.choice(VERBS)} ({rng.randint(1, 999)})",
            }
            for k in range(rng.randint(1, 4))
        }
        parts.append(
            json.dumps(
                {
                    "type": "function",
                    "function": {
                        "name": f"{verb}_{noun}_{n}",
                        "description": f"{verb.capitalize()} a {noun.replace('_', ' ')} "
                        f"in workspace {rng.randint(1, 99)}; returns JSON.",
                        "parameters": {"type": "object", "properties": args, "required": list(args)[:1]},
                    },
                }
            )
        )
        n += 1
    return "\n".join(parts)


def make_engine(model: Any, tokenizer: Any, tmp: Path, name: str, cache_mb: int) -> TransformersEngine:
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp / name)},
            "policy_service": {
                "model": "smollm2-135m-instruct",
                "max_model_len": 8192,
                "max_concurrent": 64,
                "prefix_cache_mb": cache_mb,
            },
        },
        environ={},
    )
    engine = TransformersEngine(cfg, model, tokenizer)
    engine.start()
    return engine


async def turn(
    engine: TransformersEngine,
    messages: list[ChatMessage],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> tuple[float, float, Final]:
    """One request: (seconds to the first token, seconds to the end, the final event)."""
    start = time.perf_counter()
    first = None
    req = GenRequest(
        list(messages), None, SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    )
    async for ev in engine.generate(req):
        if isinstance(ev, Delta) and first is None:
            first = time.perf_counter() - start
        if isinstance(ev, Final):
            if ev.error:
                raise RuntimeError(ev.error)
            return first or 0.0, time.perf_counter() - start, ev
    raise RuntimeError("no final event")


def ttft_sessions(engines: dict[str, TransformersEngine], system: str, turns: int, max_tokens: int) -> dict:
    """One session per engine, their turns interleaved; time to first token per turn."""
    convs = {k: [ChatMessage(role="system", content=system)] for k in engines}
    out: dict[str, list[tuple[float, int, int]]] = {k: [] for k in engines}
    for t in range(turns):
        for k, engine in engines.items():
            convs[k].append(ChatMessage(role="user", content=QUESTIONS[t % len(QUESTIONS)]))
            before = engine.stats()["prefix_cache_prefill_tokens"]
            ttft, _, final = asyncio.run(turn(engine, convs[k], max_tokens))
            prefilled = engine.stats()["prefix_cache_prefill_tokens"] - before
            out[k].append((ttft, len(final.prompt_ids), prefilled))
            print(f"  [ttft] cache {k:>3} turn {t + 1}: {ttft:.2f} s", file=sys.stderr, flush=True)
            convs[k].append(ChatMessage(role="assistant", content=final.text))
    return out


async def concurrent_sessions(
    engine: TransformersEngine,
    system: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    poll: list[int] | None = None,
) -> dict[str, float]:
    ttfts: list[float] = []
    tokens: list[int] = []

    async def one(i: int) -> None:
        messages = [ChatMessage(role="system", content=system)]
        for t in range(turns):
            messages.append(
                ChatMessage(
                    role="user",
                    content=f"About {TOPICS[i % len(TOPICS)]}: {QUESTIONS[(i + t) % len(QUESTIONS)]}",
                )
            )
            ttft, _, final = await turn(engine, messages, max_tokens, temperature=0.7, seed=100 * i + t)
            ttfts.append(ttft)
            tokens.append(len(final.response_ids))
            messages.append(ChatMessage(role="assistant", content=final.text))

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            assert poll is not None
            poll.append(engine.stats()["prefix_cache_bytes"])
            await asyncio.sleep(0.02)

    done = asyncio.Event()
    watcher = asyncio.ensure_future(watch(done)) if poll is not None else None
    start = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(sessions)])
    wall = time.perf_counter() - start
    done.set()
    if watcher is not None:
        await watcher
    print(f"  [sessions] {engine.pcfg.prefix_cache_mb} MB cache: {wall:.1f} s", file=sys.stderr, flush=True)
    return {
        "wall_s": wall,
        "tokens": sum(tokens),
        "tokens_per_s": sum(tokens) / wall,
        "mean_ttft_s": statistics.mean(ttfts),
        "requests": len(ttfts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--long-prompt", type=int, default=7000, help="system prompt tokens of the TTFT session")
    ap.add_argument(
        "--shared-prompt", type=int, default=1000, help="system prompt tokens shared by the sessions"
    )
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--bound-mb", type=int, default=64, help="the small cache bound of the memory check")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--quick", action="store_true", help="3k/800-token prompts, 4 sessions, 2 turns")
    ap.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / "prefix_cache.txt"),
        help="where the report is written (default: replaces bench/results/prefix_cache.txt)",
    )
    args = ap.parse_args()
    if args.quick:
        args.long_prompt, args.shared_prompt, args.sessions, args.turns = 3000, 800, 4, 2
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    long_system = system_prompt(tokenizer, args.long_prompt, seed=1)
    shared_system = system_prompt(tokenizer, args.shared_prompt, seed=2)
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        engines: dict[str, TransformersEngine] = {}
        try:
            for k, mb in (("off", 0), ("on", 512)):
                engines[k] = make_engine(model, tokenizer, tmp, k, mb)
                asyncio.run(turn(engines[k], [ChatMessage(role="user", content="Hi")], 2))  # warm-up
            t0 = time.perf_counter()
            ttft = ttft_sessions(engines, long_system, 3, 16)
            t_ttft = time.perf_counter() - t0
            ttft_stats = {k: e.stats() for k, e in engines.items()}
            engines["on"].stop()  # part 2 starts from an empty cache: a new engine (the same weights)
            for k, mb in (("on", 512), ("small", args.bound_mb)):
                engines[k] = make_engine(model, tokenizer, tmp, k, mb)
                asyncio.run(turn(engines[k], [ChatMessage(role="user", content="Hi")], 2))  # warm-up
            small = engines["small"]
            t0 = time.perf_counter()
            conc = {
                k: asyncio.run(
                    concurrent_sessions(engines[k], shared_system, args.sessions, args.turns, args.max_tokens)
                )
                for k in ("off", "on")
            }
            t_conc = time.perf_counter() - t0
            poll: list[int] = []
            t0 = time.perf_counter()
            conc["small"] = asyncio.run(
                concurrent_sessions(small, shared_system, args.sessions, args.turns, args.max_tokens, poll)
            )
            t_small = time.perf_counter() - t0
            stats = {k: e.stats() for k, e in engines.items()}
        finally:
            for e in engines.values():
                e.stop()

    say(
        f"model={args.model} threads={args.threads} block={stats['on']['prefix_cache_block_tokens']} tokens "
        f"kv={model.config.num_hidden_layers}x{model.config.num_key_value_heads}x"
        f"{model.config.hidden_size // model.config.num_attention_heads} ({model.dtype})"
    )
    say()
    say(
        f"1. time to first token, one session, ~{args.long_prompt}-token system prompt, 16 tokens/turn "
        f"({t_ttft:.0f} s)"
    )
    say(
        f"{'turn':>4} {'prompt':>7} {'prefilled off':>13} {'prefilled on':>12} {'ttft off s':>10} "
        f"{'ttft on s':>9} {'speed-up':>8}"
    )
    for t in range(3):
        (a, pa, fa), (b, _, fb) = ttft["off"][t], ttft["on"][t]
        say(f"{t + 1:>4} {pa:>7} {fa:>13} {fb:>12} {a:>10.2f} {b:>9.2f} {a / b:>7.1f}x")
    later_off = sum(x[0] for x in ttft["off"][1:])
    later_on = sum(x[0] for x in ttft["on"][1:])
    say(f"turns 2-3 time to first token, off / on: {later_off / later_on:.1f}x (target >= 5x)")
    say()
    say(
        f"2. {args.sessions} concurrent sessions x {args.turns} turns, ~{args.shared_prompt}-token shared system "
        f"prompt, {args.max_tokens} tokens/turn, temperature 0.7 ({t_conc:.0f} s)"
    )
    say(
        f"{'cache':>12} {'requests':>8} {'wall s':>7} {'tokens':>7} {'tokens/s':>8} {'mean ttft s':>11} "
        f"{'prefilled':>9} {'hit tokens':>10}"
    )
    names = {"off": "off", "on": "512 MB", "small": f"{args.bound_mb} MB"}
    prefilled = {k: stats[k]["prefix_cache_prefill_tokens"] for k in stats}
    prefilled["off"] -= ttft_stats["off"]["prefix_cache_prefill_tokens"]  # the off engine served part 1 too
    hits = {k: stats[k]["prefix_cache_hit_tokens"] for k in stats}
    for k in ("off", "on", "small"):
        r = conc[k]
        say(
            f"{names[k]:>12} {r['requests']:>8} {r['wall_s']:>7.1f} {r['tokens']:>7} {r['tokens_per_s']:>8.2f} "
            f"{r['mean_ttft_s']:>11.2f} {prefilled[k]:>9} {hits[k]:>10}"
        )
    say(
        f"aggregate tokens/s, on / off: {conc['on']['tokens_per_s'] / conc['off']['tokens_per_s']:.2f}x; "
        f"{args.bound_mb} MB / off: {conc['small']['tokens_per_s'] / conc['off']['tokens_per_s']:.2f}x"
    )
    say("(prefilled: prompt tokens run through prefill; the cached engines' counts include a short warm-up)")
    say()
    s = stats["small"]
    mb = 2**20
    say(f"3. memory at a {args.bound_mb} MB bound (workload of 2, {t_small:.0f} s)")
    say(
        f"bound {s['prefix_cache_max_bytes'] / mb:.1f} MB; most seen held {max(poll, default=0) / mb:.1f} MB "
        f"(polled), peak {s['prefix_cache_peak_bytes'] / mb:.1f} MB (cache's own), "
        f"held at the end {s['prefix_cache_bytes'] / mb:.1f} MB in {s['prefix_cache_entries']} blocks, "
        f"{s['prefix_cache_evictions']} blocks evicted"
    )
    say(
        f"512 MB cache after part 2: {stats['on']['prefix_cache_bytes'] / mb:.1f} MB in "
        f"{stats['on']['prefix_cache_entries']} blocks (peak {stats['on']['prefix_cache_peak_bytes'] / mb:.1f} MB); "
        f"after part 1: {ttft_stats['on']['prefix_cache_bytes'] / mb:.1f} MB in "
        f"{ttft_stats['on']['prefix_cache_entries']} blocks"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["bench/prefix_cache.py", *map(shlex.quote, sys.argv[1:])])  # the run's own options
    out.write_text(f"$ .venv/bin/python {cmd}\n" + "\n".join(lines) + "\n")
    print(f"\nsaved to {out}")


if __name__ == "__main__":
    main()
