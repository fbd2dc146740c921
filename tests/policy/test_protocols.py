"""The Responses and Messages APIs with the official ``openai`` and ``anthropic`` SDKs over real HTTP.

Each request is served and recorded by the chat path: the tests check what the client parses and
what the store holds (the same token ids, sessions, next states as a chat turn).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ..helpers import weather_round
from .conftest import KEY

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _openai(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _anthropic(url: str, key: str = KEY):
    from anthropic import Anthropic

    return Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


def _turn(svc, response_id: str):
    found = svc.store.turn_by_response(response_id)
    assert found is not None, f"{response_id} not recorded"
    return found[0]


# ---------------------------------------------------------------------------------------- Responses
def test_responses_create_is_recorded_like_a_chat_turn(tiny_service):
    svc, url = tiny_service
    resp = _openai(url).responses.create(
        model="policy", input="What is 2+2?", instructions="Answer briefly.", max_output_tokens=6
    )
    assert (
        resp.id.startswith("resp_")
        and resp.object == "response"
        and resp.status in ("completed", "incomplete")
    )
    turn = _turn(svc, resp.id)
    assert turn.messages[0] == {"role": "system", "content": "Answer briefly."}
    assert turn.messages[1] == {"role": "user", "content": "What is 2+2?"}
    assert resp.output_text == turn.response_text
    assert resp.usage.input_tokens == len(turn.prompt_ids) and resp.usage.output_tokens == len(
        turn.response_ids
    )
    assert len(turn.response_logprobs) == len(turn.response_ids) > 0


def test_every_route_answers_what_the_sdks_types_validate_strictly(tiny_service):
    """Lenient parsing hides a missing required field; clients that validate (pydantic, typed
    wrappers) do not. Each route's raw JSON passes its official SDK type's own validation."""
    from anthropic.types import Message
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    _, url = tiny_service
    oa = _openai(url)
    raw = oa.responses.with_raw_response.create(model="policy", input="Hi", max_output_tokens=6)
    Response.model_validate(raw.http_response.json())
    raw = oa.chat.completions.with_raw_response.create(
        model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=6
    )
    ChatCompletion.model_validate(raw.http_response.json())
    raw = _anthropic(url).messages.with_raw_response.create(
        model="policy", max_tokens=6, messages=[{"role": "user", "content": "Hi"}]
    )
    Message.model_validate(raw.http_response.json())


def test_streamed_responses_are_the_sdks_typed_events(tiny_service):
    svc, url = tiny_service
    stream = _openai(url).responses.create(
        model="policy", input="Say hello.", max_output_tokens=8, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[1] == "response.in_progress"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas == _turn(svc, final.id).response_text
    assert "response.output_item.done" in kinds


def test_previous_response_id_continues_the_session_without_headers(tiny_service):
    svc, url = tiny_service
    client = _openai(url)
    first = client.responses.create(model="policy", input="Name a colour.", max_output_tokens=4)
    second = client.responses.create(
        model="policy", input="no, a darker one", previous_response_id=first.id, max_output_tokens=4
    )
    t1, t2 = _turn(svc, first.id), _turn(svc, second.id)
    assert t2.session_id == t1.session_id and t2.turn_index == t1.turn_index + 1
    assert t2.messages[-1] == {"role": "user", "content": "no, a darker one"}
    assert t2.messages[-2]["role"] == "assistant" and t2.messages[-2]["content"] == first.output_text
    stored = svc.store.session_turns(t1.session_id)[0]
    assert stored.next_state is not None and stored.next_state.content == "no, a darker one"
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client.responses.create(
            model="policy", input="hi", previous_response_id="resp_nope", max_output_tokens=2
        )
    # a session named with a "/" is answered in the body as it was sent (its stored id is scoped)
    named = client.responses.create(
        model="policy", input="hi", max_output_tokens=2, extra_headers={"X-Session-Id": "team/chat-1"}
    )
    assert named.model_extra["session_id"] == "team/chat-1"
    assert _turn(svc, named.id).session_id == "default/team/chat-1"
    unstored = client.responses.create(model="policy", input="x", store=False, max_output_tokens=2)
    with pytest.raises(NotFoundError):
        client.responses.create(
            model="policy", input="y", previous_response_id=unstored.id, max_output_tokens=2
        )


def test_a_stored_response_can_be_read_back_listed_and_deleted(tiny_service):
    from openai import NotFoundError

    svc, url = tiny_service
    client = _openai(url)
    first = client.responses.create(
        model="policy", input="Name a colour.", instructions="Be brief.", max_output_tokens=4
    )
    second = client.responses.create(
        model="policy", input="no, a darker one", previous_response_id=first.id, max_output_tokens=4
    )
    got = client.responses.retrieve(second.id)
    assert (got.id, got.output_text, got.status) == (second.id, second.output_text, second.status)
    assert got.usage is not None and second.usage is not None
    assert got.usage.output_tokens == second.usage.output_tokens
    assert got.previous_response_id == first.id

    # the conversation it read, as items: oldest first with order=asc, newest first by default
    items = client.responses.input_items.list(second.id, order="asc").data
    said = [(i.type, i.role, i.content[0].text) for i in items if i.type == "message" and i.content]
    assert said[0] == ("message", "user", "Name a colour.")
    assert said[-1] == ("message", "user", "no, a darker one")
    if first.output_text:
        assert ("message", "assistant", first.output_text) in said
        # an item keeps its id from response to response: the reply under its output item's id,
        # the first question under the id the first response listed it with
        by_text = {i.content[0].text: i.id for i in items if i.type == "message" and i.content}
        assert by_text[first.output_text] == first.output[0].id
        (asked,) = client.responses.input_items.list(first.id).data
        assert by_text["Name a colour."] == asked.id
    newest_first = client.responses.input_items.list(second.id).data
    assert [i.id for i in newest_first] == [i.id for i in reversed(items)]
    one = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert [i.id for i in one.data] == [items[0].id] and one.has_more
    rest = client.responses.input_items.list(second.id, order="asc", after=items[0].id).data
    assert [i.id for i in rest] == [i.id for i in items[1:]]
    with pytest.raises(Exception, match="limit"):
        client.responses.input_items.list(second.id, limit=500)

    # a streamed response is kept as its final event showed it
    events = list(client.responses.create(model="policy", input="Say hi.", max_output_tokens=4, stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == final.output_text

    client.responses.delete(second.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(NotFoundError):
        client.responses.create(
            model="policy", input="x", previous_response_id=second.id, max_output_tokens=2
        )
    assert _turn(svc, second.id).response_text == second.output_text  # still a recorded turn
    with pytest.raises(NotFoundError):
        client.responses.delete(second.id)
    unstored = client.responses.create(model="policy", input="x", store=False, max_output_tokens=2)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve("resp_nope")


def test_a_tool_round_trip_is_translated_and_recorded(tiny_service):
    svc, url = tiny_service
    client = _openai(url)
    first = client.responses.create(
        model="policy", input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=4
    )
    # the client ran the tool the model asked for and sends the call and its output back
    second = client.responses.create(
        model="policy",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[
            {
                "type": "function_call",
                "call_id": "call_7",
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_7", "output": "4C, light snow"},
        ],
        max_output_tokens=4,
    )
    turn = _turn(svc, second.id)
    assert turn.messages[-1] == {"role": "tool", "tool_call_id": "call_7", "content": "4C, light snow"}
    assistant = turn.messages[-2]
    assert (
        assistant["role"] == "assistant" and assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    earlier = svc.store.session_turns(turn.session_id)
    assert earlier[0].next_state is not None and earlier[0].next_state.role == "tool"
    assert earlier[0].next_state.content == "4C, light snow"


def test_the_model_calling_a_tool_becomes_a_function_call_item(tiny_service):
    """Rendering of a tool call the engine produced (scripted engine events, as the chat stream test)."""
    from openclaw_rl.policy.engine import Delta, Final
    from openclaw_rl.policy.identity import Caller
    from openclaw_rl.policy.responses_api import ResponsesCall
    from openclaw_rl.policy.tools import parse_tool_calls

    svc, _ = tiny_service
    text = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'

    async def run(stream: bool):
        body = {"input": "Weather in Oslo?", "tools": [WEATHER], "stream": stream}
        call = ResponsesCall(svc.serving, json.dumps(body).encode(), {}, Caller(None, True))
        job = await call.start()
        await svc.serving.drain(60)  # let the real generation end
        while not job.events.empty():
            job.events.get_nowait()
        await job.events.put(Delta(text, [1], [-0.1], [text]))
        job.final = Final("stop", job.final.prompt_ids, [1], [-0.1], text, 0)
        job.content, job.tool_calls = parse_tool_calls(text, job.gen.tools)
        await job.events.put(job.final)
        if stream:
            return [c async for c in call.stream()]
        return await call.complete()

    out = asyncio.run(run(False))
    kinds = [o["type"] for o in out["output"]]
    assert kinds == ["message", "function_call"]
    fc = out["output"][1]
    assert fc["name"] == "get_weather" and json.loads(fc["arguments"]) == {"city": "Oslo"}
    events = asyncio.run(run(True))
    names = [e.split("\n")[0].removeprefix("event: ") for e in events]
    assert "response.function_call_arguments.done" in names and names[-1] == "response.completed"


def test_responses_errors_name_the_field(tiny_service):
    _, url = tiny_service
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        r = c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
        r = c.post("/v1/responses", json={"input": "hi", "tools": [{"type": "web_search"}]})
        assert r.status_code == 400 and "only function tools" in r.json()["error"]["message"]
        r = c.post("/v1/responses", json={"input": [{"type": "input_image", "image_url": "x"}]})
        assert r.status_code == 400 and "input[0]" in r.json()["error"]["message"]
        assert (
            c.post("/v1/responses", json={"input": "hi"}, headers={"Authorization": "Bearer no"}).status_code
            == 401
        )


def test_responses_show_log_probs_when_included_whole_and_streamed(tiny_service):
    """``include = ["message.output_text.logprobs"]`` with ``top_logprobs``: an entry per token of
    the text, its bytes spelling the text, as chat shows them; left out, none."""
    _, url = tiny_service
    client = _openai(url)
    ask = {
        "model": "policy",
        "input": "Say hello.",
        "max_output_tokens": 6,
        "temperature": 0,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    resp = client.responses.create(**ask)
    (part,) = resp.output[0].content
    assert part.logprobs and b"".join(bytes(e.bytes) for e in part.logprobs) == part.text.encode()
    assert all(len(e.top_logprobs) == 2 for e in part.logprobs) and resp.top_logprobs == 2
    events = list(client.responses.create(**ask, stream=True))
    shown = [e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    assert [e.token for e in shown] == [e.token for e in part.logprobs]  # temperature 0: the same reply
    done = next(ev for ev in events if ev.type == "response.output_text.done")
    assert [e.token for e in done.logprobs] == [e.token for e in part.logprobs]
    final = events[-1].response.output[0].content[0]  # the response object the stream ends with
    assert [e.token for e in final.logprobs] == [e.token for e in part.logprobs]
    plain = client.responses.create(**{k: v for k, v in ask.items() if k not in ("include", "top_logprobs")})
    assert plain.output[0].content[0].logprobs == []


def test_responses_state_kept_only_by_openai_is_refused_not_ignored(tiny_service):
    """A stored conversation or prompt template would silently be missing from the reply."""
    from openai import BadRequestError

    _, url = tiny_service
    client = _openai(url)
    with pytest.raises(BadRequestError) as err:
        client.responses.create(model="policy", input="hi", conversation="conv_123")
    assert "previous_response_id" in str(err.value) and err.value.body["param"] == "conversation"
    with pytest.raises(BadRequestError) as err:
        client.responses.create(model="policy", input="hi", prompt={"id": "pmpt_1"})
    assert err.value.body["param"] == "prompt"


def test_truncation_auto_drops_the_oldest_turns_to_fit_disabled_refuses(start_service, tiny_model_dir):
    """A chain of responses that outgrows the window: ``truncation = "auto"`` is served on its newest
    turn(s) (the instructions kept), ``"disabled"`` (the default) is OpenAI's 400."""
    from openai import BadRequestError

    svc, url = start_service(tiny_model_dir, "trunc", api_key=KEY, max_model_len=256)
    client = _openai(url)
    prev = None
    for k in range(6):  # about 60 tokens a turn: the chain passes 256 by the fifth
        resp = client.responses.create(
            model="policy",
            instructions="Keep it short.",
            input=f"turn {k}: " + "tell me more " * 12,
            previous_response_id=prev,
            max_output_tokens=4,
            truncation="auto",
        )
        assert resp.truncation == "auto" and resp.usage.input_tokens < 256
        prev = resp.id
    turn = _turn(svc, prev)
    assert turn.messages[0] == {"role": "system", "content": "Keep it short."}
    assert "turn 5" in turn.messages[-1]["content"] and "turn 0" not in json.dumps(turn.messages)
    with pytest.raises(BadRequestError) as err:
        client.responses.create(
            model="policy", input="tell me more " * 12, previous_response_id=prev, max_output_tokens=4
        )
    assert err.value.code == "context_length_exceeded"


