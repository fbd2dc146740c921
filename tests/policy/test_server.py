"""The policy service over real HTTP with the tiny random model: responses, recording, sessions,
bad input, auth and the 429 path."""

from __future__ import annotations

import json
import re
import threading
from urllib.parse import unquote

import httpx
import pytest

from openclaw_rl.runtime.chat_format import template_messages
from openclaw_rl.runtime.models import load_tokenizer
from openclaw_rl.runtime.rundir import RunDir

from .conftest import KEY

USER = [{"role": "user", "content": "What is 2+2?"}]


def _turns(svc, session_id):
    return svc.store.session_turns(session_id)


def _sse(resp: httpx.Response) -> list[dict | str]:
    events: list[dict | str] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_chat_records_exact_ids_and_logprobs(tiny_service, client, tiny_model_dir):
    svc, _ = tiny_service
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": USER,
            "max_tokens": 6,
            "logprobs": True,
            "top_logprobs": 3,
            "temperature": 0.8,
            "top_p": 0.9,
            "seed": 7,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    sid, idx = r.headers["X-Session-Id"], int(r.headers["X-Turn-Index"])
    assert (sid, idx) == (body["session_id"], body["turn_index"])
    turn = _turns(svc, sid)[idx]
    tok = load_tokenizer(str(tiny_model_dir))
    text = tok.apply_chat_template(template_messages(USER, None), add_generation_prompt=True, tokenize=False)
    assert turn.prompt_ids == tok(text, add_special_tokens=False)["input_ids"] == body["prompt_token_ids"]
    assert turn.response_ids == choice["token_ids"]
    assert len(turn.response_ids) == len(turn.response_logprobs) == body["usage"]["completion_tokens"] == 6
    entries = choice["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == pytest.approx(turn.response_logprobs)
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in entries)
    # top_p = 0.9 sampling: the sampled token's log-prob is taken in the renormalised nucleus, so it is
    # at least the top-1 log-prob of the same distribution minus nothing outside it
    assert all(e["logprob"] >= e["top_logprobs"][-1]["logprob"] or e["logprob"] > -9999 for e in entries)
    assert turn.policy_version == 0 and turn.turn_type == "main" and turn.messages == USER
    assert choice["finish_reason"] == "length"
    # same seed, same answer; streaming carries the same tokens, ending with [DONE]
    again = client.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "seed": 7},
    ).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "messages": USER,
            "max_tokens": 6,
            "temperature": 0.8,
            "top_p": 0.9,
            "seed": 7,
            "stream": True,
            "logprobs": True,
            "stream_options": {"include_usage": True},
        },
    ) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = _sse(s)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == choice["message"]["content"]
    n_lp = sum(
        len(c["choices"][0]["logprobs"]["content"])
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
    )
    assert n_lp == 6 and chunks[-1]["usage"]["completion_tokens"] == 6


def test_stop_sequence_and_greedy(client):
    base = client.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 10, "temperature": 0}
    ).json()
    text = base["choices"][0]["message"]["content"]
    assert len(text) > 4
    stop = text[2:4]
    r = client.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 10, "temperature": 0, "stop": [stop]}
    ).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == text[: text.find(stop)]


def test_repetition_penalties_change_what_is_drawn_not_what_is_recorded(tiny_service, client):
    svc, _ = tiny_service

    def greedy(**penalties):
        body = {"messages": USER, "max_tokens": 24, "temperature": 0, "return_token_ids": True, **penalties}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        turn = svc.store.turn_by_response(out["id"])[0]
        return out["choices"][0]["token_ids"], turn

    plain, _ = greedy()
    assert len(set(plain)) < len(plain)  # the tiny random model repeats itself when greedy
    fresh, turn = greedy(presence_penalty=2.0)
    assert len(set(fresh)) > len(set(plain))  # a token already said is drawn less
    assert turn.response_ids == fresh and len(turn.response_logprobs) == len(fresh)
    # the recorded log-probs are the model's own: the same as for an unpenalised reply's shared prefix
    same = next((k for k, (a, b) in enumerate(zip(plain, fresh, strict=False)) if a != b), len(fresh))
    _, unpenalised = greedy()
    assert turn.response_logprobs[:same] == pytest.approx(unpenalised.response_logprobs[:same], abs=1e-4)
    assert greedy(frequency_penalty=-2.0)[0]  # negative values are OpenAI's too: accepted


def test_logit_bias_bans_and_forces_tokens(client):
    def first_token(**extra) -> int:
        body = {"messages": USER, "max_tokens": 1, "temperature": 0, "return_token_ids": True, **extra}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"][0]

    greedy = first_token()
    assert first_token(logit_bias={str(greedy): -100}) != greedy
    assert first_token(logit_bias={"1234": 100}) == 1234


