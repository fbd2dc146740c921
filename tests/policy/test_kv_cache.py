"""The engine's growing key/value cache: decode writes into spare room, and nothing it serves changes.

Every reply from the growing cache must equal transformers' own ``DynamicCache`` token for token
(greedy) with the same recorded log-probs, through everything the engine does with a batch cache:
prefix-cache hits, rows joining a running batch, rows finishing at different steps.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from openclaw_rl.policy.kv_cache import MIN_SPARE, GrowingCache, GrowingLayer

from .test_prefix_cache import SYSTEM, USERS, _conversation, _engine, _gen, _ids, _same


def test_appending_token_by_token_equals_concatenation_and_rarely_reallocates():
    torch.manual_seed(0)
    layer = GrowingLayer()
    prompt_k, prompt_v = torch.randn(2, 3, 100, 8), torch.randn(2, 3, 100, 8)
    layer.update(prompt_k, prompt_v)
    ref_k, ref_v = [prompt_k], [prompt_v]
    buffers = {layer._k.data_ptr()}
    for _ in range(1000):
        k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
        keys, values = layer.update(k, v)
        ref_k.append(k)
        ref_v.append(v)
        buffers.add(layer._k.data_ptr())
    assert torch.equal(keys, torch.cat(ref_k, dim=2))
    assert torch.equal(values, torch.cat(ref_v, dim=2))
    assert layer.get_seq_length() == 1100
    # 1,000 appends: the first buffer has MIN_SPARE spare columns, each later one a quarter more
    assert len(buffers) <= 4, len(buffers)
    assert layer.capacity >= 1100


def test_a_tensor_handed_in_is_never_written_to():
    shared_k, shared_v = torch.randn(1, 3, 40, 8), torch.randn(1, 3, 40, 8)
    before_k, before_v = shared_k.clone(), shared_v.clone()
    big = torch.randn(1, 3, 64, 8)  # a view with room after it, as a prefix-cache slice would be
    view = big[:, :, :40]
    cache = GrowingCache([(shared_k, shared_v), (view, view)])
    for layer_idx in (0, 1):
        cache.update(torch.ones(1, 3, 1, 8), torch.ones(1, 3, 1, 8), layer_idx)
    assert torch.equal(shared_k, before_k) and torch.equal(shared_v, before_v)
    assert torch.equal(big[:, :, 40:], big[:, :, 40:].clone())  # still what randn wrote
    assert not torch.equal(big[:, :, 40], torch.ones(1, 3, 8))
    assert cache.get_seq_length() == 41
    assert cache.layers[0].capacity >= 41 + MIN_SPARE


def test_selecting_rows_keeps_their_contents_and_room():
    layer = GrowingLayer()
    k = torch.arange(3 * 2 * 10 * 4, dtype=torch.float32).reshape(3, 2, 10, 4)
    layer.update(k, k.clone())
    cap = layer.capacity
    layer.batch_select_indices(torch.tensor([0, 2]))
    assert torch.equal(layer.keys, k[[0, 2]])
    assert layer.capacity == cap
    ptr = layer._k.data_ptr()
    layer.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
    assert layer._k.data_ptr() == ptr  # the step after a row finished did not reallocate


@pytest.fixture
def kinds(tiny_model_dir, tmp_path):
    growing = _engine(tmp_path, tiny_model_dir, "growing")
    dynamic = _engine(tmp_path, tiny_model_dir, "dynamic")
    dynamic.cache_kind = "dynamic"
    yield growing, dynamic
    growing.stop()
    dynamic.stop()


def test_multi_turn_session_with_prefix_hits_equals_the_dynamic_cache(kinds):
    growing, dynamic = kinds
    a = _conversation(growing, 3, n=40)
    b = _conversation(dynamic, 3, n=40)
    for x, y in zip(a, b, strict=True):
        _same(x, y)
    # turns 2 and 3 started from cached keys/values (the path that adopts prefix-cache tensors)
    assert growing.stats()["prefix_cache_prefill_tokens"] < sum(len(f.prompt_ids) for f in a)


def test_rows_joining_and_finishing_mid_batch_equal_the_dynamic_cache(kinds):
    """Different prompt lengths, reply lengths and arrival times: merges, finished rows dropped,
    shared padding columns cut, prefix-cache compaction."""

    async def burst(engine) -> list:
        prompts = [_ids(engine, SYSTEM[: 60 * (i + 1)] + "\nUser: " + USERS[i % 4]) for i in range(6)]
        return await asyncio.gather(
            *(_gen(engine, p, n=8 + 9 * i, delay=0.02 * (i % 3)) for i, p in enumerate(prompts))
        )

    for _round in range(2):  # the second round hits the prefix cache the first filled
        a = asyncio.run(burst(kinds[0]))
        b = asyncio.run(burst(kinds[1]))
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        assert len({len(f.response_ids) for f in a}) > 1  # rows did finish at different steps
