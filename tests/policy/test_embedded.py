"""End to end with the real embedded SmolLM2-135M-Instruct, through the official OpenAI client."""

from __future__ import annotations

import pytest
from openai import OpenAI

from .conftest import KEY

pytestmark = pytest.mark.slow


def test_openai_client_chat_and_stream_on_the_embedded_model(start_service, embedded_model_dir):
    svc, url = start_service(embedded_model_dir, "embedded", api_key=KEY)
    client = OpenAI(base_url=url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    resp = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=messages,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_headers={"X-Session-Id": "emb"},
    )
    text = resp.choices[0].message.content or ""
    assert "Paris" in text
    # an entry per token of the text; the end token that stopped it is counted but no text (OpenAI's)
    entries = resp.choices[0].logprobs.content
    assert resp.choices[0].finish_reason == "stop" and len(entries) == resp.usage.completion_tokens - 1
    assert "".join(e.token for e in entries) == text
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_headers={"X-Session-Id": "emb2"},
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == text and sum(1 for p in pieces if p) >= 2  # token by token, not one blob
    (turn,) = svc.store.session_turns("emb")
    assert len(turn.response_ids) == len(turn.response_logprobs) == resp.usage.completion_tokens
    tail = svc.engine.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert turn.prompt_ids[-len(tail) :] == tail  # the prompt ends with the generation prompt
    assert all(lp <= 0 for lp in turn.response_logprobs)
