"""Weight swaps while requests are in flight, and the forwarding backends against a second instance
of this service acting as the external engine."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from openclaw_rl.policy.weights import WeightLoadError
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.types import Turn

from .conftest import make_config

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

USER = [{"role": "user", "content": "Count to ten."}]


def _all_turns(store_path) -> list[Turn]:
    with sqlite3.connect(store_path) as db:
        return [
            Turn.model_validate_json(r[0]) for r in db.execute("SELECT data FROM turns ORDER BY updated_at")
        ]


def test_swap_during_in_flight_requests_completes_them_all(start_service, tiny_model_dir, weight_dirs):
    """non_blocking = false: the swap waits for the running batch; responses are single-version."""
    svc, url = start_service(tiny_model_dir, "swap", non_blocking=False)
    started = threading.Barrier(5)
    results: list[tuple[int, int, str]] = []

    def stream_one(i: int) -> None:
        seen = 0
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            timeout=120,
            json={
                "messages": USER,
                "stream": True,
                "max_tokens": 120,
                "temperature": 0,
                "session_id": f"inflight-{i}",
            },
        ) as s:
            pieces = []
            for line in s.iter_lines():
                seen += line.startswith("data: ")
                if seen == 2 and line.startswith("data: "):  # the first sampled token: it is generating
                    started.wait(60)
                pieces.append(line)
            results.append((s.status_code, i, pieces[-2] if len(pieces) > 1 else ""))

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(60)  # every request is generating
    assert svc.swap_weights(weight_dirs["full"], 1) == 1
    for t in threads:
        t.join(120)
    assert sorted(r[0] for r in results) == [200] * 4
    assert all(r[2] == "data: [DONE]" for r in results)
    for i in range(4):
        (turn,) = svc.store.session_turns(f"inflight-{i}")
        assert turn.policy_version == 0 and len(turn.response_ids) == 120  # finished on the old weights
    after = httpx.post(
        url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 3}, timeout=60
    ).json()
    assert after["policy_version"] == 1
    assert httpx.get(url + "/healthz").json()["policy_version"] == 1
    assert svc.store.get_meta("policy_version") == 1
    # a LoRA adapter through the trainer's HTTP route: merged into the base, version recorded
    q_before = svc.engine.model.model.layers[0].self_attn.q_proj.weight.clone()
    run = RunDir.of(svc.cfg)
    admin = {"Authorization": f"Bearer {run.admin_key()}"}
    exported = run.policies / "v000002"  # where the trainer's export lands: the only folder the route loads
    shutil.copytree(weight_dirs["adapter"], exported)
    r = httpx.post(
        url + "/v1/admin/load_weights", json={"path": str(exported), "version": 2}, headers=admin, timeout=120
    )
    assert r.status_code == 200 and r.json() == {"ok": True, "policy_version": 2}
    assert not torch.equal(q_before, svc.engine.model.model.layers[0].self_attn.q_proj.weight)
    assert httpx.get(url + "/v1/models").json()["data"][0]["policy_version"] == 2
    # a bad directory is refused with a reason, and serving goes on with version 2
    bad = httpx.post(
        url + "/v1/admin/load_weights", json={"path": str(run.policies / "nope"), "version": 3}, headers=admin
    )
    assert bad.status_code == 400 and "not a directory" in bad.json()["error"]["message"]
    bad = httpx.post(url + "/v1/admin/load_weights", json={"path": str(exported)}, headers=admin)
    assert bad.status_code == 400 and "version" in bad.json()["error"]["message"]
    # anything outside the export folder is refused without a word about what is there
    for outside in (weight_dirs["full"], "/etc", str(run.policies / ".." / "store.sqlite")):
        bad = httpx.post(
            url + "/v1/admin/load_weights", json={"path": str(outside), "version": 4}, headers=admin
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "path_not_allowed", bad.text
        assert "config.json" not in bad.text and "safetensors" not in bad.text
    assert svc.policy_version == 2


def test_non_blocking_swap_applies_mid_batch_and_fails_nothing(start_service, tiny_model_dir, weight_dirs):
    """non_blocking = true (default): the swap lands at the next step boundary while requests decode."""
    svc, url = start_service(tiny_model_dir, "swapnb")
    started = threading.Barrier(4)
    codes: list[int] = []

    def stream_one(i: int) -> None:
        seen = 0
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            timeout=120,
            json={
                "messages": USER,
                "stream": True,
                "max_tokens": 400,
                "temperature": 0,
                "session_id": f"nb-{i}",
            },
        ) as s:
            for line in s.iter_lines():
                seen += line.startswith("data: ")
                if seen == 2 and line.startswith("data: "):
                    started.wait(60)
            codes.append(s.status_code)

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait(60)
    svc.swap_weights(weight_dirs["full"], 1)
    for t in threads:
        t.join(120)
    assert codes == [200] * 3
    assert svc.engine.mid_batch_swaps == 1  # applied while the three were decoding, nobody waited
    for i in range(3):
        (turn,) = svc.store.session_turns(f"nb-{i}")
        assert turn.policy_version == 0 and len(turn.response_ids) == len(turn.response_logprobs) == 400


def test_forwarding_backends_record_the_engine_ids(start_service, tiny_model_dir, weight_dirs, tmp_path):
    # The stand-in engine is this service, whose weight routes take its admin secret and load from
    # its export folder; the forwarding side sends engine_api_key, as it would to a keyed vLLM.
    engine_run = RunDir(tmp_path / "engine")
    engine_run.root.mkdir(parents=True)
    engine_run.admin_key_file.write_text("engine-secret")
    adapter = shutil.copytree(weight_dirs["adapter"], engine_run.policies / "v000007")
    full = shutil.copytree(weight_dirs["full"], engine_run.policies / "v000008")
    engine, engine_url = start_service(tiny_model_dir, "engine")
    key = {"engine_api_key": "engine-secret"}
    fwd, url = start_service(tiny_model_dir, "fwd", backend="vllm", engine_url=engine_url, **key)
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=60,
        json={
            "messages": USER,
            "max_tokens": 5,
            "logprobs": True,
            "top_logprobs": 2,
            "temperature": 0.7,
            "seed": 1,
            "session_id": "fw",
        },
    )
    assert r.status_code == 200, r.text
    (turn,) = fwd.store.session_turns("fw")
    (engine_turn,) = _all_turns(engine.store.path)
    assert turn.prompt_ids == engine_turn.prompt_ids
    assert turn.response_ids == engine_turn.response_ids and len(turn.response_ids) == 5
    assert turn.response_logprobs == engine_turn.response_logprobs
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == turn.response_logprobs and len(entries[0]["top_logprobs"]) == 2
    # streaming is relayed chunk by chunk and still recorded exactly
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        timeout=60,
        json={"messages": USER, "max_tokens": 4, "stream": True, "session_id": "fw2"},
    ) as s:
        lines = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in lines if c["choices"])
    (turn2,) = fwd.store.session_turns("fw2")
    assert turn2.response_text == text and len(turn2.response_ids) == 4
    assert turn2.response_ids == _all_turns(engine.store.path)[-1].response_ids
    # a reply that ends on the end token: no log-prob entry shows it, yet it is recorded (the trainer
    # learns to stop from it), streamed or not
    eos = sorted(engine.engine.eos_ids)[0]
    for i, stream in enumerate((False, True)):
        body = {"messages": USER, "max_tokens": 5, "logit_bias": {str(eos): 100}, "stream": stream}
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={**body, "session_id": f"fw-eos{i}"})
        assert r.status_code == 200, r.text
        (ended,) = fwd.store.session_turns(f"fw-eos{i}")
        engine_turn = _all_turns(engine.store.path)[-1]
        assert ended.response_ids == [eos] == engine_turn.response_ids
        assert ended.response_logprobs == engine_turn.response_logprobs
    # bad input is answered by our layer before reaching the engine
    assert httpx.post(url + "/v1/chat/completions", json={"messages": []}).status_code == 400
    # weight sync: vLLM's LoRA route, then SGLang's disk route, both answered by the engine instance
    fwd.swap_weights(adapter, 7)
    assert engine.policy_version == 1 and fwd.policy_version == 7 and fwd.engine.serve_model == "policy-v7"
    sg, sg_url = start_service(tiny_model_dir, "sg", backend="sglang", engine_url=engine_url, **key)
    sg.swap_weights(full, 8)
    assert engine.policy_version == 2 and sg.policy_version == 8
    r = httpx.post(
        sg_url + "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "session_id": "sg"},
        timeout=60,
    )
    assert r.status_code == 200 and sg.store.session_turns("sg")[0].policy_version == 8


def test_api_backend_without_ids_records_an_untrainable_turn(start_service, tiny_model_dir):
    _, engine_url = start_service(tiny_model_dir, "engine2")
    api, url = start_service(tiny_model_dir, "api", backend="api", api={"base_url": engine_url})
    r = httpx.post(
        url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 3, "session_id": "a"}, timeout=60
    )
    assert r.status_code == 200
    (turn,) = api.store.session_turns("a")
    assert turn.response_ids == [] and turn.response_logprobs == [] and turn.response_text
    assert turn.prompt_ids  # from the local chat template (documented fallback)


def test_unreachable_engine_is_a_502_not_a_hang(start_service, tiny_model_dir):
    _, url = start_service(tiny_model_dir, "dead", backend="sglang", engine_url="http://127.0.0.1:9")
    r = httpx.post(url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=60)
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    # and the health check says so: the process answers, the engine behind it does not
    health = httpx.get(url + "/healthz", timeout=60).json()
    assert health["status"] == "degraded" and "http://127.0.0.1:9/v1" in health["engine_problem"], health


def test_vllm_forwarding_serves_each_user_their_named_lora(
    start_service, tiny_model_dir, weight_dirs, tmp_path
):
    from openclaw_rl.policy.engine import GenRequest, SamplingParams
    from openclaw_rl.policy.protocol import ChatMessage

    engine_run = RunDir(tmp_path / "engine")
    engine_run.root.mkdir(parents=True)
    engine_run.admin_key_file.write_text("engine-secret")
    adapter = shutil.copytree(weight_dirs["adapter"], engine_run.policies / "users" / "alice" / "v000003")
    engine, engine_url = start_service(tiny_model_dir, "engine")
    fwd, url = start_service(
        tiny_model_dir, "fwd", backend="vllm", engine_url=engine_url, engine_api_key="engine-secret"
    )
    fwd.cfg.users.mode = "per_user"  # start_service builds the policy section only
    fwd.serving.swap_weights(adapter, 3, user="alice")
    assert engine.policy_version == 1  # the stand-in took the LoRA through vLLM's route
    req = GenRequest([ChatMessage(role="user", content="hi")], None, SamplingParams(max_tokens=2))
    assert fwd.engine.body(req)["model"] == fwd.engine.serve_model  # no user: the shared model
    req.adapter = "alice"
    assert fwd.engine.body(req)["model"] == "user-alice-v3"
    for user, version in (("alice", 3), ("bob", 0)):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 2, "user": user, "session_id": f"pu-{user}"},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["policy_version"] == version, r.text
    sg, _ = start_service(tiny_model_dir, "sg", backend="sglang", engine_url=engine_url)
    with pytest.raises(WeightLoadError, match="does not serve per-user adapters"):
        sg.engine.swap_adapter("alice", adapter, 1)


class _RefusingEngine(BaseHTTPRequestHandler):
    """An upstream API that quotes the key it was sent in its 401, as some do, or (for a body that
    asks for ``"slow"``) answers nothing within the client's timeout."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if b"slow" in body:
            time.sleep(3)
            return
        sent = self.headers.get("Authorization", "").removeprefix("Bearer ")
        reply = json.dumps({"error": {"message": f"Incorrect API key provided: {sent}"}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def test_an_engine_refusal_reaches_the_client_without_the_key(start_service, tiny_model_dir):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingEngine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}"
    try:
        _, url = start_service(
            tiny_model_dir,
            "quoted",
            backend="api",
            request_timeout_sec=1,
            api={"base_url": base, "api_key": "plain-upstream-key"},
        )
        r = httpx.post(url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=60)
        slow = [{"role": "user", "content": "slow"}]
        late = httpx.post(url + "/v1/chat/completions", json={"messages": slow, "max_tokens": 2}, timeout=60)
    finally:
        srv.shutdown()
    said = r.json()["error"]["message"]
    assert r.status_code == 502 and "Incorrect API key provided: [key]" in said, said
    assert "plain-upstream-key" not in r.text
    # a timeout names what happened, though httpx's exception has no text of its own
    assert late.status_code == 502 and "no answer within request_timeout_sec" in late.text, late.text


def test_a_deleted_users_adapters_are_all_unloaded_and_old_versions_retired(
    tiny_model_dir, weight_dirs, tmp_path
):
    # The engine's weight routes are recorded, not served: the real vLLM test loads and unloads them.
    from openclaw_rl.policy.forward import ForwardEngine

    cfg = make_config(tmp_path, tiny_model_dir, backend="vllm", engine_url="http://127.0.0.1:9")
    engine = ForwardEngine(cfg)
    calls: list[tuple[str, str]] = []
    engine._post_weights = lambda url, body, p: calls.append((url.rsplit("/", 1)[1], body["lora_name"]))  # type: ignore[method-assign]
    for version in (1, 2, 3):
        engine.swap_adapter("bob", weight_dirs["adapter"], version)
        engine.swap_weights(weight_dirs["adapter"], version)
    unloaded = [name for route, name in calls if route == "unload_lora_adapter"]
    assert unloaded == ["user-bob-v1", "policy-v1"]  # two swaps old; v2 may still be streaming
    calls.clear()
    engine.forget_adapter("bob")
    assert sorted(name for _, name in calls) == ["user-bob-v2", "user-bob-v3"]  # current and retiring
    assert not any("bob" in name for name in engine._lora_paths)  # never loaded again
    assert engine.adapter_version("bob") == 0 and engine.serve_model == "policy-v3"
