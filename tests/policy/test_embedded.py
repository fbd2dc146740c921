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


def _joined_bytes(entries) -> bytes:
    return b"".join(bytes(e.bytes or []) for e in entries)


def test_a_chinese_stop_string_and_a_cut_character_stream_as_the_whole_reply(
    start_service, embedded_model_dir
):
    """Chinese text comes in tokens of half a character. A stop string made of such characters is
    never streamed in part (the stream joins to what the whole reply says), and log-prob entries
    spell the content, for a stop string and for a character cut in half by ``max_tokens``."""
    svc, url = start_service(embedded_model_dir, "embedded", api_key=KEY)
    client = OpenAI(base_url=url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    ask = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "请用中文介绍一下北京，写三句话。"}],
        "temperature": 0,
    }
    free = client.chat.completions.create(**ask, max_tokens=24).choices[0].message.content or ""
    at = next(i for i, ch in enumerate(free) if i >= 3 and all(ord(c) > 0x2E80 for c in free[i : i + 3]))
    stop = free[at : at + 3]  # three CJK characters the greedy reply reaches
    whole = client.chat.completions.create(**ask, max_tokens=24, stop=[stop], logprobs=True)
    content = whole.choices[0].message.content or ""
    assert content == free[: free.find(stop)] and whole.choices[0].finish_reason == "stop"
    assert _joined_bytes(whole.choices[0].logprobs.content) == content.encode()
    chunks = list(
        client.chat.completions.create(**ask, max_tokens=24, stop=[stop], logprobs=True, stream=True)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == content
    shown = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert _joined_bytes(shown) == content.encode()
    for n in range(1, 7):  # some of these cut a character in half: the reply ends before it
        cut = client.chat.completions.create(**ask, max_tokens=n, logprobs=True).choices[0]
        assert "\ufffd" not in (cut.message.content or "")
        assert _joined_bytes(cut.logprobs.content) == (cut.message.content or "").encode(), n