# ---------------------------------------------------------------------------------------- Messages
def test_messages_create_with_the_anthropic_sdk_is_recorded(tiny_service):
    svc, url = tiny_service
    msg = _anthropic(url).messages.create(
        model="policy",
        max_tokens=6,
        system="You are terse.",
        messages=[{"role": "user", "content": "What is 3+3?"}],
    )
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    turn = _turn(svc, msg.id)
    assert turn.messages[0] == {"role": "system", "content": "You are terse."}
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == turn.response_text
    assert msg.usage.input_tokens == len(turn.prompt_ids) and msg.usage.output_tokens == len(
        turn.response_ids
    )


def test_an_opaque_metadata_user_id_as_claude_code_sends_it_is_served(tiny_service):
    # Anthropic's user_id is opaque; Claude Code sends a JSON string or an id with its session in
    # it (123 characters with an API-key login, no account). None is a user name: served as an
    # unnamed request, not refused.
    svc, url = tiny_service
    for user_id in (
        json.dumps({"device_id": "abc", "account_uuid": "", "session_id": "4f1c"}),
        "user_" + "a" * 64 + "_account_" + "b" * 36 + "_session_" + "c" * 36,
        "user_"
        + "0123456789abcdef" * 4
        + "_account__session_"
        + "-".join(("9" * 8, "1" * 4, "4" * 4, "8" * 4, "0" * 12)),
    ):
        msg = _anthropic(url).messages.create(
            model="policy",
            max_tokens=3,
            metadata={"user_id": user_id},
            messages=[{"role": "user", "content": "Hi"}],
        )
        assert _turn(svc, msg.id).user == "default"