def test_a_reply_cut_inside_a_character_ends_before_it(tiny_service, client, tiny_model_dir):
    """max_tokens ending on the first byte-token of a multi-byte character (a Chinese reply cut short):
    the text ends before the character, not in U+FFFD; the token is still the reply's (recorded)."""
    from openclaw_rl.runtime.models import load_tokenizer

    svc, _ = tiny_service
    first = load_tokenizer(str(tiny_model_dir)).encode("🐱")[0]  # a token holding part of the emoji
    body = {"messages": USER, "max_tokens": 1, "logit_bias": {str(first): 100}, "return_token_ids": True}
    r = client.post("/v1/chat/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == [first] and choice["finish_reason"] == "length"
    assert choice["message"]["content"] == ""
    (turn,) = _turns(svc, r.json()["session_id"])
    assert turn.response_ids == [first] and "\ufffd" not in turn.response_text
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        streamed = "".join(
            e["choices"][0]["delta"].get("content") or ""
            for e in _sse(s)
            if isinstance(e, dict) and e["choices"]
        )
    assert streamed == ""


def test_top_k_one_draws_the_greedy_reply_at_any_temperature(tiny_service, client):
    from anthropic import Anthropic

    _, url = tiny_service

    def reply(**extra) -> list[int]:
        body = {"messages": USER, "max_tokens": 12, "return_token_ids": True, **extra}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    greedy = reply(temperature=0)
    assert reply(temperature=1.0, top_k=1) == greedy
    assert reply(temperature=1.0, top_p=0) == greedy  # OpenAI's top_p = 0: only the likeliest token
    assert any(reply(temperature=1.0, seed=s) != greedy for s in range(3))  # without it, sampling differs
    anthropic = Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60)
    kw = {"model": "policy", "max_tokens": 12, "messages": USER}  # the SDK sends sampling fields as extras
    assert anthropic.messages.create(**kw, extra_body={"temperature": 1.0, "top_k": 1}).content[0].text == (
        anthropic.messages.create(**kw, extra_body={"temperature": 0}).content[0].text
    )


def test_explicit_sessions_next_state_side_turns_and_done(tiny_service, client):
    svc, _ = tiny_service
    h = {"X-Session-Id": "sess-A"}
    r0 = client.post("/v1/chat/completions", headers=h, json={"messages": USER, "max_tokens": 4}).json()
    reply = r0["choices"][0]["message"]["content"]
    side = client.post(
        "/v1/chat/completions",
        headers={**h, "X-Turn-Type": "side"},
        json={"messages": [{"role": "user", "content": "Title for this chat?"}], "max_tokens": 3},
    )
    assert side.status_code == 200
    msgs = USER + [{"role": "assistant", "content": reply}, {"role": "user", "content": "No, that's wrong."}]
    r2 = client.post(
        "/v1/chat/completions",
        headers={**h, "X-Session-Done": "true"},
        json={"messages": msgs, "max_tokens": 4},
    )
    assert r2.status_code == 200
    turns = _turns(svc, "sess-A")
    assert [t.turn_type for t in turns] == ["main", "side", "main"]
    assert turns[0].next_state is not None and turns[0].next_state.content == "No, that's wrong."
    assert turns[1].next_state is None
    assert svc.store.turn_status("sess-A", 0) == "ready"
    assert svc.store.turn_status("sess-A", 1) == "side"
    assert svc.store.turn_status("sess-A", 2) == "closed"  # session done: the last turn gets no next state
    # the same keys in the body work too
    b = client.post(
        "/v1/chat/completions",
        json={"messages": USER, "max_tokens": 2, "session_id": "sess-B", "turn_type": "side"},
    ).json()
    assert b["session_id"] == "sess-B" and _turns(svc, "sess-B")[0].turn_type == "side"


def test_an_abandoned_session_is_closed_through_the_admin_route(tiny_service, client):
    svc, _ = tiny_service
    r = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "gone"}, json={"messages": USER, "max_tokens": 2}
    )
    assert r.status_code == 200 and svc.store.turn_status("gone", 0) == "open"
    admin = {"Authorization": f"Bearer {RunDir.of(svc.cfg).admin_key()}"}
    closed = client.post("/v1/admin/close_session", json={"session_id": "gone"}, headers=admin)
    assert closed.status_code == 200 and closed.json() == {"ok": True, "session_id": "gone"}
    assert svc.store.turn_status("gone", 0) == "closed"  # no next state will come: not left open
    for body, says in (
        ({}, "session_id"),
        ({"session_id": ""}, "session_id"),
        ({"session_id": "x", "y": 1}, "y"),
    ):
        bad = client.post("/v1/admin/close_session", json=body, headers=admin)
        assert bad.status_code == 400 and says in bad.json()["error"]["message"], bad.text


