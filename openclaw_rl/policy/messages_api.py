"""``POST /v1/messages``: the Anthropic Messages API, served by the chat path.

The request is translated into a chat-completions request — ``system`` → a system message, text
blocks → text, ``tool_use`` blocks → assistant tool calls, ``tool_result`` blocks → tool messages,
``tools`` (``input_schema``) → chat tools, ``tool_choice`` (auto / any / tool / none),
``stop_sequences`` → ``stop``, ``metadata.user_id`` → the OpenAI ``user`` field (when it can be a user
name; Claude Code's opaque ids are left out) — served and recorded
exactly like a chat turn, and rendered as a ``message`` object or as Anthropic's SSE events
(``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``). Keys come as ``x-api-key`` or ``Authorization: Bearer``; errors have Anthropic's
shape (:func:`error_body`). The turn is recorded under the ``msg_...`` id the client sees. A
conversation that ends with an assistant text message is a prefill: the reply continues that text
(chat's ``continue_final_message``) and the message returned holds only the continuation.

Clients of this protocol (the ``anthropic`` SDK, Claude Code, OpenClaw's ``anthropic-messages``
provider) send the whole conversation each time, so sessions are stitched by prefix as for chat.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from openclaw_rl.config import USER_NAME
from openclaw_rl.policy.chat_events import chat_events, token_counts
from openclaw_rl.policy.protocol import (
    MAX_STOP,
    APIError,
    ContextLengthExceeded,
    LenientModel,
    fields_by_origin,
    parse_body,
)

if TYPE_CHECKING:
    from openclaw_rl.policy.identity import Caller
    from openclaw_rl.policy.serving import Job, Serving

#: HTTP status -> Anthropic's error type.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_body(exc: APIError) -> dict[str, Any]:
    """An :class:`APIError` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    message = exc.message
    if isinstance(exc, ContextLengthExceeded):  # Anthropic's words, which its clients compact on
        message = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum"
    elif exc.code == "context_length_exceeded" and exc.param != "max_tokens":  # an engine's refusal
        message = f"prompt is too long: {message}"
    # any other client error (405, 409, 415, 422) is the request's fault, any other 5xx the server's
    kind = ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class ToolSpec(LenientModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # structured outputs: a forced call's input matches the schema exactly


class ToolChoice(LenientModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False  # true: at most one tool_use block


class MessageParam(LenientModel):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(LenientModel):
    """``POST /v1/messages/count_tokens``: the conversation part of a Messages request."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    """The fields of ``POST /v1/messages`` this service acts on (others are accepted and ignored)."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float = Field(1.0, ge=0, le=1)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    # structured output: {"format": {"type": "json_schema", "schema": {...}}} (``messages.parse``)
    output_config: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _top_level_output_format(cls, data: Any) -> Any:
        """The structured-outputs beta's form, ``output_format`` at the top level (LiteLLM sends it):
        the same format as ``output_config.format``, which wins when both are given."""
        if not isinstance(data, dict) or data.get("output_format") is None:
            return data
        config = data.get("output_config")
        if config is None or (isinstance(config, dict) and config.get("format") is None):
            return {**data, "output_config": {**(config or {}), "format": data["output_format"]}}
        return data

    @field_validator("output_config")
    @classmethod
    def _output_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        fmt = (v or {}).get("format")
        if fmt is None:
            return v
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
        ):
            raise ValueError('format must be {"type": "json_schema", "schema": {...}}')
        return v

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are supported here, got {len(v)}")
        if v is not None and any(s == "" for s in v):
            raise ValueError("stop sequences must not be empty")
        return v


def _blocks_text(blocks: Any, where: str) -> str:
    """The text of a list of text blocks (``system``, a ``tool_result``'s ``content``)."""
    if not isinstance(blocks, list):
        raise APIError(400, f"{where}: expected a string or a list of text blocks", param=where)
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict):
            raise APIError(400, f"{where}[{j}]: expected a content block (an object)", param=f"{where}[{j}]")
        if b.get("type") != "text":
            raise APIError(
                400, f"{where}[{j}].type {b.get('type')!r}: only text is supported here", param=where
            )
        out.append(_text(b, f"{where}[{j}]"))
    return "".join(out)


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise APIError(400, f"{where}.text: expected a string", param=f"{where}.text")
    return text


