"""Adding up the pieces of streamed tool calls, as vLLM and the policy service send them."""

from __future__ import annotations

from openclaw_rl.runtime.chat_stream import add_tool_call_deltas, tool_calls_in_order


def test_tool_call_pieces_add_up_per_index_in_index_order():
    calls: dict = {}
    chunks = [
        [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "look", "arguments": ""}}],
        [{"index": 0, "id": "call_a", "function": {"name": "get_", "arguments": '{"ci'}}],
        [{"index": 0, "function": {"name": "weather", "arguments": 'ty": "Oslo"}'}}],
        None,  # a content-only chunk
        [{"index": 1, "function": {"arguments": "{}"}}],
    ]
    for deltas in chunks:
        add_tool_call_deltas(calls, deltas)
    assert tool_calls_in_order(calls) == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "look", "arguments": "{}"}},
    ]
    assert tool_calls_in_order({}) is None


def test_an_error_body_is_read_whatever_its_shape():
    from openclaw_rl.runtime.chat_stream import ErrorReply, read_error

    said = '{"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}'
    assert read_error(said) == ErrorReply("too long", "context_length_exceeded")
    assert read_error('{"error": "plain words"}') == ErrorReply("plain words")
    assert read_error("<html>bad gateway</html>") == ErrorReply("<html>bad gateway</html>")
    assert read_error('{"error": {"code": 7}}') == ErrorReply(
        '{"error": {"code": 7}}'
    )  # no message: the body
