"""Decode-step benchmark: the embedded engine's growing cache against transformers' DynamicCache.

One session at a time on the real embedded model (SmolLM2-135M-Instruct), both engines in this
process sharing one loaded copy of the weights, their requests interleaved so that the machine's
drift hits both alike. Each request is a prompt of about N tokens (1k, 4k, 7k) ending in a count
the model continues, greedy, so the reply runs long; decode tokens/s is measured from the stream
(tokens after the first, over the time after the first, so prefill is not in it). Prints, per
context length, the median tokens/s of each cache and their ratio (target: >= 2x at 4k).

    .venv/bin/python bench/decode.py                  # ~6 minutes on 2 idle cores
    .venv/bin/python bench/decode.py --contexts 1000 --repeats 1 --tokens 16   # a smoke run
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
from openclaw_rl.policy.engine import Delta, Final, GenRequest, SamplingParams  # noqa: E402
from openclaw_rl.policy.protocol import ChatMessage  # noqa: E402
from openclaw_rl.policy.transformers_engine import TransformersEngine  # noqa: E402
from openclaw_rl.runtime.models import load_model  # noqa: E402

KINDS = ("dynamic", "growing")


def make_engine(model: Any, tokenizer: Any, tmp: Path, kind: str) -> TransformersEngine:
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp / kind)},
            # no prefix cache: every request prefills its whole prompt, so both engines start equal
            "policy_service": {"model": "smollm2-135m-instruct", "max_model_len": 8192, "prefix_cache_mb": 0},
        },
        environ={},
    )
    engine = TransformersEngine(cfg, model, tokenizer)
    engine.cache_kind = kind
    engine.start()
    return engine


def prompt_ids(tokenizer: Any, target: int, reply_room: int) -> list[int]:
    """About ``target`` tokens of numbered notes, then a count for the model to go on with."""
    lines, text = [], ""
    i = 0
    while True:
        lines.append(f"Note {i}: the build on machine {i % 17} finished in {(i * 37) % 91} seconds.")
        i += 1
        if i % 20 == 0:
            text = "\n".join(lines)
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= target - 60:
                break
    msgs = [
        {
            "role": "user",
            "content": text + "\n\nIgnore the notes. Count from 1 to 1000, separated by commas.",
        },
    ]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = [int(t) for t in ids] + tokenizer("1, 2, 3, 4, 5,", add_special_tokens=False)["input_ids"]
    assert len(ids) + reply_room <= 8192, len(ids)
    return ids


async def decode_rate(engine: TransformersEngine, ids: list[int], tokens: int) -> tuple[float, int]:
    """(decode tokens/s after the first token, tokens generated)."""
    req = GenRequest(
        [ChatMessage(role="user", content="-")],
        None,
        SamplingParams(temperature=0.0, max_tokens=tokens),
        prompt_ids=list(ids),
    )
    first = None
    n = 0
    async for ev in engine.generate(req):
        if isinstance(ev, Delta):
            n += len(ev.token_ids)
            if first is None:
                first = time.perf_counter()
        if isinstance(ev, Final):
            if ev.error:
                raise RuntimeError(ev.error)
            end = time.perf_counter()
            assert first is not None
            return (n - 1) / max(end - first, 1e-9), n
    raise RuntimeError("no final event")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1000,4000,7000", help="prompt lengths in tokens")
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per request")
    ap.add_argument("--repeats", type=int, default=3, help="requests per engine and context")
    args = ap.parse_args()
    model, tokenizer = load_model("smollm2-135m-instruct")
    tmp = Path(tempfile.mkdtemp(prefix="ocl-decode-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the engines' run folders
    engines = {k: make_engine(model, tokenizer, tmp, k) for k in KINDS}
    rows = []
    try:
        for ctx in [int(c) for c in args.contexts.split(",")]:
            ids = prompt_ids(tokenizer, ctx, args.tokens)
            rates: dict[str, list[float]] = {k: [] for k in KINDS}
            for r in range(args.repeats):
                order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))  # neither always goes first
                for k in order:
                    rate, n = asyncio.run(decode_rate(engines[k], ids, args.tokens))
                    rates[k].append(rate)
                    print(f"  [{ctx}] {k:>7}: {rate:6.1f} tokens/s ({n} tokens)", file=sys.stderr, flush=True)
            med = {k: statistics.median(v) for k, v in rates.items()}
            rows.append((len(ids), med["dynamic"], med["growing"], med["growing"] / med["dynamic"]))
    finally:
        for e in engines.values():
            e.stop()
    print(
        f"single-session decode, SmolLM2-135M float32, {args.tokens} tokens per request, median of {args.repeats}"
    )
    print(f"{'context':>8} {'DynamicCache tok/s':>19} {'growing tok/s':>14} {'ratio':>7}")
    for n, d, g, ratio in rows:
        print(f"{n:>8} {d:>19.1f} {g:>14.1f} {ratio:>6.2f}x")


if __name__ == "__main__":
    main()
