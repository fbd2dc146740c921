"""Per-user adapters served together: each row of a mixed batch decodes with its own user's LoRA.

The reference for every user is the same engine in shared mode with that user's adapter merged into
the weights (the path every shared-mode swap takes): greedy tokens must be equal and log-probs equal
within float32 noise.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch

from openclaw_rl.policy.engine import Final, GenRequest, SamplingParams
from openclaw_rl.policy.protocol import ChatMessage
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.policy.transformers_engine import TransformersEngine
from openclaw_rl.policy.weights import WeightLoadError
from openclaw_rl.runtime.rundir import RunDir

from .conftest import make_config

PROMPT = "Tell me about the sea, in a few words."


def _adapter(root: Path, seed: int, rank: int = 4, targets: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    from peft import LoraConfig, get_peft_model

    from tests.helpers import tiny_model

    base, _ = tiny_model(seed=0)
    torch.manual_seed(seed)
    model = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False)
    )
    with torch.no_grad():  # large enough that every user's greedy reply differs from the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(40)
    out = root / f"adapter-{seed}"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"alice": _adapter(root, 11), "bob": _adapter(root, 12), "carol": _adapter(root, 13)}


def _per_user(tmp_path: Path, model: Path, slots: int, **policy):
    cfg = make_config(tmp_path, model, batch_wait_ms=20, **policy)
    cfg.users.mode = "per_user"  # make_config builds the policy section only
    cfg.users.max_resident = slots
    return cfg


async def _one(engine: TransformersEngine, user: str | None, n: int = 10, text: str = PROMPT) -> Final:
    req = GenRequest(
        [ChatMessage(role="user", content=text)], None, SamplingParams(temperature=0, max_tokens=n)
    )
    req.adapter = user
    async for ev in engine.generate(req):
        if isinstance(ev, Final):
            assert ev.error is None, ev.error
            return ev
    raise AssertionError("no final event")


async def _all(engine: TransformersEngine, users: list[str | None]) -> list[Final]:
    return await asyncio.wait_for(asyncio.gather(*[_one(engine, u) for u in users]), 120)


def _reference(tmp_path: Path, model: Path, adapter: Path | None) -> Final:
    engine = TransformersEngine(make_config(tmp_path, model))
    engine.start()
    try:
        if adapter is not None:
            engine.swap_weights(adapter, 1)
        return asyncio.run(_one(engine, None))
    finally:
        engine.stop()


def test_a_mixed_batch_gives_each_user_what_their_own_merged_model_gives(tiny_model_dir, tmp_path, adapters):
    refs = {u: _reference(tmp_path / u, tiny_model_dir, a) for u, a in adapters.items()}
    refs["dave"] = _reference(tmp_path / "base", tiny_model_dir, None)  # no adapter yet: the base
    assert len({tuple(r.response_ids) for r in refs.values()}) == 4  # the adapters really differ
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=3))
    engine.start()
    try:
        for version, (user, path) in enumerate(adapters.items(), start=1):
            engine.swap_adapter(user, path, version)

        got = asyncio.run(_all(engine, list(refs)))
        assert engine.steps < 4 * 10  # they decoded in shared steps, not one after another
    finally:
        engine.stop()
    for (user, ref), out in zip(refs.items(), got, strict=True):
        assert out.response_ids == ref.response_ids, user
        assert out.logprobs == pytest.approx(ref.logprobs, abs=2e-4), user
    assert [o.policy_version for o in got] == [1, 2, 3, 0]  # each turn records its user's adapter version


def test_least_recently_used_adapters_leave_and_come_back_from_disk(tiny_model_dir, tmp_path, adapters):
    refs = {u: _reference(tmp_path / u, tiny_model_dir, a) for u, a in adapters.items()}
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=1))
    engine.start()
    try:
        for user, path in adapters.items():
            engine.swap_adapter(user, path, 1)
        order = ["alice", "bob", "alice", "carol", "bob"]
        outs = [asyncio.run(_one(engine, u)) for u in order]
        # concurrent users with one slot: served one after another, still each with their own adapter
        mixed = asyncio.run(_all(engine, list(adapters)))
        stats = engine.stats()
    finally:
        engine.stop()
    for user, out in zip(order + list(adapters), outs + list(mixed), strict=True):
        assert out.response_ids == refs[user].response_ids, user
    assert stats["adapters_resident"] == 1 and stats["adapter_evictions"] >= 4
    assert stats["adapter_bytes_per_slot"] > 0


def test_a_new_version_of_one_users_adapter_leaves_the_others_bitwise_unchanged(
    tiny_model_dir, tmp_path, adapters
):
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=2))
    engine.start()
    try:
        engine.swap_adapter("alice", adapters["alice"], 1)
        engine.swap_adapter("bob", adapters["bob"], 1)
        asyncio.run(_all(engine, ["alice", "bob"]))  # both resident
        table = engine._adapters.table
        bob_slot = engine._adapters.slot_of["bob"]
        before = {
            n: (layer.lora_A[bob_slot].clone(), layer.lora_B[bob_slot].clone())
            for n, layer in table.layers.items()
        }
        base_before = {k: v.clone() for k, v in engine.model.state_dict().items() if "lora_" not in k}
        bob_first = asyncio.run(_one(engine, "bob"))
        engine.swap_adapter("alice", adapters["carol"], 2)
        assert engine.adapter_version("alice") == 2 and engine.adapter_version("bob") == 1
        for n, layer in table.layers.items():
            assert torch.equal(layer.lora_A[bob_slot], before[n][0]) and torch.equal(
                layer.lora_B[bob_slot], before[n][1]
            )
        for k, v in engine.model.state_dict().items():
            if "lora_" not in k:
                assert torch.equal(v, base_before[k]), k
        bob_again = asyncio.run(_one(engine, "bob"))
        alice_now = asyncio.run(_one(engine, "alice"))
    finally:
        engine.stop()
    assert bob_again.response_ids == bob_first.response_ids and bob_again.logprobs == bob_first.logprobs
    assert (
        alice_now.response_ids == _reference(tmp_path / "c", tiny_model_dir, adapters["carol"]).response_ids
    )
    assert alice_now.policy_version == 2


def test_prefix_cache_blocks_are_never_another_users_hit(tiny_model_dir, tmp_path, adapters):
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=2, prefix_cache_mb=64))
    engine.start()
    long = "Remember this list: " + ", ".join(f"item {i}" for i in range(60)) + ". What was item 7?"
    try:
        engine.swap_adapter("alice", adapters["alice"], 1)
        asyncio.run(_one(engine, "alice", n=2, text=long))
        hits = engine.stats()["prefix_cache_hit_tokens"]
        asyncio.run(_one(engine, "alice", n=2, text=long))
        own = engine.stats()["prefix_cache_hit_tokens"] - hits
        asyncio.run(_one(engine, "bob", n=2, text=long))  # bob has no adapter: the base, still his own scope
        asyncio.run(_one(engine, None, n=2, text=long))
        other = engine.stats()["prefix_cache_hit_tokens"] - hits - own
    finally:
        engine.stop()
    assert own > 0 and other == 0


def test_a_torn_adapter_file_fails_its_users_request_only(tiny_model_dir, tmp_path, adapters):
    """An adapter read from disk on a request (evicted, or published while the service ran) whose
    file was cut in half: that user's request fails with the reason, every other user is served, and
    the engine reports no problem (the decoding thread used to die, and every request got 503s)."""
    import shutil

    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=1))
    torn = shutil.copytree(adapters["bob"], tmp_path / "torn")
    engine.start()
    try:
        engine.swap_adapter("alice", adapters["alice"], 1)
        engine.swap_adapter("bob", torn, 1)
        asyncio.run(_one(engine, "alice"))  # alice takes the one slot: bob's adapter is on disk only
        (weights,) = torn.glob("adapter_model*.safetensors")
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

        async def bob() -> Final:
            req = GenRequest([ChatMessage(role="user", content=PROMPT)], None, SamplingParams(max_tokens=4))
            req.adapter = "bob"
            return [ev async for ev in engine.generate(req) if isinstance(ev, Final)][0]

        failed = asyncio.run(asyncio.wait_for(bob(), 60))
        assert failed.error is not None and "failed to load" in failed.error and "safetensors" in failed.error
        assert asyncio.run(_one(engine, "alice")).policy_version == 1  # the others are served on
        assert asyncio.run(_one(engine, None)).error is None
        assert engine.health_problem() is None
    finally:
        engine.stop()


def test_a_new_adapter_leaves_nothing_cached_of_the_old_and_forgetting_frees_the_users_blocks(
    tiny_model_dir, tmp_path, adapters
):
    """A name deleted and added again, whose new adapter is published at the same version number as
    the old one was: its prompts must not hit blocks computed with the deleted user's adapter."""
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=2, prefix_cache_mb=64))
    long = "Remember this list: " + ", ".join(f"item {i}" for i in range(60)) + ". What was item 7?"
    engine.start()
    try:
        engine.swap_adapter("alice", adapters["carol"], 1)
        asyncio.run(_one(engine, "alice", n=2, text=long))
        assert engine.stats()["prefix_cache_entries"] > 0
        engine.forget_adapter("alice")  # `users delete alice`
        assert engine.stats()["prefix_cache_entries"] == 0  # nothing of hers stays in memory
        engine.swap_adapter("alice", adapters["carol"], 1)
        asyncio.run(_one(engine, "alice", n=2, text=long))
        hits = engine.stats()["prefix_cache_hit_tokens"]
        engine.swap_adapter("alice", adapters["bob"], 1)  # the re-added alice's first version: v1 again
        again = asyncio.run(_one(engine, "alice", text=long))
        assert engine.stats()["prefix_cache_hit_tokens"] == hits  # no hit on the old adapter's blocks
    finally:
        engine.stop()
    ref_long = TransformersEngine(make_config(tmp_path / "ref_long", tiny_model_dir))
    ref_long.start()
    try:
        ref_long.swap_weights(adapters["bob"], 1)
        expected = asyncio.run(_one(ref_long, None, text=long))
    finally:
        ref_long.stop()
    assert again.response_ids == expected.response_ids


