"""``POST /v1/responses``: the OpenAI Responses API, served by the chat path.

The request is translated into a chat-completions request (``instructions`` → a system message,
``input`` items → messages, ``function_call`` / ``function_call_output`` items → assistant tool calls /
tool messages, function ``tools`` → chat tools, ``max_output_tokens`` → ``max_tokens``, ``user`` as is),
served and recorded exactly like a chat turn — same token ids, log-probs, sessions, next states and
client rules — and the result is rendered as a ``response`` object or as the typed SSE events the
official SDK parses (``response.created`` ... ``response.completed``). The turn is recorded under the
``resp_...`` id the client sees, so ``POST /v1/feedback`` can name it.

``previous_response_id``: with ``store`` true (the default) each response's whole conversation is
kept in the run's store; a request naming it continues that conversation and that session (no
headers, no prefix stitching needed). Only the user a response was served to may continue it (404
for anyone else, as for an unknown id). With ``store: false`` the turn is still recorded for
training, but the response cannot be continued.

A stored response can also be read back (``GET /v1/responses/{id}``, the object its client saw;
``GET /v1/responses/{id}/input_items``, the conversation it read, as items) and deleted
(``DELETE /v1/responses/{id}``: it can no longer be read or continued; the turn stays in the training
record, as every turn does until ``openclaw-rl users delete``). Its user may do so, and a trusted
gateway, which may act for any of its users anyway (a gateway request that names a user in the
``[users] header`` acts as that user alone); anyone else gets the 404 of an unknown id.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from openclaw_rl.policy.chat_events import chat_events, token_counts
from openclaw_rl.policy.protocol import APIError, LenientModel, fields_by_origin, parse_body
from openclaw_rl.policy.sessions import client_session_id
from openclaw_rl.types import DEFAULT_USER

if TYPE_CHECKING:
    from openclaw_rl.policy.identity import Caller
    from openclaw_rl.policy.serving import Job, Serving
    from openclaw_rl.runtime.store import StoredResponse


_KEPT_ONLY_BY_OPENAI = {
    "conversation": "conversations are not kept by this service; send the conversation in input, or "
    "continue a response with previous_response_id",
    "prompt": "stored prompt templates are not kept by this service; send instructions and input",
}


class ResponsesRequest(LenientModel):
    """The fields of ``POST /v1/responses`` this service acts on (others are accepted and ignored)."""

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    previous_response_id: str | None = Field(None, min_length=1, max_length=128)
    store: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, ge=0, le=1)  # 0 as on chat: only the likeliest token
    user: str | None = Field(None, min_length=1, max_length=128)
    parallel_tool_calls: bool = True
    #: "auto": a conversation that outgrows the window drops its oldest turns (after the
    #: instructions) until it fits, as OpenAI does; "disabled": it is a 400 context_length_exceeded
    truncation: Literal["auto", "disabled"] = "disabled"
    metadata: dict[str, Any] | None = None
    text: dict[str, Any] | None = None  # {"format": {...}}: text, json_object or json_schema
    include: list[str] | None = None  # "message.output_text.logprobs" shows the reply's log-probs
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # state kept elsewhere by OpenAI: refused, not ignored (the reply would silently lack it)
    conversation: Any = None
    prompt: Any = None

    @field_validator("conversation", "prompt")
    @classmethod
    def _kept_only_by_openai(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            raise ValueError(_KEPT_ONLY_BY_OPENAI[info.field_name or ""])
        return v

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])

    @field_validator("text")
    @classmethod
    def _text_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        fmt = (v or {}).get("format")
        if fmt is None:
            return v
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"text.format.type: must be text, json_object or json_schema, got {kind!r}")
        if kind == "json_schema" and not isinstance(fmt.get("schema"), dict):
            raise ValueError("text.format.schema: a format of type 'json_schema' needs a 'schema' object")
        return v

    @property
    def response_format(self) -> dict[str, Any] | None:
        """``text.format`` as the chat request's ``response_format`` (None: free text)."""
        fmt = (self.text or {}).get("format")
        if not fmt or fmt["type"] == "text":
            return None
        if fmt["type"] == "json_object":
            return {"type": "json_object"}
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(v or []):
            if tool.get("type") != "function":
                raise ValueError(
                    f"tools[{i}].type {tool.get('type')!r}: only function tools are supported here"
                )
            if not isinstance(tool.get("name"), str):
                raise ValueError(f"tools[{i}].name: a function tool needs a name")
        return v