def test_plain_client_is_stitched_by_prefix(tiny_service, client):
    svc, _ = tiny_service
    first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    r1 = client.post("/v1/chat/completions", json={"messages": first, "max_tokens": 4}).json()
    msgs = first + [r1["choices"][0]["message"], {"role": "user", "content": "Another one, please."}]
    r2 = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}).json()
    assert r2["session_id"] == r1["session_id"] and r2["turn_index"] == r1["turn_index"] + 1
    t0 = _turns(svc, r1["session_id"])[0]
    assert t0.next_state is not None and t0.next_state.content == "Another one, please."
    # a different conversation is a different session
    r3 = client.post(
        "/v1/chat/completions",
        json={"messages": first[:1] + [{"role": "user", "content": "Name a fruit."}], "max_tokens": 2},
    ).json()
    assert r3["session_id"] != r1["session_id"]
    # the user regenerates their follow-up (same history, another last message): a branch, a new
    # session, and the first reply keeps the next state it really got
    edited = first + [r1["choices"][0]["message"], {"role": "user", "content": "No wait, name a shape."}]
    r4 = client.post("/v1/chat/completions", json={"messages": edited, "max_tokens": 2}).json()
    assert r4["session_id"] != r1["session_id"]
    turns = _turns(svc, r1["session_id"])
    assert len(turns) == 2 and turns[0].next_state.content == "Another one, please."
    assert turns[1].next_state is None


def test_a_plain_conversation_continues_its_session_after_a_restart(start_service, tiny_model_dir):
    svc, url = start_service(tiny_model_dir, name="restart")
    first = [{"role": "user", "content": "Name a colour."}]
    r1 = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": first, "max_tokens": 4}, timeout=60
    ).json()
    svc.stop()
    svc2, url2 = start_service(tiny_model_dir, name="restart")  # same log_dir, same store, fresh memory
    msgs = first + [r1["choices"][0]["message"], {"role": "user", "content": "Another one."}]
    r2 = httpx.post(
        f"{url2}/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}, timeout=60
    ).json()
    assert (r2["session_id"], r2["turn_index"]) == (r1["session_id"], r1["turn_index"] + 1)
    t0 = _turns(svc2, r1["session_id"])[0]
    assert t0.next_state is not None and t0.next_state.content == "Another one."


BAD = [
    (b'{"messages": [', "not valid JSON"),
    (
        b'{"messages": [{"role": "user", "content": "x"}], "metadata": {"a": '
        + b"[" * 300
        + b"]" * 300
        + b"}}",
        "nested too deeply",
    ),  # valid JSON, only too deep to parse: not called invalid
    (b"", "body is empty"),
    (b"[1, 2]", "must be a JSON object, got an array"),
    (b"null", "must be a JSON object, got null"),
    (b'{"messages": [{"role": "user", "content": "x"}], "seed": 18446744073709551617}', "seed"),
    (
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, '
        b'{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}',
        "messages[0].content[1]: content part of type 'image_url' is not supported",
    ),
    (b"{}", "messages: Field required"),
    (b'{"messages": []}', "messages: List should have at least 1 item"),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', "unknown role 'wizard'"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "0.5"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', "n = 3 is not supported"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    (
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
        "tools[0].function",
    ),
    (
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
        b'{"name": "f", "parameters": {"type": "string"}}}]}',
        "type 'object'",
    ),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": {"name": "f"}}', "tools"),
    (b'{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 2.5}', "frequency_penalty"),
]


@pytest.mark.parametrize("body, says", BAD)
def test_bad_input_gets_a_clear_400_and_the_server_keeps_serving(tiny_service, client, body, says):
    svc, _ = tiny_service
    before = svc.store.counters().turns
    r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"] and err["type"] == "invalid_request_error"
    assert svc.store.counters().turns == before
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1}).status_code == 200


def test_over_long_context_and_bad_session_header(tiny_service, client):
    svc, _ = tiny_service
    r0 = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "long"}, json={"messages": USER, "max_tokens": 2}
    )
    long = USER + [r0.json()["choices"][0]["message"], {"role": "user", "content": "word " * 9000}]
    r = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "long"}, json={"messages": long, "max_tokens": 1}
    )
    assert r.status_code == 400 and "maximum context length is 8192 tokens" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "context_length_exceeded"
    # no answer, but the message is still the previous turn's next state: nothing is lost
    (turn,) = svc.store.session_turns("long")
    assert turn.next_state is not None and turn.next_state.content.startswith("word word")
    # tools that alone fill the window: the error says so, as OpenAI's does (shortening the history
    # after it would get a client nowhere)
    tools = [
        {"type": "function", "function": {"name": f"t{i}", "description": "word " * 400}} for i in range(24)
    ]
    r = client.post("/v1/chat/completions", json={"messages": USER, "tools": tools, "max_tokens": 1})
    said = r.json()["error"]["message"]
    assert r.status_code == 400 and "in the functions)" in said and "messages or functions" in said, said
    r = client.post("/v1/chat/completions", headers={"X-Turn-Type": "sidecar"}, json={"messages": USER})
    assert r.status_code == 400 and "X-Turn-Type" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", headers={"X-Session-Done": "maybe"}, json={"messages": USER})
    assert r.status_code == 400 and "X-Session-Done" in r.json()["error"]["message"]