def test_with_non_blocking_off_a_users_reply_is_all_of_one_adapter(tiny_model_dir, tmp_path, adapters):
    """``non_blocking = false``: a new adapter for a user waits until that user's reply in flight is
    done (it comes wholly from the old one), and their next request gets the new one."""
    import threading

    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=2, non_blocking=False))
    old_ref = _reference(tmp_path / "old", tiny_model_dir, adapters["alice"])
    engine.start()
    try:
        engine.swap_adapter("alice", adapters["alice"], 1)

        async def long_reply() -> Final:
            req = GenRequest(
                [ChatMessage(role="user", content=PROMPT)], None, SamplingParams(temperature=0, max_tokens=40)
            )
            req.adapter = "alice"
            swapped = None
            async for ev in engine.generate(req):
                if swapped is None:  # after the first token: the swap lands while the reply decodes
                    swapped = threading.Thread(
                        target=engine.swap_adapter, args=("alice", adapters["carol"], 2)
                    )
                    swapped.start()
                if isinstance(ev, Final):
                    await asyncio.to_thread(swapped.join, 60)
                    return ev
            raise AssertionError("no final event")

        during = asyncio.run(long_reply())
        after = asyncio.run(_one(engine, "alice"))
    finally:
        engine.stop()
    assert during.policy_version == 1 and during.response_ids[:10] == old_ref.response_ids
    long_ref = TransformersEngine(make_config(tmp_path / "old40", tiny_model_dir))
    long_ref.start()
    try:
        long_ref.swap_weights(adapters["alice"], 1)
        req = GenRequest(
            [ChatMessage(role="user", content=PROMPT)], None, SamplingParams(temperature=0, max_tokens=40)
        )

        async def whole() -> Final:
            return [ev async for ev in long_ref.generate(req) if isinstance(ev, Final)][0]

        expected = asyncio.run(whole())
    finally:
        long_ref.stop()
    assert during.response_ids == expected.response_ids  # every token from the adapter it started on
    assert after.policy_version == 2