def to_messages(req: CountTokensRequest, origins: list[str] | None = None) -> list[dict[str, Any]]:
    """``system`` + ``messages`` as chat messages (see the module docstring). ``origins``, when
    given (empty), gets the request field each chat message came from (``messages[2].content[1]``), so an
    error found in the chat request names the caller's field."""
    out: list[dict[str, Any]] = []
    came_from = origins if origins is not None else []

    def add(msg: dict[str, Any], where: str) -> None:
        out.append(msg)
        came_from.append(where)

    if req.system:
        system = req.system if isinstance(req.system, str) else _blocks_text(req.system, "system")
        add({"role": "system", "content": system}, "system")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}].content"
        if not m.content and m.role == "user":
            # dropping it would silently turn the request into another one (an empty last user
            # message would make the reply a continuation of the assistant's). An empty assistant
            # message passes: this service can itself reply with no text, and clients send it back.
            raise APIError(400, f"{where} is empty; a user message needs content", param=where)
        if isinstance(m.content, str):
            add({"role": m.role, "content": m.content}, f"messages[{i}]")
            continue
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(m.content):
            kind = block.get("type")
            if kind == "text":
                text.append(_text(block, f"{where}[{j}]"))
            elif kind == "tool_use" and m.role == "assistant":
                args = block.get("input", {})
                if not isinstance(args, dict):
                    raise APIError(
                        400, f"{where}[{j}].input: expected an object", param=f"{where}[{j}].input"
                    )
                calls.append(
                    {
                        "id": str(block.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"),
                        "type": "function",
                        "function": {
                            "name": str(block.get("name", "")),
                            "arguments": json.dumps(args, ensure_ascii=False),
                        },
                    }
                )
            elif kind == "tool_result" and m.role == "user":
                content = block.get("content", "")
                result = (
                    content if isinstance(content, str) else _blocks_text(content, f"{where}[{j}].content")
                )
                if block.get("is_error"):
                    result = f"Error: {result}"
                add(
                    {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result},
                    f"{where}[{j}]",
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise APIError(
                    400,
                    f"{where}[{j}].type {kind!r} is not supported in a {m.role} message here",
                    param=where,
                )
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            add(msg, f"messages[{i}]")
        elif text:
            add({"role": "user", "content": "".join(text)}, f"messages[{i}]")
    return out


def chat_body(req: MessagesRequest, origins: list[str] | None = None) -> dict[str, Any]:
    """The chat-completions request that serves ``req``; ``origins``: as for :func:`to_messages`."""
    body = conversation_body(req, origins)
    body.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, stream=req.stream)
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    if req.top_k:
        body["top_k"] = req.top_k
    fmt = (req.output_config or {}).get("format")
    if fmt is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"]},
        }
    user = (req.metadata or {}).get("user_id")
    if isinstance(user, str) and USER_NAME.fullmatch(user) and not _PER_SESSION_ID.match(user):
        # Anthropic's user_id is opaque: Claude Code sends a JSON string or an id with the session in
        # it. Only a value that can be a user name names one, and a per-session id is none (each
        # session would be a user of its own); anything else is not an error, just no name.
        body["user"] = user
    return body


#: Claude Code's ``user_<device hash>_account_<uuid or nothing>_session_<uuid>``: it changes with
#: every session, and with an API key login (no account) it is short enough to pass for a name.
_PER_SESSION_ID = re.compile(r"^user_[0-9a-f]{64}_account_")


def conversation_body(req: CountTokensRequest, origins: list[str] | None = None) -> dict[str, Any]:
    """The chat-completions request's model, messages and tools for ``req`` (what its prompt is);
    ``origins``: as for :func:`to_messages`."""
    messages = to_messages(req, origins)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and not last.get("tool_calls") and last["content"]:
        body["continue_final_message"] = True  # Anthropic's prefill: the reply continues that text
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                    "strict": t.strict,
                },
            }
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:  # forcing a call without tools is the chat check's 400
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or {
            "type": "function",
            "function": {"name": choice.name},
        }
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    return body


#: chat-completions field -> the Messages field it came from (for errors, :meth:`APIError.renamed`)
CHAT_TO_MESSAGES = {
    "response_format.json_schema.schema.": "output_config.format.schema.",
    "response_format.": "output_config.format.",
    "stop": "stop_sequences",
    "tools[*].function.parameters.": "tools[*].input_schema.",
    "tools[*].function.": "tools[*].",
}


