"""Structured output and forced tool calls, with the official SDKs over real HTTP.

The service runs the tiny random model: it writes nothing sensible, so whatever parses is the
grammar's doing. The schemas are finite (enums, booleans) so that every reply must end well
within its token budget.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

from .conftest import KEY

UNIT = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "description": "Choose the temperature unit",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "save": {"type": "boolean"},
            },
            "required": ["unit", "save"],
            "additionalProperties": False,
        },
    },
}
MODE = {
    "type": "function",
    "function": {
        "name": "set_mode",
        "parameters": {
            "type": "object",
            "properties": {"mode": {"type": "string", "enum": ["dark", "light"]}},
            "required": ["mode"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Use celsius from now on."}]


def _openai(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


class Settings(BaseModel):
    theme: Literal["dark", "light"]
    compact: bool


def _args_fit(call_args: str, tool: dict) -> None:
    args = json.loads(call_args)
    params = tool["function"]["parameters"]
    assert set(args) == set(params["required"])
    for key, value in args.items():
        spec = params["properties"][key]
        assert value in spec["enum"] if "enum" in spec else isinstance(value, bool)


def test_a_named_tool_choice_always_gets_a_call_to_that_function(tiny_service):
    svc, url = tiny_service
    client = _openai(url)
    for temperature in (0.0, 1.0):
        resp = client.chat.completions.create(
            model="policy",
            messages=ASK,
            tools=[UNIT, MODE],
            tool_choice={"type": "function", "function": {"name": "set_mode"}},
            max_tokens=80,
            temperature=temperature,
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "set_mode"
        _args_fit(call.function.arguments, MODE)
    turn = svc.store.turn_by_response(resp.id)[0]
    assert "<tool_call>" in svc.engine.tokenizer.decode(turn.response_ids)
    # recorded for training: the model's own log-probs, not the grammar's (where a forced token has ~1)
    assert min(turn.response_logprobs) < -1.0


def test_tool_choice_required_streams_a_call_to_one_of_the_tools(tiny_service):
    _, url = tiny_service
    stream = _openai(url).chat.completions.create(
        model="policy", messages=ASK, tools=[UNIT, MODE], tool_choice="required", max_tokens=80, stream=True
    )
    names, arguments, finish = [], "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            if tc.function.name:
                names.append(tc.function.name)
            arguments += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(names) == 1
    _args_fit(arguments, {"set_unit": UNIT, "set_mode": MODE}[names[0]])


def test_a_streamed_call_alone_leaves_content_null_as_the_whole_reply_does(tiny_service):
    """The SDK's stream helper builds the message from the deltas: a reply that is only a call has
    content None, as the non-streamed reply (and OpenAI's stream) has."""
    _, url = tiny_service
    client = _openai(url)
    ask = {"model": "policy", "messages": ASK, "tools": [UNIT], "tool_choice": "required", "max_tokens": 80}
    whole = client.chat.completions.create(**ask).choices[0].message
    with client.chat.completions.stream(**ask) as stream:
        streamed = stream.get_final_completion().choices[0].message
    assert whole.tool_calls and streamed.tool_calls
    assert whole.content is None and streamed.content is None
    text = client.chat.completions.create(**{**ask, "tool_choice": "none", "max_tokens": 6}, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices)  # text still streams


def test_a_json_schema_reply_parses_into_the_clients_model(tiny_service):
    _, url = tiny_service
    client = _openai(url)
    parsed = client.chat.completions.parse(
        model="policy",
        messages=[{"role": "user", "content": "Pick my settings."}],
        response_format=Settings,
        max_tokens=60,
    )
    assert isinstance(parsed.choices[0].message.parsed, Settings)
    resp = client.responses.parse(
        model="policy", input="Pick my settings.", text_format=Settings, max_output_tokens=60
    )
    assert isinstance(resp.output_parsed, Settings) and resp.text.format.type == "json_schema"


def test_json_object_mode_starts_a_json_object(tiny_service):
    _, url = tiny_service
    resp = _openai(url).chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format={"type": "json_object"},
        max_tokens=12,
    )
    text = resp.choices[0].message.content
    assert text.startswith("{")
    if resp.choices[0].finish_reason == "stop":  # it closed the object: then the whole reply parses
        assert isinstance(json.loads(text), dict)