def test_a_user_waiting_for_a_slot_is_not_overtaken_by_a_resident_users_later_request(
    tiny_model_dir, tmp_path, adapters
):
    """One slot; alice decodes, bob waits for the slot, then alice asks again. Her new request waits
    behind bob's (once bob has waited ``SLOT_WAIT_S``): without that, a user whose requests overlap
    keeps the slot for as long as they keep asking, and bob waits all that time."""
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=1))
    engine.SLOT_WAIT_S = 0.0  # no grace: the order is then the same on any machine
    engine.start()
    done: list[str] = []

    async def ask(who: str, user: str, n: int) -> None:
        req = GenRequest([ChatMessage(role="user", content=PROMPT)], None, SamplingParams(max_tokens=n))
        req.adapter = user
        async for ev in engine.generate(req):
            if isinstance(ev, Final):
                assert ev.error is None, ev.error
                done.append(who)

    async def scene() -> None:
        first = asyncio.create_task(ask("alice-1", "alice", 300))
        while engine.active_count == 0:  # alice's first request is decoding
            await asyncio.sleep(0.005)
        bob = asyncio.create_task(ask("bob", "bob", 4))
        await asyncio.sleep(0.05)  # bob reaches the queue first
        await asyncio.gather(first, bob, ask("alice-2", "alice", 300))

    try:
        engine.swap_adapter("alice", adapters["alice"], 1)
        engine.swap_adapter("bob", adapters["bob"], 1)
        asyncio.run(asyncio.wait_for(scene(), 120))
    finally:
        engine.stop()
    assert done == ["alice-1", "bob", "alice-2"]