def test_a_session_id_in_any_script_is_kept_and_echoed_in_a_valid_header(tiny_service, client):
    """A Chinese session id (body or UTF-8 header, as curl sends it) is served and recorded as written;
    the X-Session-Id response header, which holds only Latin-1, carries it percent-encoded."""
    svc, _ = tiny_service
    body = {"messages": USER, "max_tokens": 2, "session_id": "我的会话"}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["session_id"] == "我的会话" and unquote(r.headers["X-Session-Id"]) == "我的会话"
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "session_id": "会话三", "stream": True}
    ) as s:
        assert s.status_code == 200 and unquote(s.headers["X-Session-Id"]) == "会话三"
        assert _sse(s)[-1] == "[DONE]"
    r = client.post(
        "/v1/chat/completions",
        headers={"X-Session-Id": "会话二".encode()},
        json={"messages": USER, "max_tokens": 2},
    )
    assert r.status_code == 200 and r.json()["session_id"] == "会话二"
    assert [len(_turns(svc, sid)) for sid in ("我的会话", "会话三", "会话二")] == [1, 1, 1]
    # control characters cannot go back in a header (the reply was lost after recording): a 400 first
    for bad in ("abc\r\nX-Evil: 1", "a\x00b", "\x1b[2Jx"):
        r = client.post("/v1/chat/completions", json={**body, "session_id": bad})
        assert r.status_code == 400 and "control characters" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "session_id"  # named as sent: in the body, not a header
        assert _turns(svc, bad) == []


def test_the_answers_session_header_sent_back_as_it_is_goes_on_in_the_same_session(tiny_service, client):
    """A client may echo the answer's ``X-Session-Id`` header: percent-encoded ids come back to the
    session they name, an id's own ``%`` cannot read like an encoded one, and the spaces HTTP drops
    around a header are dropped from the body's id too (the answer used to fail after recording)."""
    svc, _ = tiny_service
    for sent in ("我的会话 2", "50%off", "%E6%88%91", "a%20b"):
        r = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "session_id": sent})
        assert r.status_code == 200 and r.json()["session_id"] == sent, r.text
        echoed = r.headers["X-Session-Id"]
        again = client.post(
            "/v1/chat/completions", headers={"X-Session-Id": echoed}, json={"messages": USER, "max_tokens": 2}
        )
        assert again.status_code == 200 and again.json()["session_id"] == sent, (sent, echoed)
        assert again.json()["turn_index"] == 1 and len(_turns(svc, sent)) == 2
    assert (
        client.post(  # the two forms of "%E6%88%91" are two sessions, told apart in the header
            "/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "session_id": "我"}
        ).headers["X-Session-Id"]
        != r.headers["X-Session-Id"]
    )
    # a client's own escapes of ASCII in a header are its id as written, not decoded
    r = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "x%2Fy"}, json={"messages": USER, "max_tokens": 2}
    )
    assert r.json()["session_id"] == "x%2Fy"
    r = client.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "session_id": " padded "}
    )
    assert (
        r.status_code == 200 and r.json()["session_id"] == "padded" and r.headers["X-Session-Id"] == "padded"
    )
    r = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "padded"}, json={"messages": USER, "max_tokens": 2}
    )
    assert r.json()["turn_index"] == 1
    r = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "session_id": "   "})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_a_client_leaving_mid_body_costs_one_line_and_no_traceback(tiny_service, client, caplog):
    import socket
    import time
    from urllib.parse import urlsplit

    _, url = tiny_service
    where = urlsplit(url)
    with caplog.at_level("INFO", logger="openclaw_rl"):
        with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n".encode()
                + b'{"messages": ['
            )
            time.sleep(0.5)
        deadline = time.monotonic() + 10
        while (
            "client left before its request body arrived" not in caplog.text and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    assert "client left before its request body arrived" in caplog.text
    assert "unhandled error" not in caplog.text and "Traceback" not in caplog.text
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1}).status_code == 200


ADMIN_ROUTES = [
    "/v1/admin/load_weights",
    "/v1/admin/pause",
    "/update_weights_from_disk",
    "/v1/load_lora_adapter",
    "/v1/admin/close_session",
]


@pytest.mark.parametrize(
    "method, path",
    [("POST", "/v1/chat/completions"), ("GET", "/v1/models"), *(("POST", p) for p in ADMIN_ROUTES)],
)
def test_every_route_but_healthz_needs_a_key(tiny_service, method, path):
    svc, url = tiny_service
    wrong = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}]
    if path in ADMIN_ROUTES:  # the clients' own key does not open the admin routes
        wrong.append({"Authorization": f"Bearer {KEY}"})
    for headers in wrong:
        r = httpx.request(method, url + path, headers=headers, json={"messages": USER}, timeout=30)
        assert r.status_code == 401, (path, headers)
        assert r.json()["error"]["type"] == "authentication_error" and KEY not in r.text
        assert RunDir.of(svc.cfg).admin_key() not in r.text
    health = httpx.get(url + "/healthz", timeout=30)
    assert health.status_code == 200 and health.json()["policy_version"] >= 0


