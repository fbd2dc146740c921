"""The embedded engine's prefix cache: a turn prefills only its new tokens, and changes nothing else.

With the cache on, every response must equal the one without it, token for token (greedy), with the same
recorded log-probs; a cache never outlives the weights it was computed with; memory stays under the bound.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from openclaw_rl.policy import transformers_engine
from openclaw_rl.policy.engine import Delta, Final, GenRequest, SamplingParams
from openclaw_rl.policy.prefix_cache import BLOCK_TOKENS, PrefixCache
from openclaw_rl.policy.protocol import ChatMessage
from openclaw_rl.policy.transformers_engine import TransformersEngine

from .conftest import make_config

SYSTEM = "You are a coding agent. Tools: " + " ".join(
    f'{{"name": "tool_{i}", "description": "does step {i} of the plan", "parameters": {{"arg{i}": "string"}}}}'
    for i in range(12)
)
USERS = [
    "List the files in the repository.",
    "Now open the README and summarise it in one line.",
    "Run the tests and tell me which ones fail.",
    "Thanks. What should we fix first?",
]


# ---------------------------------------------------------------------------------------------- helpers
def _engine(tmp_path: Path, model: Any, name: str, **policy: Any) -> TransformersEngine:
    policy.setdefault("batch_wait_ms", 0)
    engine = TransformersEngine(make_config(tmp_path / name, model, **policy))
    engine.start()
    return engine


def _ids(engine: TransformersEngine, text: str) -> list[int]:
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


async def _gen(
    engine: TransformersEngine,
    prompt: list[int],
    n: int,
    delay: float = 0.0,
    temp: float = 0.0,
    seed: int | None = None,
) -> Final:
    await asyncio.sleep(delay)
    req = GenRequest(
        [ChatMessage(role="user", content="-")],
        None,
        SamplingParams(temperature=temp, max_tokens=n, seed=seed),
        prompt_ids=list(prompt),
    )
    async for ev in engine.generate(req):
        if isinstance(ev, Final):
            assert ev.error is None, ev.error
            return ev
    raise AssertionError("no final event")


def _same(a: Final, b: Final) -> None:
    assert a.prompt_ids == b.prompt_ids
    assert a.response_ids == b.response_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def _conversation(
    engine: TransformersEngine, turns: int, n: int = 12, before_turn: Any = None
) -> list[Final]:
    """A multi-turn session: each prompt is the last prompt + its response + a new user message."""

    async def run() -> list[Final]:
        out: list[Final] = []
        prompt = _ids(engine, SYSTEM + "\nUser: " + USERS[0] + "\nAssistant:")
        for t in range(turns):
            if before_turn is not None:
                before_turn()
            final = await _gen(engine, prompt, n)
            out.append(final)
            prompt = prompt + final.response_ids + _ids(engine, "\nUser: " + USERS[t + 1] + "\nAssistant:")
        return out

    return asyncio.run(run())


@pytest.fixture
def engines(tiny_model_dir, tmp_path):
    """A tiny-model engine with the prefix cache (the default bound) and one without it."""
    on = _engine(tmp_path, tiny_model_dir, "on")
    off = _engine(tmp_path, tiny_model_dir, "off", prefix_cache_mb=0)
    yield on, off
    on.stop()
    off.stop()


# ---------------------------------------------------------------------------------------------- engine
def test_multi_turn_equals_no_cache_and_prefills_only_new_tokens(engines):
    on, off = engines
    counts: list[int] = []  # prompt tokens prefilled so far, before each turn and after the last
    cached = _conversation(
        on, 3, before_turn=lambda: counts.append(on.stats()["prefix_cache_prefill_tokens"])
    )
    counts.append(on.stats()["prefix_cache_prefill_tokens"])
    plain = _conversation(off, 3)
    for a, b in zip(cached, plain, strict=True):
        _same(a, b)
    p1, p2, p3 = (len(f.prompt_ids) for f in cached)
    assert p1 > 4 * BLOCK_TOKENS
    assert counts[1] - counts[0] == p1  # turn 1: the whole prompt
    for t, (prev, cur) in enumerate([(cached[0], p2), (cached[1], p3)], start=1):
        prefilled = counts[t + 1] - counts[t]
        new = cur - len(prev.prompt_ids) - len(prev.response_ids)  # the new user message
        # only the new tokens, plus at most a block's tail of the previous turn (and its last token)
        assert 0 < prefilled <= new + BLOCK_TOKENS, (t, prefilled, new)
    stats = on.stats()
    assert stats["prefix_cache_hits"] == 2 and stats["prefix_cache_misses"] == 1
    assert stats["prefix_cache_hit_tokens"] == p2 + p3 - (counts[3] - counts[1])
    assert 0 < stats["prefix_cache_bytes"] <= stats["prefix_cache_max_bytes"] == 512 * 2**20
    assert stats["prefix_cache_entries"] > 0


def test_cached_turn_records_the_models_own_logprobs(engines, tiny_model_dir):
    """Sampled (temperature 0.7, seeded) on a cached prefix: the recorded log-probs are what a training
    forward pass computes, and the tokens those of the uncached engine."""
    from openclaw_rl.runtime.logprobs import sequence_logprobs
    from openclaw_rl.runtime.models import load_model

    on, off = engines

    async def two_turns(engine: TransformersEngine) -> Final:
        p1 = _ids(engine, SYSTEM + "\nUser: " + USERS[0] + "\nAssistant:")
        first = await _gen(engine, p1, 10, temp=0.7, seed=1)
        p2 = p1 + first.response_ids + _ids(engine, "\nUser: " + USERS[1] + "\nAssistant:")
        return await _gen(engine, p2, 16, temp=0.7, seed=2)

    turn = asyncio.run(two_turns(on))
    assert on.stats()["prefix_cache_hit_tokens"] > len(turn.prompt_ids) // 2
    _same(turn, asyncio.run(two_turns(off)))
    model, _ = load_model(str(tiny_model_dir))
    trainer_lp, _, _ = sequence_logprobs(model, turn.prompt_ids, turn.response_ids)
    torch.testing.assert_close(trainer_lp, torch.tensor(turn.logprobs), rtol=1e-4, atol=1e-4)


def test_shared_system_prompt_and_one_batch_with_different_cached_lengths(engines, monkeypatch):
    """Sessions sharing a system prompt reuse its blocks; rows admitted together — a session's second
    turn (long cached prefix), new sessions (the system prompt cached), a stranger (nothing cached) —
    each get what they get alone without the cache, then more join the running batch."""
    on, off = engines
    groups: list[list[int]] = []
    original = on._prefill_group

    def spy(rows, blocks):
        groups.append([len(b) * BLOCK_TOKENS for b in blocks])
        return original(rows, blocks)

    on._prefill_group = spy  # type: ignore[method-assign]
    compacted: list[tuple[int, int]] = []
    compact = transformers_engine._compact

    def compact_spy(mask, cache):
        out = compact(mask, cache)
        compacted.append((int(mask.sum()), int(out.sum())))
        return out

    monkeypatch.setattr(transformers_engine, "_compact", compact_spy)

    def scenario(engine: TransformersEngine) -> list[Final]:
        sys_ids = _ids(engine, SYSTEM)

        def user(i: int, text: str) -> list[int]:
            return _ids(engine, f"\nSession {i}. User: {text}\nAssistant:")

        async def run() -> list[Final]:
            a1 = await _gen(engine, sys_ids + user(0, USERS[0]), 40)
            a2 = a1.prompt_ids + a1.response_ids + user(0, USERS[1])
            prompts = [
                a2,
                sys_ids + user(1, USERS[2]),
                sys_ids + user(2, USERS[3] + " " + USERS[0]),
                _ids(engine, "A different system prompt entirely. " * 8),
            ]
            # admitted as one batch: hold the engine's lock while every request queues
            with engine._cv:
                tasks = [asyncio.ensure_future(_gen(engine, p, 8 + 3 * i)) for i, p in enumerate(prompts)]
                await asyncio.sleep(0.2)
            together = await asyncio.gather(*tasks)
            # then: a long generation running, cached turns joining it at step boundaries
            b2 = together[1].prompt_ids + together[1].response_ids + user(1, USERS[0])
            c2 = together[2].prompt_ids + together[2].response_ids + user(2, USERS[1])
            joined = await asyncio.gather(
                _gen(engine, _ids(engine, "Tell me a long story. " * 5), 30),
                _gen(engine, b2, 10, delay=0.05),
                _gen(engine, c2, 6, delay=0.1),
            )
            return [a1, *together, *joined]

        return asyncio.run(run())

    cached = scenario(on)
    plain = scenario(off)
    for a, b in zip(cached, plain, strict=True):
        _same(a, b)
    batch = next(g for g in groups if len(g) == 3)  # the cached rows of the 4 admitted together
    assert len(set(batch)) >= 2 and min(batch) >= len(_ids(on, SYSTEM)) - BLOCK_TOKENS
    assert [0] in groups  # the stranger, prefilled apart
    assert compacted and all(a == b for a, b in compacted)  # rows made contiguous, no token lost
    assert on.stats()["prefix_cache_hits"] >= 5


def test_sessions_starting_together_prefill_their_system_prompt_once(engines):
    """Four sessions with one system prompt, admitted in one step on an empty cache: the first prefills
    it, the others wait a step and start from its blocks — and each gets what it gets without the cache."""
    on, off = engines

    def start_together(engine: TransformersEngine) -> list[Final]:
        sys_ids = _ids(engine, SYSTEM)
        prompts = [sys_ids + _ids(engine, f"\nSession {i}. User: {USERS[i]}\nAssistant:") for i in range(4)]

        async def run() -> list[Final]:
            with engine._cv:  # every request queued before the engine admits any
                tasks = [asyncio.ensure_future(_gen(engine, p, 10)) for p in prompts]
                await asyncio.sleep(0.2)
            return list(await asyncio.gather(*tasks))

        return asyncio.run(run())

    cached, plain = start_together(on), start_together(off)
    for a, b in zip(cached, plain, strict=True):
        _same(a, b)
    system = len(_ids(on, SYSTEM))
    total = sum(len(f.prompt_ids) for f in cached)
    assert off.stats()["prefix_cache_prefill_tokens"] == total
    assert on.stats()["prefix_cache_prefill_tokens"] <= total - 3 * (system - BLOCK_TOKENS)
    assert on.stats()["prefix_cache_hits"] == 3


def test_weight_swap_drops_the_cache(tiny_model_dir, weight_dirs, tmp_path):
    engine = _engine(tmp_path, tiny_model_dir, "swap")
    fresh = _engine(tmp_path, weight_dirs["full"], "fresh", prefix_cache_mb=0)
    try:
        first, second = _conversation(engine, 2)
        assert engine.stats()["prefix_cache_hit_tokens"] > 0
        engine.swap_weights(weight_dirs["full"], 1)
        stats = engine.stats()
        assert stats["prefix_cache_bytes"] == 0 and stats["prefix_cache_entries"] == 0
        hit = stats["prefix_cache_hit_tokens"]
        again = asyncio.run(_gen(engine, second.prompt_ids, 12))
        assert engine.stats()["prefix_cache_hit_tokens"] == hit  # nothing computed by the old weights
        assert again.policy_version == 1
        _same(again, asyncio.run(_gen(fresh, second.prompt_ids, 12)))

        # a swap while a row generates (non_blocking): its keys/values mix two policies, none is stored
        prompt = _ids(engine, "Count slowly from one to one hundred. " * 6)

        async def straddle() -> Final:
            req = GenRequest(
                [ChatMessage(role="user", content="-")],
                None,
                SamplingParams(temperature=0, max_tokens=300),
                prompt_ids=prompt,
            )
            final = None
            async for ev in engine.generate(req):
                if isinstance(ev, Delta) and engine.mid_batch_swaps == 0:
                    await asyncio.to_thread(engine.swap_weights, weight_dirs["full"], 2)
                if isinstance(ev, Final):
                    final = ev
            assert final is not None
            return final

        straddler = asyncio.run(straddle())
        assert engine.mid_batch_swaps == 1 and straddler.policy_version == 1
        stats = engine.stats()
        assert stats["prefix_cache_entries"] == 0 and stats["prefix_cache_bytes"] == 0
        hit = stats["prefix_cache_hit_tokens"]
        asyncio.run(_gen(engine, straddler.prompt_ids + straddler.response_ids + prompt[:5], 2))
        assert engine.stats()["prefix_cache_hit_tokens"] == hit
    finally:
        engine.stop()
        fresh.stop()


def test_eviction_keeps_the_engine_under_its_bound(tiny_model_dir, tmp_path):
    """1 MB holds ~2,000 tiny-model tokens: five ~600-token prompts evict the oldest, keep the newest."""
    engine = _engine(tmp_path, tiny_model_dir, "evict", prefix_cache_mb=1)
    try:
        prompts = [
            _ids(engine, f"Document {i}: " + " ".join(f"w{i}x{j}" for j in range(200))) for i in range(5)
        ]
        assert all(len(p) > 500 for p in prompts)

        async def run() -> list[int]:
            peaks = []
            for p in prompts:
                await _gen(engine, p, 2)
                peaks.append(engine.stats()["prefix_cache_bytes"])
            return peaks

        held = asyncio.run(run())
        stats = engine.stats()
        bound = 2**20
        assert max(held) <= bound and stats["prefix_cache_peak_bytes"] <= bound
        assert stats["prefix_cache_evictions"] > 0
        cache = engine._prefix
        assert cache is not None
        assert cache.cached_tokens(prompts[-1], engine.cache_scope()) >= len(prompts[-1]) - BLOCK_TOKENS
        assert cache.cached_tokens(prompts[0], engine.cache_scope()) == 0
    finally:
        engine.stop()


def test_zero_means_off(tiny_model_dir, tmp_path):
    engine = _engine(tmp_path, tiny_model_dir, "zero", prefix_cache_mb=0)
    try:
        finals = _conversation(engine, 2)
        assert engine._prefix is None
        stats = engine.stats()
        assert stats["prefix_cache_prefill_tokens"] == sum(len(f.prompt_ids) for f in finals)
        assert all(v == 0 for k, v in stats.items() if k != "prefix_cache_prefill_tokens")
    finally:
        engine.stop()


# ---------------------------------------------------------------------------------------------- the cache
def _seq_kv(tokens: list[int]) -> Any:
    """A fake ``kv_of``: a [2, 1, len, 2] tensor whose values are the token ids."""
    full = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None].expand(2, 1, -1, 2).contiguous()
    return lambda a, b: full[:, :, a:b]  # a view: the cache must copy it


def test_lru_evicts_least_recent_leaves_first_and_stays_under_bound():
    bt = 4
    block_bytes = 2 * 1 * bt * 2 * 4
    cache = PrefixCache(5 * block_bytes, block_tokens=bt)
    a, b, c = list(range(0, 9)), list(range(100, 109)), list(range(200, 209))
    assert cache.insert(a, 0, _seq_kv(a)) == 2 and cache.insert(b, 0, _seq_kv(b)) == 2
    assert cache.match(a, 0) and cache.bytes == 4 * block_bytes  # a is now more recent than b
    assert cache.insert(c, 0, _seq_kv(c)) == 2  # needs one block: b's last
    assert cache.bytes <= cache.max_bytes and cache.evictions == 1
    assert (
        cache.cached_tokens(a, 0) == 8 and cache.cached_tokens(c, 0) == 8 and cache.cached_tokens(b, 0) == 4
    )
    # every parent is more recent than its children: the next to go is a leaf
    first = cache.lru_keys()[0]
    assert first[2] == tuple(b[:4]) and len(cache) == 5
    # a sequence sharing a's first block adds only its own
    d = a[:4] + [7, 7, 7, 7, 7]
    assert cache.insert(d, 0, _seq_kv(d)) == 1 and cache.cached_tokens(d, 0) == 8
    # a chain longer than the bound keeps the prefix that fits
    long = list(range(300, 330))
    assert cache.insert(long, 0, _seq_kv(long)) == 5
    assert cache.bytes == cache.max_bytes and cache.peak_bytes <= cache.max_bytes
    assert cache.cached_tokens(long, 0) == 20 and cache.cached_tokens(a, 0) == 0


def test_blocks_own_their_memory_and_are_per_epoch():
    cache = PrefixCache(10**6, block_tokens=4)
    seq = list(range(10))
    cache.insert(seq, 3, _seq_kv(seq))
    blocks = cache.match(seq + [99], 3)
    assert [int(b.kv[0, 0, 0, 0]) for b in blocks] == [0, 4]
    assert all(b.kv.untyped_storage().nbytes() == b.nbytes for b in blocks)
    assert cache.match(seq, 4) == []  # another weights epoch sees nothing
    assert len(cache.match(seq[:8], 3)) == 1  # the last token is always left to prefill
    assert len(cache.match(seq[:8], 3, limit=8)) == 2
    assert cache.stats()["prefix_cache_hits"] == 3 and cache.stats()["prefix_cache_misses"] == 1
    cache.clear()
    assert cache.bytes == 0 and cache.match(seq, 3) == []


# ---------------------------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_real_model_chat_turns_equal_without_cache(embedded_model_dir, tmp_path):
    """SmolLM2 with its chat template (prompts re-tokenised from text each turn, as the server does)."""
    on = _engine(tmp_path, embedded_model_dir, "real-on")
    off = _engine(tmp_path, embedded_model_dir, "real-off", prefix_cache_mb=0)

    def chat(engine: TransformersEngine) -> list[Final]:
        async def run() -> list[Final]:
            messages = [ChatMessage(role="system", content=SYSTEM)]
            out = []
            for text in USERS[:3]:
                messages.append(ChatMessage(role="user", content=text))
                req = GenRequest(list(messages), None, SamplingParams(temperature=0, max_tokens=12))
                async for ev in engine.generate(req):
                    if isinstance(ev, Final):
                        out.append(ev)
                messages.append(ChatMessage(role="assistant", content=out[-1].text))
            return out

        return asyncio.run(run())

    try:
        cached, plain = chat(on), chat(off)
        for a, b in zip(cached, plain, strict=True):
            _same(a, b)
        stats = on.stats()
        assert stats["prefix_cache_hit_tokens"] >= len(cached[1].prompt_ids) - 2 * BLOCK_TOKENS
        assert stats["prefix_cache_prefill_tokens"] < off.stats()["prefix_cache_prefill_tokens"] / 2
    finally:
        on.stop()
        off.stop()