def test_bad_adapters_are_refused_and_serving_goes_on(tiny_model_dir, tmp_path, adapters):
    engine = TransformersEngine(_per_user(tmp_path / "multi", tiny_model_dir, slots=2, **{}))
    wide = _adapter(tmp_path, 5, rank=32)  # above [training] lora_rank = 16
    odd = _adapter(tmp_path, 6, targets=("gate_proj", "lm_head"))
    engine.start()
    try:
        with pytest.raises(WeightLoadError, match="rank 32 is above"):
            engine.swap_adapter("alice", wide, 1)
        with pytest.raises(WeightLoadError, match="lm_head"):
            engine.swap_adapter("alice", odd, 1)
        with pytest.raises(WeightLoadError, match="not a LoRA adapter"):
            engine.swap_adapter("alice", tmp_path, 1)
        assert engine.adapter_version("alice") == 0
        assert asyncio.run(_one(engine, "alice")).policy_version == 0  # still the base, still serving
    finally:
        engine.stop()
    shared = TransformersEngine(make_config(tmp_path / "shared", tiny_model_dir))
    shared.start()
    try:
        with pytest.raises(WeightLoadError, match='mode = "per_user"'):
            shared.swap_adapter("alice", adapters["alice"], 1)
    finally:
        shared.stop()


def test_the_admin_route_loads_one_users_adapter_and_a_restart_finds_it(tiny_model_dir, tmp_path, adapters):
    import shutil

    cfg = _per_user(tmp_path / "svc", tiny_model_dir, slots=2)
    run = RunDir.of(cfg)
    dest = run.policy_dir("alice") / "v000001"
    shutil.copytree(adapters["alice"], dest)
    svc = PolicyService(cfg)
    url = svc.start()
    admin = {"Authorization": f"Bearer {run.admin_key()}"}
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post(
                "/v1/admin/load_weights",
                json={"path": str(dest), "version": 1, "user": "alice"},
                headers=admin,
            )
            assert r.status_code == 200 and r.json()["user"] == "alice", r.text
            r = c.post(
                "/v1/admin/load_weights", json={"path": str(dest), "version": 1, "user": "a b"}, headers=admin
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "user"
            body = {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 3,
                "temperature": 0,
                "user": "alice",
            }
            assert c.post("/v1/chat/completions", json=body).json()["policy_version"] == 1
            body["user"] = "bob"
            assert c.post("/v1/chat/completions", json=body).json()["policy_version"] == 0
    finally:
        svc.stop()
    run.publish_policy(1, dest, user="alice")
    again = PolicyService(cfg)
    url = again.start()
    try:
        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 3,
            "temperature": 0,
            "user": "alice",
        }
        with httpx.Client(base_url=url, timeout=60) as c:
            assert c.post("/v1/chat/completions", json=body).json()["policy_version"] == 1
    finally:
        again.stop()