def test_logprobs_spell_the_reply_the_client_got_stop_string_left_out(client):
    """Joined, the log-probs' tokens are the returned content: the token that holds a stop string
    is the policy's (recorded, counted) but no part of the reply, so it has no log-prob entry;
    each entry's bytes are the token's own, joined they are the reply's UTF-8."""
    ask = {
        "messages": USER,
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 11,
        "logprobs": True,
        "top_logprobs": 2,
    }
    free = client.post("/v1/chat/completions", json=ask).json()
    tokens = [e["token"] for e in free["choices"][0]["logprobs"]["content"]]
    cut = next(i for i in range(3, len(tokens)) if tokens[i].strip() and tokens[i] not in "".join(tokens[:i]))
    for stream in (False, True):
        body = {**ask, "stop": [tokens[cut]], "stream": stream}
        r = client.post("/v1/chat/completions", json=body)
        if stream:
            chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            entries = [
                e
                for c in chunks
                if c["choices"]
                for e in (c["choices"][0].get("logprobs") or {}).get("content", [])
            ]
        else:
            content = r.json()["choices"][0]["message"]["content"]
            entries = r.json()["choices"][0]["logprobs"]["content"]
        assert content == "".join(tokens[:cut]), (stream, content)
        assert bytes(b for e in entries for b in e["bytes"]).decode("utf-8") == content
        assert len(entries) == cut


def test_a_reply_that_ends_on_its_end_token_shows_no_log_prob_for_it(tiny_service, client):
    """The end token is the policy's sample (recorded) but no text of the reply: OpenAI's
    logprobs.content holds entries for the returned text only, streamed or not."""
    svc, _ = tiny_service
    eos = sorted(svc.serving.engine.eos_ids)[0]
    ask = {"messages": USER, "max_tokens": 8, "logprobs": True, "logit_bias": {str(eos): 100}}
    for stream in (False, True):
        r = client.post("/v1/chat/completions", json={**ask, "stream": stream})
        if stream:
            chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
            finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
            entries = [
                e
                for c in chunks
                if c["choices"]
                for e in (c["choices"][0].get("logprobs") or {}).get("content", [])
            ]
        else:
            finish = r.json()["choices"][0]["finish_reason"]
            entries = r.json()["choices"][0]["logprobs"]["content"]
            turn = svc.store.turn_by_response(r.json()["id"])[0]
            assert turn.response_ids == [eos]  # recorded all the same: it is what the policy sampled
        assert finish == "stop" and entries == [], (stream, entries)


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and "policy_version" in models["data"][0]
    nope = client.get("/nope")
    assert nope.status_code == 404 and nope.json()["error"]["code"] == "unknown_route"


def test_an_openai_route_this_service_lacks_says_so_and_where_to_go(tiny_service):
    from openai import NotFoundError, OpenAI

    _, url = tiny_service
    oa = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(NotFoundError) as caught:
        oa.embeddings.create(model="policy", input="hello")
    assert "embeddings is not served here" in str(caught.value)
    assert "/v1/chat/completions" in str(caught.value)
    with pytest.raises(NotFoundError, match="legacy text completions API is not served"):
        oa.completions.create(model="policy", prompt="hello")


def test_key_never_in_records_or_logs(tiny_service, client, caplog):
    svc, _ = tiny_service
    with caplog.at_level("INFO", logger="openclaw_rl.policy"):
        r = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "line1\r\n[policy_service] forged\x07"}],
                "max_tokens": 2,
            },
        )
    assert r.status_code == 200
    text = caplog.text
    assert "forged" in text and "\\r\\n[policy_service] forged\\u0007" in text
    assert KEY not in text
    raw = svc.store.path.read_bytes() + (
        svc.store.path.with_suffix(".sqlite-wal").read_bytes()
        if svc.store.path.with_suffix(".sqlite-wal").exists()
        else b""
    )
    assert KEY.encode() not in raw


def _two_long_streams(svc, url: str, **extra) -> tuple[list[threading.Thread], list[int]]:
    """Two long streamed requests: the first generating, the second queued behind it (with
    ``max_concurrent = 1``); joined by the caller, whose ``results`` get their statuses."""
    held = threading.Event()
    results: list[int] = []

    def long_stream():
        body = {"messages": USER, "stream": True, "max_tokens": 400, "temperature": 0, **extra}
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json=body) as s:
            for _ in s.iter_lines():
                held.set()
            results.append(s.status_code)

    threads = [threading.Thread(target=long_stream) for _ in range(2)]
    threads[0].start()
    assert held.wait(60)
    threads[1].start()  # waits in the queue
    for _ in range(500):
        if svc.serving.in_flight >= 2:
            break
        threading.Event().wait(0.01)
    return threads, results


def test_queue_full_gets_429_with_retry_after(start_service, tiny_model_dir):
    svc, url = start_service(tiny_model_dir, "busy", max_concurrent=1, max_queue=1, max_tokens_default=400)
    threads, results = _two_long_streams(svc, url)
    r = httpx.post(url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 1}, timeout=30)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"
    for t in threads:
        t.join(120)
    assert results == [200, 200]
    assert (
        httpx.post(
            url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 1}, timeout=30
        ).status_code
        == 200
    )


