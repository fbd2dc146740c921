"""Pure-function parts of the policy service: tools, session stitching, validation, log escaping."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest
from pydantic import ValidationError

from openclaw_rl.policy.protocol import ChatCompletionRequest, ChatMessage, ToolDef, validation_message
from openclaw_rl.policy.serving import escape_for_log
from openclaw_rl.policy.sessions import SessionManager, canonical, digest, next_state_of, prefix_digests
from openclaw_rl.policy.tools import parse_tool_calls
from openclaw_rl.runtime.chat_format import template_messages
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import NextState, Turn

WEATHER = ToolDef.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
)


def test_tool_calls_round_trip_through_the_prompt():
    text = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    content, calls = parse_tool_calls(text, [WEATHER])
    assert content == "Let me check."
    assert calls is not None and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    # the call echoed back by a client renders into the same markup the model produced
    echoed = ChatMessage.model_validate(
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls}
    )
    rendered = template_messages(
        [
            {"role": "user", "content": "hi"},
            echoed.model_dump(exclude_none=True),
            {"role": "tool", "content": "18C", "tool_call_id": calls[0]["id"]},
        ],
        [WEATHER.model_dump(exclude_none=True)],
    )
    assert rendered[0]["role"] == "system" and '"get_weather"' in rendered[0]["content"]
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        in rendered[2]["content"]
    )
    assert rendered[3] == {"role": "tool", "content": "18C"}


def test_malformed_or_undeclared_tool_calls_stay_content():
    for text in (
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "<tool_call>{not json}</tool_call>",
        "plain answer",
    ):
        assert parse_tool_calls(text, [WEATHER]) == (text, None)
    assert parse_tool_calls('<tool_call>{"name": "get_weather"}</tool_call>', None)[1] is None


def _msgs(*pairs: tuple[str, str]) -> list[ChatMessage]:
    return [ChatMessage(role=r, content=c) for r, c in pairs]


def _record(
    sm: SessionManager, session_id: str, messages: list[ChatMessage], reply: str, index: int = 0
) -> None:
    """What serving does after a main turn: store the turn with its prefix digest, keep the digest."""
    key = SessionManager.prefix_key(messages, reply, None)
    sm.store.record_turn(
        Turn(
            session_id=session_id,
            turn_index=index,
            messages=[],
            prompt_ids=[1],
            response_ids=[2],
            response_logprobs=[-0.1],
        ),
        prefix_digest=key,
    )
    sm.remember_key(key, session_id)


def test_prefix_keys_of_a_long_conversation_are_those_of_each_prefix_alone(tmp_path):
    """One pass hashes every candidate prefix of a request (a 20,000-message body hashed prefix by
    prefix held the event loop for a minute): each key equals the one a prefix alone gets, so
    conversations remembered before still continue."""
    items = [
        canonical(role, text, calls)
        for role, text, calls in [
            ("system", "be brief", None),
            ("user", '会话 "quoted"', None),
            (
                "assistant",
                "",
                [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            ),
            ("tool", "a\nb", None),
            ("assistant", "done", None),
        ]
    ]
    for user in ("default", "ann"):
        ends = [5, 4, 3, 2, 1, 0]
        assert prefix_digests(items, ends, user) == [digest(items[:end], user) for end in ends]
        stored = hashlib.sha256(
            (json.dumps(user) if user != "default" else "").encode()
            + json.dumps(items[:3], ensure_ascii=False).encode()
        )
        assert digest(items[:3], user) == stored.hexdigest()  # the key format the store already holds


def test_prefix_stitching(tmp_path):
    sm = SessionManager(Store(tmp_path / "s.sqlite"))
    first = _msgs(("system", "be brief"), ("user", "2+2?"))
    a = sm.assign(first, None, None, False)
    assert (a.turn_index, a.next_state, a.stitched) == (0, None, False)
    _record(sm, a.session_id, first, "4")
    # the client echoes the reply with different whitespace; the next state is the new user message
    second = first + _msgs(("assistant", "4 "), ("user", "and 3+3?"))
    b = sm.assign(second, None, None, False)
    assert (b.session_id, b.turn_index, b.stitched) == (a.session_id, 1, True)
    assert b.next_state is not None and (b.next_state.role, b.next_state.content) == ("user", "and 3+3?")
    # an edited history is a different conversation
    other = _msgs(("system", "be brief"), ("user", "2+5?"), ("assistant", "4"), ("user", "and 3+3?"))
    assert sm.assign(other, None, None, False).session_id != a.session_id


@pytest.mark.parametrize("restart", [False, True])
def test_a_regenerated_last_message_branches_instead_of_answering_a_later_turn(tmp_path, restart):
    """A -> B continued the conversation; then the client sends A's conversation with a different
    last message (regenerate / edit). It must not become turn 2 of the session, its message the
    next state of B, which it never answered."""
    store = Store(tmp_path / "s.sqlite")
    sm = SessionManager(store)
    first = _msgs(("user", "tell me a joke"))
    a = sm.assign(first, None, None, False)
    _record(sm, a.session_id, first, "joke A")
    second = first + _msgs(("assistant", "joke A"), ("user", "another one please"))
    b = sm.assign(second, None, None, False)
    assert (b.session_id, b.turn_index) == (a.session_id, 1)
    _record(sm, b.session_id, second, "joke B", index=1)
    if restart:
        store.close()
        sm = SessionManager(Store(tmp_path / "s.sqlite"))  # the newest turn is read back from the store
    edited = first + _msgs(("assistant", "joke A"), ("user", "EDITED: explain joke A"))
    c = sm.assign(edited, None, None, False)
    assert c.session_id != a.session_id and c.next_state is None and not c.stitched
    # the conversation that did go on still continues its session
    third = second + _msgs(("assistant", "joke B"), ("user", "ha, good one"))
    d = sm.assign(third, None, None, False)
    assert (d.session_id, d.turn_index, d.stitched) == (a.session_id, 2, True)


def test_after_a_restart_a_branch_goes_on_in_its_own_session_though_a_shorter_prefix_is_in_memory(
    tmp_path,
):
    """The longest remembered prefix wins wherever it is kept: one in the store only (from before a
    restart) beats a shorter one the process has met since."""
    store = Store(tmp_path / "s.sqlite")
    sm = SessionManager(store)
    first = _msgs(("user", "q1"))
    a = sm.assign(first, None, None, False)
    _record(sm, a.session_id, first, "A1")
    second = first + _msgs(("assistant", "A1"), ("user", "q2"))
    _record(sm, sm.assign(second, None, None, False).session_id, second, "A2", index=1)
    edited = first + _msgs(("assistant", "A1"), ("user", "q2 edited"))
    branch = sm.assign(edited, None, None, False)
    assert branch.session_id != a.session_id
    _record(sm, branch.session_id, edited, "B2")
    store.close()
    sm = SessionManager(Store(tmp_path / "s.sqlite"))
    sm.assign(
        first + _msgs(("assistant", "A1"), ("user", "q2 other")), None, None, False
    )  # [q1, A1] in memory
    on = sm.assign(edited + _msgs(("assistant", "B2"), ("user", "thanks")), None, None, False)
    assert (on.session_id, on.turn_index, on.stitched) == (branch.session_id, 1, True)


def test_a_history_re_sent_with_an_old_tool_result_shortened_still_continues(tmp_path):
    """OpenClaw re-sends older tool results shortened: the request goes on past an older turn of the
    session with assistant messages of its own, so it is that conversation, not a branch."""
    sm = SessionManager(Store(tmp_path / "s.sqlite"))
    first = _msgs(("user", "read the file"))
    a = sm.assign(first, None, None, False)
    _record(sm, a.session_id, first, "")  # the reply is a tool call; recorded by its text here
    second = first + _msgs(("assistant", ""), ("tool", "x" * 5000))
    b = sm.assign(second, None, None, False)
    _record(sm, b.session_id, second, "It holds x.", index=1)
    shortened = first + _msgs(("assistant", ""), ("tool", "[tool output shortened]"))
    third = shortened + _msgs(("assistant", "It holds x."), ("user", "thanks"))
    c = sm.assign(third, None, None, False)
    assert (c.session_id, c.turn_index, c.stitched) == (a.session_id, 2, True)
    assert c.next_state is not None and c.next_state.content == "thanks"


def test_next_state_joins_parallel_tool_results():
    msgs = [
        ChatMessage(role="user", content="go"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
        ),
        ChatMessage(role="tool", content="one"),
        ChatMessage(role="tool", content="two"),
    ]
    state = next_state_of(msgs)
    assert state is not None and state.role == "tool" and state.content == "one\ntwo"
    assert next_state_of(_msgs(("user", "x"), ("assistant", "y"))) is None
    # a user who wrote twice before the next reply (a retry after a failed request) said both
    twice = next_state_of(
        _msgs(("user", "q"), ("assistant", "a"), ("user", "Are you there?"), ("user", "Back again."))
    )
    assert twice == NextState(role="user", content="Are you there?\nBack again.")
    # the same message sent again after a failed request (OpenClaw keeps the unanswered one) is one
    resent = next_state_of(
        _msgs(("user", "q"), ("assistant", "a"), ("user", "Is Paris bigger?"), ("user", "Is Paris bigger? "))
    )
    assert resent == NextState(role="user", content="Is Paris bigger?")
    # a client's decorations come off each message, not only the first
    from openclaw_rl.policy.client_rules import clean_user_text

    stamped = _msgs(
        ("user", "q"),
        ("assistant", "a"),
        ("user", "[Wed 2026-12-02 22:08 UTC] are you there?"),
        ("user", "[Wed 2026-12-02 22:09 UTC] back again"),
    )
    cleaned = next_state_of(stamped, lambda text: clean_user_text(text, ["openclaw"]))
    assert cleaned == NextState(role="user", content="are you there?\nback again")
    after_tools = _msgs(("user", "q"), ("assistant", "a"), ("tool", "out"), ("user", "that's wrong"))
    assert next_state_of(after_tools) == NextState(role="user", content="that's wrong")


@pytest.mark.parametrize(
    "body, where",
    [
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
        (
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
            "top_logprobs: requires logprobs",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            },
            "type 'object'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "only text parts",
        ),
    ],
)
def test_validation_messages_say_where(body, where):
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)
    assert where in validation_message(err.value)[0]


def test_a_replayed_refusal_is_what_the_assistant_said():
    """The SDK returns a refusal as ``content: null`` + ``refusal``; an app replaying its history sends
    it back so, and it must not be a 400."""
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "user", "content": "ok"},
    ]
    req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": history}), strict=True)
    assert req.messages[1].text == "I can't help with that."
    with pytest.raises(ValidationError) as err:  # nothing at all is still a client bug
        ChatCompletionRequest.model_validate_json(
            json.dumps({"messages": [history[0], {"role": "assistant", "content": None}]}), strict=True
        )
    assert "an assistant message needs content, tool_calls or a refusal" in validation_message(err.value)[0]


def test_log_escaping_cannot_forge_lines():
    forged = "hi\r\n[policy_service] session=admin turn=0\x1b[2J\u2028end"
    out = escape_for_log(forged)
    assert "\n" not in out and "\r" not in out and "\x1b" not in out and "\u2028" not in out
    assert "\\n" in out and "\\u001b" in out
    # a field cannot be forged either: a session id with spaces, a quote ending last_user early
    from openclaw_rl.policy.serving import quoted_for_log

    session, said = quoted_for_log("zz turn=77 type=FORGED"), quoted_for_log('hi" finish=FORGED')
    line = f"session={session} last_user={said}"
    assert line == 'session="zz turn=77 type=FORGED" last_user="hi\\" finish=FORGED"'
    assert shlex.split(line) == ["session=zz turn=77 type=FORGED", 'last_user=hi" finish=FORGED']


def test_prefix_stitching_survives_a_restart(tmp_path):
    """A headerless conversation continues its session after the service (and its memory) restarts."""
    first = _msgs(("system", "be brief"), ("user", "2+2?"))
    store = Store(tmp_path / "s.sqlite")
    before = SessionManager(store)
    a = before.assign(first, None, None, False)
    _record(before, a.session_id, first, "4")
    store.close()
    after = SessionManager(Store(tmp_path / "s.sqlite"))  # a new process: empty memory
    b = after.assign(first + _msgs(("assistant", "4"), ("user", "and 3+3?")), None, None, False)
    assert (b.session_id, b.turn_index, b.stitched) == (a.session_id, 1, True)
    # pruning keeps the newest digests only
    for i in range(3):
        _record(after, f"s{i}", _msgs(("user", f"q{i}")), f"a{i}")
    assert after.store.prune_prefixes(keep=2) == 2
    assert set(
        after.store.sessions_for_prefixes(
            [SessionManager.prefix_key(_msgs(("user", f"q{i}")), f"a{i}", None) for i in range(3)]
        ).values()
    ) == {"s1", "s2"}


def test_a_token_that_holds_part_of_a_character_shows_its_own_bytes(tiny_model_dir):
    """An emoji is three tokens of byte-level BPE; each decodes to U+FFFD alone. Their log-prob
    entries carry their real bytes (OpenAI's ``bytes:\\x..`` form), which join into the emoji."""
    from openclaw_rl.policy.engine import piece_bytes, token_piece
    from openclaw_rl.runtime.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    text = "🐱 café, ok"
    pieces = [token_piece(tok, i) for i in tok.encode(text)]
    assert any(p.startswith("bytes:") for p in pieces) and "\ufffd" not in "".join(pieces)
    assert bytes(b for p in pieces for b in piece_bytes(p)).decode("utf-8") == text
    assert piece_bytes(" ok") == list(b" ok")