def test_a_prefilled_json_reply_is_continued_inside_its_schema(tiny_service):
    _, url = tiny_service
    body = {
        "messages": [
            {"role": "user", "content": "Pick my settings."},
            {"role": "assistant", "content": '{"theme": "light", '},
        ],
        "continue_final_message": True,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "settings", "schema": Settings.model_json_schema()},
        },
        "max_tokens": 40,
    }
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        rest = r.json()["choices"][0]["message"]["content"]
        assert Settings.model_validate_json('{"theme": "light", ' + rest).theme == "light"
        body["messages"][-1]["content"] = "Sure! "  # not the start of a JSON object
        bad = http.post("/v1/chat/completions", json=body)
        assert (
            bad.status_code == 400 and "does not fit the requested format" in bad.json()["error"]["message"]
        )


def test_anthropic_tool_choice_any_and_tool_get_a_tool_use_block(tiny_service):
    from anthropic import Anthropic

    _, url = tiny_service
    client = Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60)
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (UNIT, MODE)
    ]
    for choice, expect in (
        ({"type": "any"}, {"set_unit", "set_mode"}),
        ({"type": "tool", "name": "set_unit"}, {"set_unit"}),
    ):
        msg = client.messages.create(
            model="policy", max_tokens=80, messages=ASK, tools=tools, tool_choice=choice
        )
        assert msg.stop_reason == "tool_use"
        (block,) = [b for b in msg.content if b.type == "tool_use"]
        assert block.name in expect and block.id.startswith("toolu_"), block.id  # Anthropic's spelling
        _args_fit(json.dumps(block.input), {"set_unit": UNIT, "set_mode": MODE}[block.name])
    # the call sent back with its result continues the session: its result is the turn's next state
    svc, _ = tiny_service
    raw = client.messages.with_raw_response.create(
        model="policy",
        max_tokens=4,
        tools=tools,
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump()]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "saved"}],
            },
        ],
    )
    session = raw.headers["x-session-id"]
    first = svc.store.session_turns(session)[0]
    assert first.next_state is not None and first.next_state.content == "saved"


def test_anthropic_structured_output_parses_into_the_clients_model(tiny_service):
    from anthropic import Anthropic

    _, url = tiny_service
    client = Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60)
    msg = client.messages.parse(
        model="policy",
        max_tokens=60,
        messages=[{"role": "user", "content": "Pick my settings."}],
        output_format=Settings,
    )
    assert isinstance(msg.parsed_output, Settings)
    # the structured-outputs beta's top-level `output_format`, as LiteLLM sends it: held to the schema too
    raw = client.messages.create(
        model="policy",
        max_tokens=60,
        messages=[{"role": "user", "content": "Pick my settings."}],
        extra_body={"output_format": {"type": "json_schema", "schema": Settings.model_json_schema()}},
    )
    assert raw.stop_reason == "end_turn"
    Settings.model_validate_json(raw.content[0].text)


def test_a_forced_call_in_the_responses_api_is_a_function_call_item(tiny_service):
    _, url = tiny_service
    tool = {"type": "function", "name": "set_mode", "parameters": MODE["function"]["parameters"]}
    resp = _openai(url).responses.create(
        model="policy", input="Dark mode please.", tools=[tool], tool_choice="required", max_output_tokens=80
    )
    (item,) = [o for o in resp.output if o.type == "function_call"]
    assert item.name == "set_mode" and json.loads(item.arguments)["mode"] in ("dark", "light")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tool_choice": "always", "tools": [UNIT]}, "tool_choice: expected one of auto, none, required"),
        ({"tool_choice": {"type": "function"}, "tools": [UNIT]}, "tool_choice: a named tool choice is"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [UNIT]},
            "function 'nope' is not one of the request's tools",
        ),
        ({"tool_choice": "required"}, "forcing a tool call needs 'tools'"),
        ({"response_format": {"type": "json_schema"}}, "needs a 'json_schema' object"),
        (  # "schema" misspelt: not JSON of any shape, silently
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "scheme": {"type": "object"}},
                }
            },
            "needs a 'json_schema' object with a 'schema'",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "wat"}},
                }
            },
            "response_format.json_schema.schema: this JSON schema cannot be enforced",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"enum": ["x" * 200] * 600}},
                }
            },
            "at most 100,000 are accepted",
        ),
        ({"modalities": ["text", "audio"]}, "['audio'] output is not supported"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio output is not supported"),
        ({"logit_bias": {"abc": 1}}, "logit_bias key 'abc' must be a token id"),
        ({"logit_bias": {"5": 300}}, "must be between -100 and 100"),
        ({"logit_bias": {"99999999": 1}}, "outside this model's vocabulary"),
    ],
)
def test_a_malformed_format_or_choice_is_a_400_naming_it(client, extra, words):
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}).status_code == 200