def test_a_messages_conversation_is_stitched_and_its_reply_is_the_next_state(tiny_service):
    svc, url = tiny_service
    client = _anthropic(url)
    convo = [{"role": "user", "content": "Pick a number."}]
    first = client.messages.create(model="policy", max_tokens=4, messages=convo)
    convo += [
        {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks, that's perfect"}]},
    ]
    second = client.messages.create(model="policy", max_tokens=4, messages=convo)
    t1, t2 = _turn(svc, first.id), _turn(svc, second.id)
    assert t2.session_id == t1.session_id and t2.turn_index == 1
    assert svc.store.session_turns(t1.session_id)[0].next_state.content == "thanks, that's perfect"


def test_a_forced_call_cut_short_leaves_no_empty_text_block(tiny_service):
    """A forced tool call that max_tokens cuts off has no text and no call: the content is empty
    (as Anthropic's can be), not an empty text block, which Anthropic refuses in a history sent back."""
    _, url = tiny_service
    client = _anthropic(url)
    tools = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER["parameters"]}]
    ask = dict(
        model="policy",
        max_tokens=2,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=tools,
        tool_choice={"type": "any"},
    )
    reply = client.messages.create(**ask)
    assert reply.stop_reason == "max_tokens"
    assert not any(b.type == "text" and not b.text for b in reply.content), reply.content
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert not any(b.type == "text" and not b.text for b in final.content), final.content