def test_one_user_cannot_take_every_slot_of_a_per_user_service(tiny_model_dir, tmp_path):
    """per_user mode: one user's flood gets 429 (user_share_full) at half the service's capacity,
    so another user is still admitted."""
    from openclaw_rl.policy.server import PolicyService

    from .conftest import make_config

    cfg = make_config(
        tmp_path / "share", tiny_model_dir, max_concurrent=1, max_queue=3, max_tokens_default=400
    )
    cfg.users.mode = "per_user"
    svc = PolicyService(cfg)
    url = svc.start()
    try:
        assert svc.serving.user_share == 2
        threads, results = _two_long_streams(svc, url, user="alice")
        short = {"messages": USER, "max_tokens": 1}
        r = httpx.post(url + "/v1/chat/completions", json={**short, "user": "alice"}, timeout=30)
        assert r.status_code == 429 and r.json()["error"]["code"] == "user_share_full", r.text
        r = httpx.post(url + "/v1/chat/completions", json={**short, "user": "bob"}, timeout=120)
        assert r.status_code == 200, r.text
        for t in threads:
            t.join(120)
        assert results == [200, 200] and svc.serving.in_flight == 0
    finally:
        svc.stop()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tools_are_rendered_and_tool_results_become_next_state(tiny_service, client):
    svc, _ = tiny_service
    h = {"X-Session-Id": "tools-1"}
    r0 = client.post(
        "/v1/chat/completions",
        headers=h,
        json={
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER_TOOL],
            "max_tokens": 3,
        },
    )
    assert r0.status_code == 200
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    r1 = client.post(
        "/v1/chat/completions",
        headers=h,
        json={
            "tools": [WEATHER_TOOL],
            "max_tokens": 3,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
            ],
        },
    )
    assert r1.status_code == 200, r1.text
    t0, t1 = svc.store.session_turns("tools-1")
    prompt = svc.engine.tokenizer.decode(t1.prompt_ids)
    assert '"name": "get_weather"' in prompt and "# Tools" in prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    assert "<|im_start|>tool\n18C and sunny" in prompt
    assert t0.next_state is not None and (t0.next_state.role, t0.next_state.content) == (
        "tool",
        "18C and sunny",
    )
    # tool_choice "none": the tools are not shown to the model
    r2 = client.post(
        "/v1/chat/completions",
        headers={"X-Session-Id": "tools-2"},
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": "none",
            "max_tokens": 2,
        },
    )
    assert "# Tools" not in svc.engine.tokenizer.decode(svc.store.session_turns("tools-2")[0].prompt_ids)
    assert r2.status_code == 200


def test_stream_formatter_turns_tool_markup_into_tool_calls(tiny_service):
    """The SSE formatter on engine events that contain a tool call: content stops at the markup and
    the parsed call arrives as a tool_calls delta with finish_reason tool_calls."""
    import asyncio

    from openclaw_rl.policy.engine import Delta, Final
    from openclaw_rl.policy.protocol import ChatCompletionRequest, ToolDef
    from openclaw_rl.policy.serving import Job
    from openclaw_rl.policy.sessions import Assignment
    from openclaw_rl.policy.tools import parse_tool_calls

    svc, _ = tiny_service
    serving = svc.serving
    req = ChatCompletionRequest.model_validate({"messages": USER, "tools": [WEATHER_TOOL], "stream": True})
    pieces = ["Sure. <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}</tool_call>']
    text = "".join(pieces)

    async def run() -> list[str]:
        from openclaw_rl.policy.engine import GenRequest, SamplingParams

        job = Job(
            req,
            GenRequest(req.messages, [ToolDef.model_validate(WEATHER_TOOL)], SamplingParams()),
            Assignment("fmt", 0, "main", None, False, False),
        )
        for i, p in enumerate(pieces):
            await job.events.put(Delta(p, [i], [-0.1], [p]))
        job.final = Final("stop", [1], [0, 1, 2], [-0.1] * 3, text, 0)
        job.content, job.tool_calls = parse_tool_calls(text, job.gen.tools)
        await job.events.put(job.final)
        return [c async for c in serving.stream(job)]

    chunks = asyncio.run(run())
    assert chunks[-1] == "data: [DONE]\n\n"
    bodies = [json.loads(c[6:]) for c in chunks[:-1]]
    content = "".join(b["choices"][0]["delta"].get("content", "") for b in bodies)
    assert content == "Sure. "
    calls = [
        b["choices"][0]["delta"]["tool_calls"] for b in bodies if "tool_calls" in b["choices"][0]["delta"]
    ]
    assert len(calls) == 1 and calls[0][0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert bodies[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_max_tokens_beyond_the_window_is_clamped_or_rejected(start_service, tiny_model_dir):
    """Agents ask for more output than the window leaves (OpenClaw: 8,192): by default the budget is
    clamped to what is left and the answer ends with finish_reason "length"; "reject" refuses it."""
    from openai import BadRequestError, OpenAI

    _, url = start_service(tiny_model_dir, "clamp", max_model_len=48)
    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60)
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=8192, temperature=0.0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 48  # every token the window had left
    models = client.models.list().data[0].model_dump()
    assert models["max_model_len"] == models["context_length"] == models["context_window"] == 48

    _, strict = start_service(tiny_model_dir, "strict", max_model_len=48, max_tokens_overflow="reject")
    with pytest.raises(BadRequestError) as exc:
        OpenAI(base_url=f"{strict}/v1", api_key="none", timeout=60).chat.completions.create(
            model="m", messages=USER, max_tokens=8192
        )
    assert (
        exc.value.body["code"] == "context_length_exceeded"
        and "maximum context length is 48" in exc.value.message
    )


def test_a_prompt_that_cannot_fit_gets_openais_overflow_error(start_service, tiny_model_dir):
    from openai import BadRequestError, OpenAI

    _, url = start_service(tiny_model_dir, "overflow", max_model_len=32)
    with pytest.raises(BadRequestError) as exc:
        OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "word " * 100}], max_tokens=4
        )
    err = exc.value.body
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["param"] == "messages" and "maximum context length is 32 tokens" in err["message"]
    # the Anthropic SDK on /v1/messages gets Anthropic's words, which its agent clients compact on
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as aexc:
        anthropic.Anthropic(base_url=url, api_key="none", timeout=60, max_retries=0).messages.create(
            model="m", messages=[{"role": "user", "content": "word " * 100}], max_tokens=4
        )
    said = aexc.value.body["error"]
    assert said["type"] == "invalid_request_error"
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 32 maximum", said["message"]), said