def test_the_other_protocols_name_their_own_fields_and_refuse_forcing_without_tools(client):
    """Responses and Messages are served through chat completions; their errors still name the
    fields their callers sent, and forcing a call with no tools is a 400 there too."""
    for route, body, param in (
        ("/v1/responses", {"input": "hi", "tool_choice": "required"}, "tool_choice"),
        (
            "/v1/messages",
            {"model": "m", "messages": ASK, "max_tokens": 4, "tool_choice": {"type": "any"}},
            "tool_choice",
        ),
        (
            "/v1/messages",
            {"model": "m", "messages": ASK, "max_tokens": 4, "tool_choice": {"type": "tool", "name": "x"}},
            "tool_choice",
        ),
    ):
        r = client.post(route, json=body)
        assert r.status_code == 400, (route, r.text)
        said = r.json()["error"]
        assert "tool_choice" in said["message"] and said.get("param", param) == param
    bad_format = {"type": "json_schema", "name": "x", "schema": {"type": "wat"}}
    r = client.post("/v1/responses", json={"input": "hi", "text": {"format": bad_format}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "text.format.schema" and err["message"].startswith("text.format.schema: ")
    assert "response_format" not in err["message"]
    no_schema = {"type": "json_schema", "name": "x"}
    r = client.post("/v1/responses", json={"input": "hi", "text": {"format": no_schema}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "text.format.schema", err
    assert err["message"].startswith("text.format.schema: a format of type 'json_schema' needs"), err

    def messages_error(**extra: object) -> str:
        r = client.post("/v1/messages", json={"model": "m", "messages": ASK, "max_tokens": 4, **extra})
        assert r.status_code == 400, r.text
        return r.json()["error"]["message"]

    wat = {"format": {"type": "json_schema", "schema": {"type": "wat"}}}
    assert messages_error(output_config=wat).startswith("output_config.format.schema: ")
    # a tool's schema, named as each protocol names it (not as the chat route it is served through)
    not_object = {"type": "string"}
    said = messages_error(tools=[{"name": "f", "input_schema": not_object}])
    assert said.startswith("tools[0].input_schema: "), said
    r = client.post(
        "/v1/responses",
        json={"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": not_object}]},
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith("tools[0].parameters: "), err
    assert err["param"] == "tools[0].parameters"


def test_a_forced_call_that_cannot_be_enforced_names_the_function(client):
    tools = [
        {"type": "function", "function": {"name": "fine", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {
                "name": "odd",
                "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
            },
        },
    ]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": ASK, "max_tokens": 4, "tools": tools, "tool_choice": "required"},
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "tools[1].function.parameters", err
    assert "the parameters of 'odd' cannot be enforced" in err["message"], err


def test_a_strict_tool_with_a_keyword_the_grammar_passes_over_is_refused_a_lax_one_served(client):
    """strict: true promises arguments that match: a keyword the grammar cannot hold them to is a
    400; without it the call is held to the rest (an agent's toolbox often has such a tool)."""
    params = {
        "type": "object",
        "properties": {"n": {"type": "integer", "not": {"const": 3}}},
        "required": ["n"],
    }

    def forced(**strict: bool) -> httpx.Response:
        fn = {"name": "pick", "parameters": params, **strict}
        tools = [{"type": "function", "function": fn}]
        body = {"messages": ASK, "max_tokens": 30, "tools": tools, "tool_choice": "required"}
        return client.post("/v1/chat/completions", json=body)

    r = forced(strict=True)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("tools[0].function.parameters.properties.n.not: ")
    assert forced().status_code == 200
    # an Anthropic tool's strict is the same promise, named as that protocol names the field
    tool = {"name": "pick", "input_schema": params, "strict": True}
    body = {"model": "m", "messages": ASK, "max_tokens": 30, "tools": [tool], "tool_choice": {"type": "any"}}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "tools[0].input_schema.properties.n.not" in r.text, r.text


UNENFORCED = {
    "type": "object",
    "properties": {"v": {"allOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 6}]}},
    "required": ["v"],
}


@pytest.mark.parametrize(
    "schema, where",
    [
        (UNENFORCED, "response_format.json_schema.schema.properties.v.allOf"),
        (
            {"type": "object", "properties": {"v": {"type": "string", "not": {"const": "a"}}}},
            "response_format.json_schema.schema.properties.v.not",
        ),
        (
            {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
            "response_format.json_schema.schema.uniqueItems",
        ),
    ],
)
def test_a_strict_schema_keyword_the_grammar_would_pass_over_is_a_400_naming_its_place(client, schema, where):
    """The grammar compiler ignores these keywords: a reply held to the rest was served as valid
    while breaking them ({"v": "text"} for an allOf of integers), under strict: true."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "response_format": fmt})
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith(where + ": "), err
    assert err["param"] == "response_format.json_schema.schema"
    # without strict: true, the reply is held to the rest of the schema (OpenAI's best effort too)
    del fmt["json_schema"]["strict"]
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, "response_format": fmt})
    assert r.status_code == 200, r.text


class Theme(BaseModel):
    name: Literal["dark", "light"]


class Profile(BaseModel):
    """pydantic wraps a described reference in an allOf of one schema, as the SDKs send it."""

    theme: Theme
    compact: bool


def test_a_described_reference_in_an_allof_of_one_is_enforced(tiny_service):
    schema = Profile.model_json_schema()
    schema["properties"]["theme"] = {"allOf": [{"$ref": "#/$defs/Theme"}], "description": "the look"}
    _, url = tiny_service
    fmt = {"type": "json_schema", "json_schema": {"name": "profile", "schema": schema, "strict": True}}
    for seed in range(3):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"messages": ASK, "max_tokens": 40, "response_format": fmt, "seed": seed},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        Profile.model_validate_json(r.json()["choices"][0]["message"]["content"])


def test_tools_beside_a_format_let_the_model_call_or_answer_in_the_format(tiny_service):
    """An agent with tools and a structured final answer sends both on every turn: with tool_choice
    auto the reply is a call or the format (it could only be the format); forced, a call."""
    _, url = tiny_service
    oa = _openai(url)
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "settings", "schema": Settings.model_json_schema(), "strict": True},
    }
    for seed in range(6):
        reply = oa.chat.completions.create(
            model="policy", messages=ASK, tools=[UNIT], response_format=fmt, max_tokens=60, seed=seed
        ).choices[0]
        if reply.message.tool_calls:
            _args_fit(reply.message.tool_calls[0].function.arguments, UNIT)
        else:
            Settings.model_validate_json(reply.message.content or "")
    forced = oa.chat.completions.create(
        model="policy", messages=ASK, tools=[UNIT], tool_choice="required", response_format=fmt, max_tokens=60
    ).choices[0]
    assert forced.message.tool_calls, forced
    _args_fit(forced.message.tool_calls[0].function.arguments, UNIT)


def test_a_forced_call_cut_short_leaves_no_markup_in_the_reply(tiny_service):
    """A forced call that ``max_tokens`` cuts before it closes ends with ``length``; the service's
    call markup it had begun is not handed to the client as text, on any route, streamed or not."""
    from anthropic import Anthropic

    _, url = tiny_service
    oa = _openai(url)
    chat = oa.chat.completions.create(
        model="policy", messages=ASK, tools=[UNIT], tool_choice="required", max_tokens=3
    )
    assert chat.choices[0].finish_reason == "length"
    assert "<tool" not in (chat.choices[0].message.content or "")
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in oa.chat.completions.create(
            model="policy", messages=ASK, tools=[UNIT], tool_choice="required", max_tokens=3, stream=True
        )
        if c.choices
    )
    assert "<tool" not in streamed
    msg = Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60).messages.create(
        model="policy",
        max_tokens=3,
        messages=ASK,
        tools=[{"name": "set_unit", "input_schema": UNIT["function"]["parameters"]}],
        tool_choice={"type": "tool", "name": "set_unit"},
    )
    assert msg.stop_reason == "max_tokens" and all("<tool" not in getattr(b, "text", "") for b in msg.content)
    tool = {"type": "function", "name": "set_unit", "parameters": UNIT["function"]["parameters"]}
    resp = oa.responses.create(
        model="policy", input="Celsius please.", tools=[tool], tool_choice="required", max_output_tokens=3
    )
    assert resp.status == "incomplete" and "<tool" not in resp.output_text
    assert all(o.status == "incomplete" for o in resp.output if o.type == "message")


def test_openais_older_functions_form_is_served_and_answered_in_that_form(tiny_service):
    """``functions`` / ``function_call`` (deprecated by OpenAI, still served by it): the forced call
    comes back as ``message.function_call``, streamed too, and a history in that form continues."""
    svc, url = tiny_service
    client = _openai(url)
    legacy = [UNIT["function"], MODE["function"]]
    resp = client.chat.completions.create(
        model="policy", messages=ASK, functions=legacy, function_call={"name": "set_mode"}, max_tokens=80
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    assert choice.message.function_call.name == "set_mode"
    _args_fit(choice.message.function_call.arguments, MODE)
    stream = client.chat.completions.create(
        model="policy",
        messages=ASK,
        functions=legacy,
        function_call={"name": "set_unit"},
        max_tokens=80,
        stream=True,
    )
    calls, finish = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.function_call:
            calls.append(chunk.choices[0].delta.function_call)
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert finish == "function_call" and [c.name for c in calls] == ["set_unit"]
    _args_fit(calls[0].arguments, UNIT)
    history = [
        *ASK,
        {"role": "assistant", "content": None, "function_call": choice.message.function_call.model_dump()},
        {"role": "function", "name": "set_mode", "content": '{"ok": true}'},
    ]
    follow = client.chat.completions.create(
        model="policy", messages=history, functions=legacy, function_call="none", max_tokens=4
    )
    assert follow.choices[0].finish_reason in ("stop", "length")
    turn = svc.store.turn_by_response(follow.id)[0]
    assert turn.turn_index == 1  # the same conversation: the older form's call continued it
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        mixed = {"messages": ASK, "functions": legacy, "tools": [UNIT], "max_tokens": 4}
        r = c.post("/v1/chat/completions", json=mixed)
        assert r.status_code == 400 and "cannot be mixed" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, "stream_options": {}})
        assert r.status_code == 400 and "stream_options" in r.json()["error"]["message"]


class City(BaseModel):
    name: Literal["Paris", "Oslo"]


class Trip(BaseModel):
    """A tool's parameters as pydantic writes a nested model: a $ref into its own $defs."""

    to: City
    nights: Literal[1, 2]


def test_a_tool_whose_parameters_refer_to_their_own_defs_is_called_with_them(tiny_service):
    """The call's schema nests each tool's parameters; their #/$defs/... refs must still resolve
    (the Agents SDK's pydantic tools beside an output_type were all refused)."""
    _, url = tiny_service
    oa = _openai(url)
    trip = {"type": "function", "function": {"name": "book", "parameters": Trip.model_json_schema()}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": Settings.model_json_schema()}}
    for extra in ({"tool_choice": "required"}, {"response_format": fmt}):
        reply = oa.chat.completions.create(
            model="policy", messages=ASK, tools=[trip, UNIT], max_tokens=60, seed=4, **extra
        ).choices[0]
        assert reply.message.tool_calls or "tool_choice" not in extra, reply
        for call in reply.message.tool_calls or []:
            if call.function.name == "book":
                Trip.model_validate_json(call.function.arguments)
        if not reply.message.tool_calls:
            Settings.model_validate_json(reply.message.content or "")