def test_streamed_messages_and_a_tool_result(tiny_service):
    svc, url = tiny_service
    client = _anthropic(url)
    tools = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER["parameters"]}]
    convo = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4C, snow"}],
        },
    ]
    with client.messages.stream(model="policy", max_tokens=6, messages=convo, tools=tools) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.id.startswith("msg_") and "".join(b.text for b in final.content if b.type == "text") == text
    turn = _turn(svc, final.id)
    assert turn.messages[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": "4C, snow"}
    assert turn.messages[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert turn.response_text == text


def test_a_stop_sequence_that_ends_the_reply_is_named_as_anthropic_does(tiny_service):
    _, url = tiny_service
    client = _anthropic(url)
    ask = {"model": "policy", "max_tokens": 10, "messages": [{"role": "user", "content": "Count."}]}
    greedy = {"temperature": 0}
    plain = client.messages.create(**ask, extra_body=greedy)
    text = plain.content[0].text
    assert len(text) > 4 and plain.stop_reason == "max_tokens" and plain.stop_sequence is None
    stop = text[2:4]
    hit = client.messages.create(**ask, stop_sequences=["never-said", stop], extra_body=greedy)
    assert (hit.stop_reason, hit.stop_sequence) == ("stop_sequence", stop)
    assert "".join(b.text for b in hit.content if b.type == "text") == text[: text.find(stop)]
    with client.messages.stream(**ask, stop_sequences=[stop], extra_body=greedy) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
    missed = client.messages.create(**ask, stop_sequences=["never-said"], extra_body=greedy)
    assert (missed.stop_reason, missed.stop_sequence) == ("max_tokens", None)


def test_a_prefilled_reply_is_continued_and_the_conversation_goes_on_in_its_session(
    tiny_service, tiny_model_dir
):
    from openclaw_rl.runtime.chat_format import prompt_ids
    from openclaw_rl.runtime.models import load_tokenizer

    svc, url = tiny_service
    tok = load_tokenizer(str(tiny_model_dir))
    client = _anthropic(url)
    convo = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    msg = client.messages.create(model="policy", max_tokens=4, messages=convo)
    turn = _turn(svc, msg.id)
    # Anthropic's prefill: the reply continues the assistant's text; the message holds only what follows
    assert tok.decode(turn.prompt_ids).endswith("<|im_start|>assistant\nThe colour is")
    assert turn.continues_final and msg.content[0].text == turn.response_text
    assert (
        prompt_ids(tok, turn.messages, turn.tools, turn.continues_final) == turn.prompt_ids
    )  # the teacher's
    assert client.messages.count_tokens(model="policy", messages=convo).input_tokens == len(turn.prompt_ids)
    # the client sends the whole reply back: same session, and the user's answer is the turn's next state
    whole = "The colour is" + msg.content[0].text
    later = client.messages.create(
        model="policy",
        max_tokens=2,
        messages=[
            convo[0],
            {"role": "assistant", "content": whole},
            {"role": "user", "content": "a darker one"},
        ],
    )
    after = _turn(svc, later.id)
    assert (after.session_id, after.turn_index) == (turn.session_id, turn.turn_index + 1)
    first = svc.store.session_turns(turn.session_id)[turn.turn_index]
    assert first.next_state is not None and first.next_state.content == "a darker one"
    # on chat completions it is vLLM's continue_final_message, which needs an assistant message last
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        ok = c.post(
            "/v1/chat/completions",
            json={
                "messages": convo,
                "max_tokens": 2,
                "continue_final_message": True,
                "return_token_ids": True,
            },
        )
        assert ok.status_code == 200 and tok.decode(ok.json()["prompt_token_ids"]).endswith("The colour is")
        bad = c.post(
            "/v1/chat/completions",
            json={"messages": convo[:1], "max_tokens": 2, "continue_final_message": True},
        )
        assert bad.status_code == 400 and "continue_final_message" in bad.json()["error"]["message"]


def test_messages_errors_have_anthropics_shape_and_x_api_key_works(tiny_service):
    from anthropic import AuthenticationError, BadRequestError

    _, url = tiny_service
    with pytest.raises(AuthenticationError) as info:
        _anthropic(url, key="wrong").messages.create(
            model="policy", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(BadRequestError) as bad:
        _anthropic(url).messages.create(
            model="policy", max_tokens=0, messages=[{"role": "user", "content": "hi"}]
        )
    assert (
        bad.value.body["error"]["type"] == "invalid_request_error"
        and "max_tokens" in bad.value.body["error"]["message"]
    )
    r = httpx.post(
        f"{url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "p", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in r.json()["error"]["message"]


def test_an_empty_message_is_refused_not_dropped(tiny_service):
    """Dropped, an empty last user message would turn the request into a continuation of the
    assistant's text; both APIs refuse it, naming the message, and record nothing."""
    from anthropic import BadRequestError as AnthropicBadRequest
    from openai import BadRequestError as OpenAIBadRequest

    svc, url = tiny_service
    before = svc.store.counters().turns
    prefix = [
        {"role": "user", "content": "Name three fruits."},
        {"role": "assistant", "content": "Sure: apple,"},
    ]
    for empty in ([], ""):
        with pytest.raises(AnthropicBadRequest) as bad:
            _anthropic(url).messages.create(
                model="policy", max_tokens=4, messages=[*prefix, {"role": "user", "content": empty}]
            )
        assert "messages[2].content is empty" in bad.value.body["error"]["message"], bad.value.body
    with pytest.raises(AnthropicBadRequest) as bad:
        _anthropic(url).messages.create(
            model="policy", max_tokens=4, messages=[{"role": "user", "content": []}]
        )
    assert "messages[0].content is empty" in bad.value.body["error"]["message"]
    with pytest.raises(OpenAIBadRequest) as info:
        _openai(url).chat.completions.create(
            model="policy", max_tokens=4, messages=[*prefix, {"role": "user", "content": []}]
        )
    assert info.value.body["param"].startswith("messages[2]") and "empty list" in info.value.body["message"]
    assert svc.store.counters().turns == before
    # an empty assistant message, last or earlier, is served (this service can reply with no text,
    # and clients send that reply back)
    for convo in (
        [*prefix[:1], {"role": "assistant", "content": ""}],
        [*prefix[:1], {"role": "assistant", "content": []}, {"role": "user", "content": "again?"}],
    ):
        assert (
            _anthropic(url)
            .messages.create(model="policy", max_tokens=2, messages=convo)
            .id.startswith("msg_")
        )


def test_a_message_carries_its_session_and_turn_like_every_route(tiny_service):
    _, url = tiny_service
    raw = _anthropic(url).messages.with_raw_response.create(
        model="policy", max_tokens=3, messages=[{"role": "user", "content": "hello"}]
    )
    body = json.loads(raw.http_response.text)
    assert body["session_id"] == raw.headers["x-session-id"] and body["turn_index"] == int(
        raw.headers["x-turn-index"]
    )
    assert isinstance(body["policy_version"], int)
    with _anthropic(url).messages.stream(
        model="policy", max_tokens=3, messages=[{"role": "user", "content": "hello again"}]
    ) as stream:
        events = list(stream)
    start = next(e for e in events if e.type == "message_start")
    delta = next(e for e in events if e.type == "message_delta")
    assert start.message.model_extra["session_id"] and start.message.model_extra["turn_index"] == 0
    assert isinstance(delta.model_extra["policy_version"], int)


def test_count_tokens_is_the_prompt_the_reply_reads_and_records_nothing(tiny_service):
    svc, url = tiny_service
    client = _anthropic(url)
    tools = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER["parameters"]}]
    convo = [{"role": "user", "content": "Weather in Oslo, please?"}]
    before = svc.store.counters().turns
    counted = client.messages.count_tokens(model="policy", system="Be brief.", messages=convo, tools=tools)
    assert svc.store.counters().turns == before  # a count is no turn
    msg = client.messages.create(
        model="policy", max_tokens=2, system="Be brief.", messages=convo, tools=tools
    )
    assert counted.input_tokens == msg.usage.input_tokens > 0
    bare = client.messages.count_tokens(model="policy", messages=convo)
    assert 0 < bare.input_tokens < counted.input_tokens  # the tools and the system prompt take tokens
    from anthropic import BadRequestError

    with pytest.raises(BadRequestError) as bad:
        client.messages.count_tokens(model="policy", messages=[])
    assert bad.value.body["type"] == "error" and "messages" in bad.value.body["error"]["message"]


def test_the_served_model_can_be_looked_up_by_name_with_either_sdk(tiny_service):
    from openai import NotFoundError

    _, url = tiny_service
    name = _openai(url).models.list().data[0].id
    assert _openai(url).models.retrieve(name).id == name
    card = _anthropic(url).models.retrieve(name)
    assert card.id == name and card.type == "model" and card.display_name and card.created_at.year >= 2024
    assert [m.id for m in _anthropic(url).models.list()] == [name]
    with pytest.raises(NotFoundError) as missing:
        _openai(url).models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found" and "gpt-4o" in str(missing.value.message)
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as theirs:  # Anthropic's error shape to its SDK
        _anthropic(url).models.retrieve("claude-opus")
    assert theirs.value.body["type"] == "error" and theirs.value.body["error"]["type"] == "not_found_error"
    # an OpenAI route keeps OpenAI's shape (its code and param) whatever headers a proxy forwards
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": []},
        headers={"anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert r.status_code >= 400 and "code" in r.json()["error"] and "type" not in r.json(), r.text


def test_a_tool_result_that_answers_no_call_is_refused_on_every_route(tiny_service):
    """As the official APIs: a tool result for an id no call made (a stale id, a cut history) is a 400
    in the caller's protocol, and nothing is recorded (it would be trained on as a next state)."""
    import anthropic
    import openai

    svc, url = tiny_service
    before = svc.store.counters().turns
    weather = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    asked = {"role": "user", "content": "Weather?"}
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
    }
    stale = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_XXX", "content": "sunny"}],
    }
    with pytest.raises(anthropic.BadRequestError) as err:
        _anthropic(url).messages.create(model="m", max_tokens=2, tools=weather, messages=[asked, call, stale])
    assert "'toolu_XXX'" in str(err.value) and "did not make" in str(err.value)
    with pytest.raises(anthropic.BadRequestError):
        _anthropic(url).messages.create(model="m", max_tokens=2, tools=weather, messages=[stale])
    with pytest.raises(openai.BadRequestError) as oerr:
        _openai(url).chat.completions.create(
            model="m",
            max_tokens=2,
            messages=[
                {"role": "user", "content": "w"},
                {"role": "tool", "tool_call_id": "call_zzz", "content": "x"},
            ],
        )
    assert "must follow an assistant message that made tool calls" in str(oerr.value)
    with pytest.raises(openai.BadRequestError) as rerr:
        _openai(url).responses.create(
            model="m",
            max_output_tokens=16,
            input=[
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "call_zzz", "output": "x"},
            ],
        )
    assert "'call_zzz'" in str(rerr.value) or "must follow" in str(rerr.value)
    assert svc.store.counters().turns == before
    # the same results answering their calls are served
    fixed = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
    }
    reply = _anthropic(url).messages.create(
        model="m", max_tokens=2, tools=weather, messages=[asked, call, fixed]
    )
    assert reply.id.startswith("msg_")
    out = _openai(url).responses.create(
        model="m",
        max_output_tokens=16,
        input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "x"},
        ],
    )
    assert out.id.startswith("resp_")