def _tool_block(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError:
        args = {"_raw": fn.get("arguments")}
    return {
        "type": "tool_use",
        # Anthropic's ids read toolu_...: the same call, in this protocol's spelling (sessions are
        # matched by the calls' names and arguments, not their ids)
        "id": "toolu_" + str(call["id"]).removeprefix("call_"),
        "name": fn["name"],
        "input": args if isinstance(args, dict) else {"value": args},
    }


def _usage_block(prompt: int, generated: int) -> dict[str, int]:
    """Anthropic's ``usage``: its cache counts are always numbers (clients add them up), 0 here: this
    service has no prompt caching a client controls."""
    return {
        "input_tokens": prompt,
        "output_tokens": generated,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class MessagesCall:
    """One ``/v1/messages`` request: parse, start the chat job, render."""

    def __init__(self, serving: Serving, raw: bytes, headers: dict[str, str], caller: Caller):
        self.serving = serving
        self.req = parse_body(MessagesRequest, raw)
        self.headers = headers
        self.caller = caller
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    async def start(self) -> Job:
        origins: list[str] = []
        body = json.dumps(chat_body(self.req, origins)).encode()
        try:
            self.job = await self.serving.start_job(body, self.headers, self.caller, response_id=self.id)
        except APIError as exc:  # checked as a chat request: named as the caller named the fields
            raise exc.renamed(fields_by_origin(origins, CHAT_TO_MESSAGES)) from None
        return self.job

    def _message(
        self, content: list[dict[str, Any]], stop: str | None, usage: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.req.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
            # extensions, as on every route (the X-Session-Id / X-Turn-Index headers carry them too)
            "session_id": self.job.assign.client_session_id,
            "turn_index": self.job.assign.turn_index,
        }

    def _stop(self, finish: str | None) -> tuple[str, str | None]:
        """Anthropic's ``stop_reason`` and ``stop_sequence`` for the chat path's finish reason."""
        final = self.job.final
        if finish == "stop" and final is not None and final.stop_string is not None:
            return "stop_sequence", final.stop_string
        return STOP_REASONS.get(finish or "stop", "end_turn"), None

    def _usage(self) -> dict[str, int]:
        prompt, generated = token_counts(self.job)
        return _usage_block(prompt, generated)

    async def complete(self) -> dict[str, Any]:
        done = await self.serving.complete(self.job)
        message = done["choices"][0]["message"]
        text, calls = message.get("content") or "", message.get("tool_calls") or []
        # No empty text block: Anthropic's API refuses one in a history a client sends back
        content = ([{"type": "text", "text": text}] if text else []) + [_tool_block(c) for c in calls]
        stop, sequence = self._stop(done["choices"][0]["finish_reason"])
        out = self._message(content, stop, self._usage())
        out["stop_sequence"] = sequence
        out["policy_version"] = done.get("policy_version")
        return out

    async def stream(self) -> AsyncGenerator[str, None]:
        """Anthropic's SSE events for a streamed message."""

        def event(kind: str, payload: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"

        prompt = len(self.job.gen.prompt_ids or [])
        yield event(
            "message_start",
            {"message": self._message([], None, _usage_block(prompt, 0))},
        )
        yield event("ping", {})
        index, opened, calls, finish = 0, False, [], None
        async for ev in chat_events(self.serving, self.job):
            if ev.error is not None:
                err = APIError(500, str(ev.error.get("message", "generation failed")), type_="server_error")
                yield event("error", {"error": error_body(err)["error"]})
                return
            if ev.text:
                if not opened:
                    opened = True
                    yield event(
                        "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
                    )
                yield event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": ev.text}}
                )
            if ev.tool_calls:
                calls = ev.tool_calls
            if ev.finish:
                finish = ev.finish
        if opened:
            yield event("content_block_stop", {"index": 0})
            index = 1
        for k, call in enumerate(calls):
            block = _tool_block(call)
            start = {**block, "input": {}}
            yield event("content_block_start", {"index": index + k, "content_block": start})
            partial = json.dumps(block["input"], ensure_ascii=False)
            yield event(
                "content_block_delta",
                {"index": index + k, "delta": {"type": "input_json_delta", "partial_json": partial}},
            )
            yield event("content_block_stop", {"index": index + k})
        stop, sequence = self._stop(finish)
        usage = self._usage()
        final = self.job.final
        yield event(
            "message_delta",
            {
                "delta": {"stop_reason": stop, "stop_sequence": sequence},
                "usage": usage,  # cumulative, as Anthropic's: clients that read usage here (LangChain) see the input too
                "policy_version": final.policy_version if final is not None else None,
            },
        )
        yield event("message_stop", {})
