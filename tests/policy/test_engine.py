"""The embedded engine's continuous batching gives each request what it would get alone."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_rl.policy.engine import Final, GenRequest, SamplingParams
from openclaw_rl.policy.protocol import ChatMessage
from openclaw_rl.policy.transformers_engine import TransformersEngine

from .conftest import make_config

PROMPTS = ["Hi", "Write a long story about a dragon who lives in the mountains and loves apples.", "2+2?"]


def test_batched_and_joining_requests_match_solo_runs(tiny_model_dir, tmp_path):
    engine = TransformersEngine(make_config(tmp_path, tiny_model_dir, batch_wait_ms=0))
    engine.start()

    async def one(text: str, n: int, delay: float = 0.0, seed: int | None = None, temp: float = 0.0) -> Final:
        await asyncio.sleep(delay)
        req = GenRequest(
            [ChatMessage(role="user", content=text)],
            None,
            SamplingParams(temperature=temp, max_tokens=n, seed=seed),
        )
        async for ev in engine.generate(req):
            if isinstance(ev, Final):
                return ev
        raise AssertionError("no final event")

    async def run() -> None:
        solo = [await one(p, 12 + 4 * i) for i, p in enumerate(PROMPTS)]
        seeded = await one(PROMPTS[1], 8, seed=5, temp=0.9)
        # together, the later ones joining a batch that is already decoding, lengths differing
        together = await asyncio.gather(
            *[one(p, 12 + 4 * i, delay=0.02 * i) for i, p in enumerate(PROMPTS)],
            one(PROMPTS[1], 8, delay=0.01, seed=5, temp=0.9),
        )
        for a, b in zip(solo + [seeded], together, strict=True):
            assert a.response_ids == b.response_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.prompt_ids == b.prompt_ids and a.text == b.text
        assert engine.steps > 0

    try:
        asyncio.run(run())
    finally:
        engine.stop()