def _text_of(content: Any, where: str) -> str:
    """The text of a message's ``content``: a string, or text parts (``input_text`` / ``output_text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: content must be a string or a list of parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise APIError(400, f"{where}[{j}].text: expected a string", param=f"{where}[{j}].text")
            out.append(text)
        else:
            raise APIError(
                400, f"{where}[{j}].type {kind!r}: only text parts are supported by this model", param=where
            )
    return "".join(out)


def to_messages(req: ResponsesRequest, origins: list[str] | None = None) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` as chat messages (see the module docstring). ``origins``, when
    given (empty), gets the request field each chat message came from (``input[3]``), so an error found in
    the chat request names the caller's field."""
    items: list[dict[str, Any]] = (
        [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    )
    messages: list[dict[str, Any]] = []
    came_from = origins if origins is not None else []  # one entry per message, in step with it
    for i, item in enumerate(items):
        where = "input" if isinstance(req.input, str) else f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where}: each input item must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(
                    400, f"{where}.role: {role!r} is not user, assistant, system or developer", param="input"
                )
            messages.append({"role": role, "content": _text_of(item.get("content", ""), f"{where}.content")})
        elif kind == "function_call":
            for field in ("name", "arguments"):  # both required strings, as OpenAI has them
                if not isinstance(item.get(field), str):
                    raise APIError(
                        400,
                        f"{where}.{field}: expected a string"
                        + (" (the arguments as JSON text)" if field == "arguments" else ""),
                        param=f"{where}.{field}",
                    )
            call = {
                "id": str(item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # text, then its calls: one chat message
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            continue  # this model does not reason in items; nothing to carry over
        else:
            raise APIError(400, f"{where}.type {kind!r} is not supported here", param="input")
        came_from += [where] * (len(messages) - len(came_from))
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
        came_from.insert(0, "instructions")
    return messages


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(
        404,
        f"{param}: no stored response {response_id[:128]!r}",
        type_="not_found_error",
        param=param,
        code="response_not_found",
    )


def _acts_for_all(serving: Serving, caller: Caller, headers: dict[str, str], named: str | None) -> bool:
    """A trusted gateway acts for all of its users, unless the request names the one it acts for
    (``named``: the body's ``user``; or the ``[users] header``)."""
    header = serving.cfg.users.header
    names_one = named is not None or (header is not None and header.lower() in headers)
    return caller.trusted and caller.key_user is None and not names_one


def stored_response(
    serving: Serving, response_id: str, caller: Caller, headers: dict[str, str]
) -> StoredResponse:
    """The stored response ``response_id`` if the caller may see it (module docstring), else 404."""
    chain = serving.store.chain(response_id)
    gateway = _acts_for_all(serving, caller, headers, None)
    if chain is None or not (gateway or chain.user == serving.user_of(caller, None, headers)):
        raise _not_found(response_id, "response_id")
    return chain


def retrieve_response(
    serving: Serving, response_id: str, caller: Caller, headers: dict[str, str]
) -> dict[str, Any]:
    """``GET /v1/responses/{id}``: the response object as its client saw it when it finished."""
    found = stored_response(serving, response_id, caller, headers)
    if found.response is None:  # kept by a version that stored only the conversation
        raise APIError(
            404,
            "response_id: this response was stored before responses could be read back; it can "
            "still be continued with previous_response_id",
            type_="not_found_error",
            param="response_id",
            code="response_not_found",
        )
    return found.response


def delete_response(
    serving: Serving, response_id: str, caller: Caller, headers: dict[str, str]
) -> dict[str, Any]:
    """``DELETE /v1/responses/{id}``: it can no longer be read or continued."""
    stored_response(serving, response_id, caller, headers)
    if not serving.store.delete_chain(response_id):
        raise _not_found(response_id, "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _call_item_id(call_id: str) -> str:
    """The ``function_call`` item id of a call: the same in the response and in its input items."""
    return f"fc_{call_id[-24:]}"


#: Key of a stored chain message: the id of its input item, given once, in the response it first
#: appeared in (a reply's is its output item's id), so every later response lists it under that id.
ITEM_ID = "item_id"


def _items_of(response_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses API items, oldest first, each under the id it was given when it
    first appeared (a chain stored before ids were kept: ids stable for this response)."""
    items: list[dict[str, Any]] = []

    def item_id(prefix: str) -> str:
        return str(m.get(ITEM_ID) or f"{prefix}_{response_id[5:25]}{len(items):04d}")

    for m in messages:
        role, text = m.get("role"), m.get("content") or ""
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "id": item_id("fco"),
                    "call_id": m.get("tool_call_id", ""),
                    "output": text,
                    "status": "completed",
                }
            )
            continue
        if role not in ("user", "assistant"):
            continue  # instructions are the response's own field, not an input item
        if text or role == "user":
            kind = "input_text" if role == "user" else "output_text"
            part: dict[str, Any] = {"type": kind, "text": text}
            if kind == "output_text":
                part["annotations"] = []
            items.append(
                {
                    "type": "message",
                    "id": item_id("msg"),
                    "role": role,
                    "status": "completed",
                    "content": [part],
                }
            )
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            items.append(
                {
                    "type": "function_call",
                    "id": _call_item_id(str(call.get("id", ""))),  # the id its response gave it
                    "call_id": call.get("id", ""),
                    "name": fn.get("name", ""),
                    "arguments": fn.get("arguments", ""),
                    "status": "completed",
                }
            )
    return items


def input_items(
    serving: Serving,
    response_id: str,
    caller: Caller,
    headers: dict[str, str],
    query: dict[str, str],
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items``: the conversation the response read (its reply left out),
    one page of it: ``limit`` (1-100, default 20), ``order`` (``desc``, the default, or ``asc``),
    ``after`` (the last item id of the page before)."""
    found = stored_response(serving, response_id, caller, headers)
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise APIError(
            400, f"limit: expected an integer from 1 to 100, got {query.get('limit')!r}", param="limit"
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, f"order: expected asc or desc, got {order!r}", param="order")
    items = _items_of(response_id, found.messages[:-1])  # the last message is the response's own reply
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [it["id"] for it in items]
        if after not in ids:
            raise APIError(400, f"after: {after[:64]!r} is no item of this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


#: chat-completions field -> the Responses field it came from (for errors, :meth:`APIError.renamed`)
CHAT_TO_RESPONSES = {
    "response_format.json_schema.": "text.format.",  # Responses has the schema's fields in format
    "response_format.": "text.format.",
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "tools[*].function.": "tools[*].",
}


def chat_body(req: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions request that serves ``req``."""
    body: dict[str, Any] = {
        "messages": [{k: v for k, v in m.items() if k != ITEM_ID} for m in messages],
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
    }
    if req.model:
        body["model"] = req.model
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.user is not None:
        body["user"] = req.user
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description"),
                    "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                    "strict": t.get("strict"),
                },
            }
            for t in req.tools
        ]
    if req.tool_choice is not None:  # forcing a call without tools is the chat check's 400
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if not req.parallel_tool_calls:
        body["parallel_tool_calls"] = False
    if req.response_format is not None:
        body["response_format"] = req.response_format
    if req.wants_logprobs:
        body["logprobs"], body["top_logprobs"] = True, req.top_logprobs or 0
    return body


class ResponsesCall:
    """One ``/v1/responses`` request: parse, continue its chain, start the chat job, render."""

    def __init__(self, serving: Serving, raw: bytes, headers: dict[str, str], caller: Caller):
        self.serving = serving
        self.req = parse_body(ResponsesRequest, raw)
        self.headers = dict(headers)
        self.caller = caller
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.messages: list[dict[str, Any]] = []

    @property
    def reply_item_id(self) -> str:
        """The id of the reply's message item, in this response and in every later one's input items."""
        return f"msg_{self.id[5:29]}"

    async def start(self) -> Job:
        req = self.req
        user = self.serving.user_of(self.caller, req.user, self.headers)
        origins: list[str] = []
        new = list(zip(to_messages(req, origins), origins, strict=True))
        previous = req.previous_response_id
        if previous is not None:
            chain = self.serving.store.chain(previous)
            gateway = _acts_for_all(self.serving, self.caller, self.headers, req.user)
            if chain is not None and gateway and chain.user != DEFAULT_USER:
                # as reading it back: a continuation that names no user goes on as the user whose
                # response it continues
                req = self.req = req.model_copy(update={"user": chain.user})
                user = chain.user
            if chain is None or chain.user != user:
                raise _not_found(previous, "previous_response_id")
            self.headers.setdefault("x-session-id", client_session_id(user, chain.session_id))
            # as OpenAI does: the previous response's instructions are not carried over, this one's apply
            kept = [(m, "previous_response_id") for m in chain.messages if m["role"] != "system"]
            system = [(m, o) for m, o in new if m["role"] == "system"]
            new = [*system, *kept, *[(m, o) for m, o in new if m["role"] != "system"]]
        if req.truncation == "auto":
            new = await self._fit(new)
        self.messages = [m for m, _ in new]
        body = json.dumps(chat_body(req, self.messages)).encode()
        try:
            self.job = await self.serving.start_job(body, self.headers, self.caller, response_id=self.id)
        except APIError as exc:  # checked as a chat request: named as the caller named the fields
            raise exc.renamed(fields_by_origin([o for _, o in new], CHAT_TO_RESPONSES)) from None
        return self.job

    async def _fit(self, new: list[tuple[dict[str, Any], str]]) -> list[tuple[dict[str, Any], str]]:
        """``truncation = "auto"``: drop the oldest whole turns (from one user message to the next, so
        a call and its result go together) after the instructions until the prompt fits the window;
        the newest turn always stays. Without a local tokenizer (a forwarding engine's model) nothing
        is dropped and the engine's own refusal is the answer."""
        limit = self.serving.pcfg.max_model_len
        while True:
            body = json.dumps(chat_body(self.req, [m for m, _ in new])).encode()
            try:
                n = await asyncio.to_thread(self.serving.count_tokens, body, self.headers)
            except APIError:  # no tokenizer here, or a body the chat check refuses: start_job says why
                return new
            first = next((i for i, (m, _) in enumerate(new) if m["role"] != "system"), len(new))
            nxt = next((i for i in range(first + 1, len(new)) if new[i][0]["role"] == "user"), None)
            if n < limit or nxt is None:
                return new
            del new[first:nxt]

    # ------------------------------------------------------------------ rendering
    def _output(
        self,
        text: str,
        calls: list[dict[str, Any]] | None,
        status: str,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """The output items; the message is ``incomplete`` when the reply was cut by the token limit."""
        out: list[dict[str, Any]] = []
        if text or not calls:
            out.append(self._message_item(text, status, logprobs))
        for c in calls or []:
            out.append(self._call_item(c, "completed"))
        return out

    def _message_item(
        self, text: str, status: str, logprobs: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.reply_item_id,
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]
            if text
            else [],
        }

    def _call_item(self, call: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
        fn = call["function"]
        return {
            "type": "function_call",
            "id": _call_item_id(call["id"]),
            "call_id": call["id"],
            "name": fn["name"],
            "arguments": fn.get("arguments", "") if arguments is None else arguments,
            "status": status,
        }

    def response(
        self, status: str, output: list[dict[str, Any]], finish: str | None = None
    ) -> dict[str, Any]:
        """The ``response`` object (``status`` in_progress / completed / incomplete / failed)."""
        req = self.req
        usage = None
        if status != "in_progress":
            prompt, generated = token_counts(self.job)
            usage = {
                "input_tokens": prompt,
                "input_tokens_details": {
                    "cached_tokens": self.job.final.cached_tokens if self.job.final is not None else 0,
                    "cache_write_tokens": 0,
                },
                "output_tokens": generated,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + generated,
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.serving.model_name,
            "output": output,
            "usage": usage,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "store": req.store,
            "user": req.user,
            "metadata": req.metadata or {},
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "top_logprobs": req.top_logprobs,
            "truncation": req.truncation,
            "policy_version": self.job.final.policy_version if self.job.final is not None else None,
            "session_id": self.job.assign.client_session_id,
            "turn_index": self.job.assign.turn_index,
        }

    def _keep(self, text: str, calls: list[dict[str, Any]] | None, response: dict[str, Any]) -> None:
        """Store the conversation so far for ``previous_response_id`` and the finished ``response``
        for ``GET /v1/responses/{id}`` (``store`` true only)."""
        if not self.req.store:
            return
        reply: dict[str, Any] = {"role": "assistant", "content": text, ITEM_ID: self.reply_item_id}
        if calls:
            reply["tool_calls"] = [{k: c[k] for k in ("id", "type", "function")} for c in calls]
        # messages new in this response get their input item ids now; earlier ones keep theirs
        kept = [
            m
            if ITEM_ID in m
            else {**m, ITEM_ID: f"{'fco' if m['role'] == 'tool' else 'msg'}_{self.id[5:25]}{i:04d}"}
            for i, m in enumerate(self.messages)
        ]
        self.serving.store.save_chain(
            self.id, self.job.assign.user, self.job.assign.session_id, [*kept, reply], response
        )

    async def complete(self) -> dict[str, Any]:
        done = await self.serving.complete(self.job)
        message = done["choices"][0]["message"]
        text, calls = message.get("content") or "", message.get("tool_calls")
        finish = done["choices"][0]["finish_reason"]
        status = "incomplete" if finish == "length" else "completed"
        logprobs = (done["choices"][0].get("logprobs") or {}).get("content")
        response = self.response(status, self._output(text, calls, status, logprobs), finish)
        self._keep(text, calls, response)
        return response

    async def stream(self) -> AsyncGenerator[str, None]:
        """The typed SSE events of a streamed response, ending with ``response.completed``."""
        seq = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            seq += 1
            payload = {"type": kind, "sequence_number": seq - 1, **fields}
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        yield event("response.created", response=self.response("in_progress", []))
        yield event("response.in_progress", response=self.response("in_progress", []))
        text, calls, finish = "", None, None
        logprobs: list[dict[str, Any]] = []
        item_id = self.reply_item_id
        opened = False
        async for ev in chat_events(self.serving, self.job):
            if ev.error is not None:
                failed = self.response("failed", [])
                failed["error"] = {"code": "server_error", "message": ev.error.get("message", "")}
                yield event("response.failed", response=failed)
                return
            if ev.text:
                if not opened:
                    opened = True
                    yield event(
                        "response.output_item.added",
                        output_index=0,
                        item=self._message_item("", "in_progress"),
                    )
                    yield event(
                        "response.content_part.added",
                        item_id=item_id,
                        output_index=0,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                    )
                text += ev.text
                logprobs += ev.logprobs
                yield event(
                    "response.output_text.delta",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    delta=ev.text,
                    logprobs=ev.logprobs,
                )
            if ev.tool_calls:
                calls = [{k: v for k, v in c.items() if k != "index"} for c in ev.tool_calls]
            if ev.finish:
                finish = ev.finish
        if opened or not calls:
            if not opened:
                yield event(
                    "response.output_item.added", output_index=0, item=self._message_item("", "in_progress")
                )
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
            if opened:
                yield event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=0,
                    content_index=0,
                    text=text,
                    logprobs=logprobs,
                )
                yield event(
                    "response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part
                )
            done = "incomplete" if finish == "length" else "completed"
            yield event(
                "response.output_item.done", output_index=0, item=self._message_item(text, done, logprobs)
            )
        first = 1 if (opened or not calls) else 0
        for k, call in enumerate(calls or []):
            index = first + k
            item = self._call_item(call, "in_progress", arguments="")
            yield event("response.output_item.added", output_index=index, item=item)
            args = call["function"].get("arguments", "")
            yield event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=args
            )
            yield event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=args,
            )
            yield event(
                "response.output_item.done", output_index=index, item=self._call_item(call, "completed")
            )
        status = "incomplete" if finish == "length" else "completed"
        response = self.response(status, self._output(text, calls, status, logprobs), finish)
        self._keep(text, calls, response)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        yield event(kind, response=response)