def test_malformed_blocks_and_items_are_a_400_naming_the_callers_field(tiny_service):
    """Shapes the SDKs' types forbid but a hand-written client sends: each is a 400 naming the field
    as the caller wrote it (not a 500, not a Python repr recorded as a tool call's arguments), and
    an error the chat check finds names the Responses / Messages position, not the chat message's."""
    svc, url = tiny_service
    before = svc.store.counters().turns
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get", "input": {}}]}
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}, timeout=30) as c:
        for bad in (None, 5, {"type": "text", "text": "x"}, ["a"], [1]):
            result = {"type": "tool_result", "tool_use_id": "t1", "content": bad}
            body = {"model": "m", "max_tokens": 2, "messages": [call, {"role": "user", "content": [result]}]}
            for route in ("/v1/messages", "/v1/messages/count_tokens"):
                r = c.post(route, json=body)
                assert r.status_code == 400, (route, bad, r.text)
                assert r.json()["error"]["type"] == "invalid_request_error"
                assert "messages[1].content[0].content" in r.json()["error"]["message"], r.text
        bad_input = {**call["content"][0], "input": "not an object"}
        r = c.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 2, "messages": [{"role": "assistant", "content": [bad_input]}]},
        )
        assert r.status_code == 400 and "messages[0].content[0].input" in r.json()["error"]["message"]
        # a system prompt and two results in one message: the stale id is named where the client put it
        two = [
            {"role": "assistant", "content": [{**call["content"][0], "id": f"t{k}"} for k in (1, 2)]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": t, "content": "ok"} for t in ("t1", "t9")],
            },
        ]
        r = c.post("/v1/messages", json={"model": "m", "max_tokens": 2, "system": "s", "messages": two})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages[1].content[1]:"), (
            r.text
        )
        assert c.get("/v1/messages").json()["error"]["type"] == "invalid_request_error"  # a 405
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        fc = {"type": "function_call", "call_id": "c1", "name": "get", "arguments": {"x": 1}}
        out = {"type": "function_call_output", "call_id": "c1", "output": "r"}
        r = c.post("/v1/responses", json={"input": [fc, out], "max_output_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].arguments", r.text
        part = {"role": "user", "content": [{"type": "input_text", "text": {"a": 1}}]}
        r = c.post("/v1/responses", json={"input": [part], "max_output_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0].text", r.text
        stale = {"type": "function_call_output", "call_id": "c9", "output": "x"}
        r = c.post(
            "/v1/responses",
            json={
                "instructions": "be",
                "input": [{"role": "user", "content": "q"}, stale],
                "max_output_tokens": 3,
            },
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]", r.text
        assert r.json()["error"]["message"].startswith("input[1]:")
        r = c.post("/v1/responses", json={"input": "hi", "tools": [{"type": "function", "name": 5}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].name", r.text
        r = c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logit_bias": {"²": 1}},
        )
        assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"], r.text
        r = c.post(
            "/v1/chat/completions",
            content=b"\x1f\x8b\x08\x00",
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert r.status_code == 415 and "Content-Encoding" in r.json()["error"]["message"]
        r = c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"X-Episode-Group": "g\x01"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Episode-Group"
    assert svc.store.counters().turns == before


def _engine_writes(monkeypatch, svc, pieces: list[str]) -> None:
    """Make the engine's reply text ``pieces`` (the tiny model cannot be made to write a given
    text): the real generation runs, for its prompt ids and recording; only its text is replaced."""
    import dataclasses

    from openclaw_rl.policy.engine import Delta, Final

    engine = svc.serving.engine
    real = engine.generate

    async def writes(gen):
        async for event in real(gen):
            if isinstance(event, Final):
                for p in pieces:
                    yield Delta(p, [1], [-0.1], [p])
                yield dataclasses.replace(event, finish_reason="stop", text="".join(pieces), stop_string=None)

    monkeypatch.setattr(engine, "generate", writes)


def test_call_markup_copied_from_history_is_never_reply_text_when_tools_are_off(tiny_service, monkeypatch):
    """A small model copies the call markup its prompt shows (earlier calls rendered back): with
    tool_choice none, or no tools sent, that markup must not reach the client as text, on any
    route, streamed or not. The engine's text is scripted here (the tiny model cannot be made to
    write it); everything after it — the chat path, the three protocols, the SDKs — is real."""
    svc, url = tiny_service
    _engine_writes(
        monkeypatch,
        svc,
        [
            "It rains.<tool",
            '_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
            " Bye",
        ],
    )
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    history = weather_round()
    client = _openai(url)
    for extra in ({"tools": [tool], "tool_choice": "none"}, {}):
        reply = client.chat.completions.create(model="m", messages=history, max_tokens=4, **extra)
        assert reply.choices[0].message.content == "It rains. Bye" and not reply.choices[0].message.tool_calls
        streamed = client.chat.completions.create(
            model="m", messages=history, max_tokens=4, stream=True, **extra
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "It rains. Bye"
    items = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "rainy"},
    ]
    out = client.responses.create(
        model="m", input=items, tools=[WEATHER], tool_choice="none", max_output_tokens=4
    )
    assert out.output_text == "It rains. Bye"
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rainy"}]},
    ]
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    msg = _anthropic(url).messages.create(
        model="m", max_tokens=4, messages=messages, tools=tools, tool_choice={"type": "none"}
    )
    assert [b.text for b in msg.content if b.type == "text"] == ["It rains. Bye"]
    with _anthropic(url).messages.stream(model="m", max_tokens=4, messages=messages) as stream:
        assert stream.get_final_text() == "It rains. Bye"


def test_parallel_tool_calls_false_gets_one_call_on_every_route(tiny_service, monkeypatch):
    svc, url = tiny_service
    call = '<tool_call>{{"name": "get_weather", "arguments": {{"city": "{}"}}}}</tool_call>'
    _engine_writes(monkeypatch, svc, [call.format("Oslo"), call.format("Rome")])
    tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ask = [{"role": "user", "content": "Weather in Oslo and Rome?"}]
    client = _openai(url)
    both = client.chat.completions.create(model="m", messages=ask, tools=[tool], max_tokens=4)
    assert [c.function.arguments for c in both.choices[0].message.tool_calls] == [
        '{"city": "Oslo"}',
        '{"city": "Rome"}',
    ]
    unset = httpx.post(  # null, as some proxies send it, is the default: both calls
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"messages": ask, "tools": [tool], "max_tokens": 4, "parallel_tool_calls": None},
        timeout=60,
    )
    assert unset.status_code == 200 and len(unset.json()["choices"][0]["message"]["tool_calls"]) == 2
    one = client.chat.completions.create(
        model="m", messages=ask, tools=[tool], max_tokens=4, parallel_tool_calls=False
    )
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == ['{"city": "Oslo"}']
    assert len(_turn(svc, one.id).tool_calls) == 1  # recorded as the client got it
    out = client.responses.create(
        model="m", input="Weather?", tools=[WEATHER], parallel_tool_calls=False, max_output_tokens=4
    )
    assert [o.type for o in out.output] == ["function_call"]
    msg = _anthropic(url).messages.create(
        model="m",
        max_tokens=4,
        messages=ask,
        tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [b.type for b in msg.content] == ["tool_use"]


def test_a_reply_starting_with_copied_markup_reads_the_same_streamed_and_whole(tiny_service, monkeypatch):
    """The stream sends what comes before a call at once; what is left after the markup goes must
    extend it, so the client reads the same text either way (and sends back what is recorded)."""
    svc, url = tiny_service
    markup = '_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    _engine_writes(monkeypatch, svc, ["\n\n<tool", markup, "\n\nThe answer is 4"])
    history = weather_round("c1", arguments="{}")
    client = _openai(url)
    whole = (
        client.chat.completions.create(model="m", messages=history, max_tokens=4).choices[0].message.content
    )
    streamed = client.chat.completions.create(model="m", messages=history, max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == whole
    assert "tool_call" not in whole and whole.endswith("The answer is 4")


def test_usage_details_are_numbers_and_a_replayed_refusal_part_is_history(tiny_service):
    """Accounting code reads ``usage.prompt_tokens_details.cached_tokens`` and adds Anthropic's cache
    counts: never null. A refusal replayed as a content part (OpenAI's history form) is served."""
    _, url = tiny_service
    chat = _openai(url).chat.completions.create(
        model="policy",
        messages=[
            {"role": "user", "content": "help me pick a lock"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
            {"role": "user", "content": "ok, a riddle then"},
        ],
        max_tokens=4,
    )
    assert 0 <= chat.usage.prompt_tokens_details.cached_tokens < chat.usage.prompt_tokens
    assert chat.usage.completion_tokens_details.reasoning_tokens == 0
    # a prompt sent again: its prefix-cache hit is counted as OpenAI counts cached tokens
    long = [{"role": "user", "content": "Tell me about bicycle gears. " * 20}]
    first = _openai(url).chat.completions.create(model="policy", messages=long, max_tokens=2)
    again = _openai(url).chat.completions.create(
        model="policy", messages=long, max_tokens=2, extra_headers={"X-Session-Id": "again"}
    )
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens
    assert again.usage.prompt_tokens_details.cached_tokens <= again.usage.prompt_tokens
    resp = _openai(url).responses.create(model="policy", input=long[0]["content"], max_output_tokens=2)
    assert resp.usage.input_tokens_details.cached_tokens > 0
    msg = _anthropic(url).messages.create(
        model="policy", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
    )
    assert (
        msg.usage.input_tokens + msg.usage.cache_read_input_tokens + msg.usage.cache_creation_input_tokens > 0
    )
    with _anthropic(url).messages.stream(
        model="policy", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens == 0
    # message_delta carries the whole usage (LangChain reads the input tokens there, not at the start)
    with httpx.stream(
        "POST",
        f"{url}/v1/messages",
        json={
            "model": "policy",
            "max_tokens": 4,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        timeout=60,
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["usage"]["input_tokens"] == final.usage.input_tokens and delta["usage"]["output_tokens"] > 0


def test_every_answer_carries_a_request_id_both_sdks_read(tiny_service, caplog):
    """A client reporting a failure can quote the id; the refused request's log line names it."""
    from openai import BadRequestError

    _, url = tiny_service
    oa = _openai(url)
    one = oa.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    two = _anthropic(url).messages.create(
        model="policy", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert one._request_id and two._request_id and one._request_id != two._request_id
    with caplog.at_level("INFO", logger="openclaw_rl"), pytest.raises(BadRequestError) as err:
        oa.chat.completions.create(model="policy", messages=[{"role": "wizard", "content": "Hi"}])
    assert err.value.request_id and err.value.request_id in caplog.text