def _still_serves(url: str) -> None:
    """A plain request to the service at ``url`` is answered 200."""
    ok = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text[:300]


def test_a_body_far_beyond_the_window_is_refused_unread_and_others_are_served(start_service, tiny_model_dir):
    """413 on every model route, with or without a Content-Length, before it is parsed or tokenised."""
    from openclaw_rl.policy.api_router import max_body_bytes

    svc, url = start_service(tiny_model_dir, "huge", max_model_len=64)
    limit = max_body_bytes(64)
    huge = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (limit + 10)}]}).encode()
    for route in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(
            f"{url}{route}", content=huge, headers={"Content-Type": "application/json"}, timeout=60
        )
        assert r.status_code == 413, (route, r.text[:300])
        assert "reads at most" in r.text and "window is 64 tokens" in r.text, r.text[:300]

    def chunked():  # no Content-Length: the size is learnt while reading
        for i in range(0, len(huge), 1 << 16):
            yield huge[i : i + (1 << 16)]

    r = httpx.post(f"{url}/v1/chat/completions", content=chunked(), timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert svc.store.counters().turns == 0
    _still_serves(url)


def test_episode_group_and_outcome_headers_are_kept_on_the_session(tiny_service, client):
    svc, _ = tiny_service
    group = {"X-Session-Id": "ep-1", "X-Episode-Group": "grp-7", "X-Episode-Group-Size": "2"}
    r0 = client.post("/v1/chat/completions", headers=group, json={"messages": USER, "max_tokens": 3})
    assert r0.status_code == 200
    assert svc.store.session_group("ep-1") == "grp-7"
    msgs = USER + [r0.json()["choices"][0]["message"], {"role": "user", "content": "exit code: 0"}]
    r1 = client.post(
        "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 2},
        headers={**group, "X-Session-Done": "true", "X-Episode-Outcome": "1"},
    )
    assert r1.status_code == 200
    assert svc.store.group_episodes("grp-7") == [("ep-1", 1.0)]
    for headers, names in (
        ({"X-Episode-Group-Size": "2"}, "X-Episode-Group-Size needs X-Episode-Group"),
        ({"X-Episode-Group": "g", "X-Episode-Group-Size": "two"}, "X-Episode-Group-Size"),
        ({"X-Episode-Group": "g", "X-Episode-Group-Size": "0"}, "X-Episode-Group-Size"),
        ({"X-Episode-Group": "g", "X-Episode-Outcome": "7"}, "X-Episode-Outcome"),
        ({"X-Episode-Group": "g", "X-Episode-Outcome": "nan"}, "X-Episode-Outcome"),
    ):
        r = client.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": "bad-ep", **headers},
            json={"messages": USER, "max_tokens": 2},
        )
        assert r.status_code == 400, headers
        assert names in r.json()["error"]["message"] and r.json()["error"]["param"] in names
    assert svc.store.session_turns("bad-ep") == []  # refused before anything was recorded
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}).status_code == 200


def test_a_simulated_users_truth_travels_with_the_next_state(tiny_service, client):
    svc, _ = tiny_service
    r0 = client.post(
        "/v1/chat/completions", headers={"X-Session-Id": "tr"}, json={"messages": USER, "max_tokens": 3}
    )
    msgs = USER + [r0.json()["choices"][0]["message"], {"role": "user", "content": "no bold please"}]
    for bad in ("1.5", "-0.1", "nan", "high"):
        r = client.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": "tr", "X-Turn-Truth": bad},
            json={"messages": msgs, "max_tokens": 2},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Turn-Truth", bad
    assert [t.next_state for t in svc.store.session_turns("tr")] == [None]  # nothing recorded on a 400
    r1 = client.post(
        "/v1/chat/completions",
        headers={"X-Session-Id": "tr", "X-Turn-Truth": "0.25"},
        json={"messages": msgs, "max_tokens": 2},
    )
    assert r1.status_code == 200
    first = svc.store.session_turns("tr")[0]
    assert first.next_state is not None and first.next_state.content == "no bold please"
    assert first.next_state.truth == 0.25


