"""What holding replies to a grammar costs the embedded engine's decoding.

Eight concurrent requests on the real embedded model (SmolLM2-135M-Instruct), decoded together, of
three kinds, their rounds interleaved so that the machine's drift hits all alike:

* ``free``: plain text;
* ``json_schema``: ``response_format`` with a schema whose one field is free text (so replies run on);
* ``forced_call``: ``tool_choice`` naming a function with a free-text argument.

Aggregate decode tokens/s per round: tokens generated after each request's first, over the time
from the first token of the round to its last. Prints the median per kind, its ratio to ``free``,
the mean reply length (a reply that closes its JSON early leaves a smaller batch for the rest of
the round, which lowers the aggregate rate by itself) and the grammar's own time per guided token
(xgrammar's bitmask fill + apply + accept on the engine thread, timed around those calls).

    .venv/bin/python bench/guided.py                 # ~3 minutes on 2 idle cores
    .venv/bin/python bench/guided.py --repeats 1 --tokens 16   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import build_config  # noqa: E402
from openclaw_rl.policy import guided  # noqa: E402
from openclaw_rl.policy.engine import Delta, Final, GenRequest, SamplingParams  # noqa: E402
from openclaw_rl.policy.protocol import ChatMessage, NamedToolChoice, ResponseFormat, ToolDef  # noqa: E402
from openclaw_rl.policy.transformers_engine import TransformersEngine  # noqa: E402

NOTES = {"type": "object", "properties": {"notes": {"type": "string"}}, "required": ["notes"]}
KINDS = ("free", "json_schema", "forced_call")
ASK = "Write detailed notes on how to plan a week-long hiking trip."


def request(kind: str, tokens: int) -> GenRequest:
    tools = choice = fmt = None
    if kind == "json_schema":
        fmt = ResponseFormat.model_validate(
            {"type": "json_schema", "json_schema": {"name": "n", "schema": NOTES}}
        )
    if kind == "forced_call":
        tools = [
            ToolDef.model_validate({"type": "function", "function": {"name": "save", "parameters": NOTES}})
        ]
        choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "save"}})
    return GenRequest(
        [ChatMessage(role="user", content=ASK)],
        tools,
        SamplingParams(temperature=0.7, max_tokens=tokens, seed=None),
        tool_choice=choice,
        response_format=fmt,
    )


async def one(engine: TransformersEngine, req: GenRequest, starts: list[float]) -> int:
    n = 0
    async for ev in engine.generate(req):
        if isinstance(ev, Delta):
            if n == 0:
                starts.append(time.perf_counter())
            n += len(ev.token_ids)
        if isinstance(ev, Final) and ev.error:
            raise RuntimeError(ev.error)
    return n


GRAMMAR_S = [0.0, 0]  # seconds in the grammar's calls, guided tokens


def timed(fn: Any) -> Any:
    def wrapper(self: Any, *a: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(self, *a)
        finally:
            GRAMMAR_S[0] += time.perf_counter() - t

    return wrapper


def count_accept(fn: Any) -> Any:
    def wrapper(self: Any, *a: Any) -> Any:
        GRAMMAR_S[1] += 1
        return fn(self, *a)

    return wrapper


async def round_rate(
    engine: TransformersEngine, kind: str, sessions: int, tokens: int
) -> tuple[float, float]:
    """(aggregate decode tokens/s, mean tokens per reply)."""
    reqs = [request(kind, tokens) for _ in range(sessions)]
    for r in reqs:  # tokenise and compile before the clock starts, as the serving layer does
        await asyncio.to_thread(engine.prepare, r)
    starts: list[float] = []
    counts = await asyncio.gather(*(one(engine, r, starts) for r in reqs))
    end = time.perf_counter()
    return (sum(counts) - sessions) / max(end - min(starts), 1e-9), sum(counts) / sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8, help="concurrent requests per round")
    ap.add_argument("--tokens", type=int, default=96, help="max tokens per request")
    ap.add_argument("--repeats", type=int, default=4, help="rounds per kind")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ocl-guided-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the engine's run folder
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp)},
            "policy_service": {"model": "smollm2-135m-instruct", "prefix_cache_mb": 0},
        },
        environ={},
    )
    guided.RowGrammar.mask = timed(guided.RowGrammar.mask)  # type: ignore[method-assign]
    guided.RowGrammar.accept = count_accept(timed(guided.RowGrammar.accept))  # type: ignore[method-assign]
    engine = TransformersEngine(cfg)
    engine.start()
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    lengths: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        asyncio.run(round_rate(engine, "json_schema", 1, 4))  # warm-up: loads xgrammar, builds its vocabulary
        GRAMMAR_S[:] = [0.0, 0]
        for r in range(args.repeats):
            order: Any = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
            for kind in order:
                rate, length = asyncio.run(round_rate(engine, kind, args.sessions, args.tokens))
                rates[kind].append(rate)
                lengths[kind].append(length)
                print(
                    f"  round {r} {kind:>12}: {rate:6.1f} tokens/s, {length:5.1f} tokens a reply",
                    file=sys.stderr,
                )
    finally:
        engine.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"{args.sessions} concurrent requests, SmolLM2-135M float32, up to {args.tokens} tokens each, "
        f"median of {args.repeats} rounds"
    )
    print(f"{'kind':>12} {'tokens/s':>9} {'vs free':>8} {'tokens a reply':>15}")
    for kind in KINDS:
        mean_len = statistics.mean(lengths[kind])
        print(f"{kind:>12} {med[kind]:>9.1f} {med[kind] / med['free']:>7.2f}x {mean_len:>15.1f}")
    per_token_ms = 1e3 * GRAMMAR_S[0] / max(GRAMMAR_S[1], 1)
    print(
        f"grammar time per guided token: {per_token_ms:.3f} ms (mask + accept), against "
        f"{1e3 / med['free']:.1f} ms of decoding per token at the free rate"
    )


if __name__ == "__main__":
    main()