def _idle(url: str) -> None:
    """Wait until the service has no request in flight (generous: it only bounds a failing test)."""
    import time

    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/healthz", timeout=10).json()["in_flight"] > 0:
        assert time.monotonic() < deadline, "a request nobody waits for is still being served"
        time.sleep(0.1)


def test_a_client_that_hangs_up_stops_its_generation_and_only_its_next_state_is_kept(tiny_service, client):
    svc, url = tiny_service
    first = client.post(
        "/v1/chat/completions", json={"messages": USER, "max_tokens": 4}, headers={"X-Session-Id": "hangup"}
    ).json()
    reply = first["choices"][0]["message"]["content"]
    # the next request carries the user's reply (the first turn's next state), and asks for a reply
    # far longer than a client waits for: it reads the first event and hangs up
    convo = [*USER, {"role": "assistant", "content": reply}, {"role": "user", "content": "and 3+3?"}]
    long = {"messages": convo, "max_tokens": 6000, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=long, headers={"X-Session-Id": "hangup"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    _idle(url)
    turns = _turns(svc, "hangup")
    assert [t.turn_index for t in turns] == [0]  # the reply nobody read is not recorded ...
    assert turns[0].next_state is not None and turns[0].next_state.content == "and 3+3?"  # ... its message is
    # the user asks again: that turn is number 1, as if the abandoned one had never been allocated
    again = client.post(
        "/v1/chat/completions", json={"messages": convo, "max_tokens": 2}, headers={"X-Session-Id": "hangup"}
    )
    assert again.status_code == 200 and [t.turn_index for t in _turns(svc, "hangup")] == [0, 1]
    # the same for a JSON request whose client times out
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": USER, "max_tokens": 6000, "temperature": 0},
            headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": "timeout"},
            timeout=httpx.Timeout(1.0, connect=10.0),
        )
    _idle(url)
    assert _turns(svc, "timeout") == []
    ok = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3  # still serving


def test_a_body_that_stops_arriving_is_answered_408_and_others_are_served(
    start_service, tiny_model_dir, monkeypatch
):
    """A client that sends part of its body and stalls does not keep its place (nor the server's
    stop) for as long as it likes."""
    import socket

    from openclaw_rl.policy import api_router

    monkeypatch.setattr(api_router, "BODY_STALL_S", 1.0)
    svc, url = start_service(tiny_model_dir, "stall")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 500\r\n\r\n{"model": "m", "messages": ['
        )
        with sock.makefile("rb") as reply:  # the head, then as many body bytes as it announces
            lines = []
            while (line := reply.readline()) not in (b"\r\n", b""):
                lines.append(line)
            head = b"".join(lines).decode()
            length = int(re.search(r"content-length: (\d+)", head, re.IGNORECASE).group(1))
            answer = head + reply.read(length).decode()
    assert answer.startswith("HTTP/1.1 408"), answer[:300]
    assert "request_timeout" in answer and "stopped arriving" in answer
    assert svc.store.counters().turns == 0
    _still_serves(url)


def test_a_body_that_trickles_in_is_answered_408_once_its_time_is_up(
    start_service, tiny_model_dir, monkeypatch
):
    import socket

    from openclaw_rl.policy import api_router

    monkeypatch.setattr(api_router, "BODY_STALL_S", 1.0)
    monkeypatch.setattr(api_router, "BODY_DEADLINE_S", 2.0)
    svc, url = start_service(tiny_model_dir, "trickle")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n")
        sock.settimeout(0.4)
        answer = b""
        for _ in range(40):  # a byte every 0.4 s: never 1 s without one, never done
            try:
                sock.sendall(b" ")
                answer += sock.recv(65536)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass
            if b"came too slowly" in answer:
                break
    assert answer.startswith(b"HTTP/1.1 408") and b"came too slowly" in answer, answer[:300]
    assert svc.store.counters().turns == 0


def test_a_full_disk_ends_every_reply_with_a_reason_and_the_service_recovers(start_service, tiny_model_dir):
    """When the store cannot take a turn (SQLite: database or disk is full) a client still gets an
    end: a 503 naming the full disk, or an error at the end of its stream, never a reply that hangs."""
    import sqlite3

    svc, url = start_service(tiny_model_dir, "full")
    real = svc.store.record_turn, svc.store.attach_next_state

    def full(*_a, **_k):
        raise sqlite3.OperationalError("database or disk is full")

    svc.store.record_turn = svc.store.attach_next_state = full  # type: ignore[method-assign]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "disk_full", r.text
    assert "disk under the run's folder is full" in r.json()["error"]["message"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as s:
        streamed = "".join(s.iter_text())
    assert "disk_full" in streamed, streamed[-500:]
    svc.store.record_turn, svc.store.attach_next_state = real  # type: ignore[method-assign]
    _still_serves(url)
