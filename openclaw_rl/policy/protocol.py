"""The wire format of the policy service: OpenAI chat-completions requests, responses and errors.

Requests are validated here, once, with pydantic in strict JSON mode so that a wrong type (a string
where a number belongs) is an error that names the field instead of being silently coerced. Unknown
top-level fields are ignored (OpenAI clients send many optional knobs we do not act on); unknown
fields inside a message are ignored too, but an unknown *role* is an error.

Session keys (``session_id``, ``turn_type``, ``session_done``) may come in the body as well as in the
``X-Session-Id`` / ``X-Turn-Type`` / ``X-Session-Done`` headers. ``return_token_ids`` is our
extension, modelled on vLLM's: the response then carries ``prompt_token_ids`` and per-choice
``token_ids`` — what a forwarding instance of this service needs to record exact ids.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from openclaw_rl.config import USER_NAME

Role = Literal["system", "developer", "user", "assistant", "tool", "environment"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool", "environment")
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
ModelT = TypeVar("ModelT", bound=BaseModel)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


#: Request bodies of the other protocols (Responses, Messages) share the chat request's leniency:
#: unknown top-level fields are ignored, known ones are strictly typed.
LenientModel = _Lenient


class TextPart(_Lenient):
    type: str
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> TextPart:
        if self.type == "refusal" and self.refusal is not None:
            # an assistant's refusal replayed as a part (OpenAI's history form): its words are its text
            self.type, self.text = "text", self.refusal
        if self.type != "text" or self.text is None:
            raise ValueError(f"content part of type {self.type!r} is not supported; only text parts are")
        return self


class FunctionCall(_Lenient):
    name: str
    arguments: str = "{}"


class ToolCall(_Lenient):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


def legacy_call_id(name: object) -> str:
    """The id a call of OpenAI's older ``functions`` form is given here (that form has no ids)."""
    return f"call_{name}"


class ChatMessage(_Lenient):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # an assistant's refusal, as OpenAI returns it (``content`` then null)

    @model_validator(mode="before")
    @classmethod
    def _legacy_function_messages(cls, data: Any) -> Any:
        """OpenAI's older function calling, read as tool calling: an assistant ``function_call`` is
        a tool call, a ``function`` message (named by ``name``) that call's result."""
        if not isinstance(data, dict):
            return data
        if data.get("role") == "function":
            data = {
                **data,
                "role": "tool",
                "tool_call_id": data.get("tool_call_id") or legacy_call_id(data.get("name")),
            }
        call = data.get("function_call")
        if data.get("role") == "assistant" and isinstance(call, dict) and not data.get("tool_calls"):
            data = {
                **data,
                "tool_calls": [
                    {"id": legacy_call_id(call.get("name")), "type": "function", "function": call}
                ],
            }
        return data

    @field_validator("role")
    @classmethod
    def _known_role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"unknown role {v!r}; expected one of {', '.join(ROLES)}")
        return v

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and self.role == "assistant" and self.refusal is not None:
            # a history replayed as the SDK returned it: the refusal is what the assistant said
            self.content = self.refusal
        if self.content is None and self.role == "assistant" and not self.tool_calls:
            raise ValueError("an assistant message needs content, tool_calls or a refusal")
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if isinstance(self.content, list) and not self.content:
            # as OpenAI's API: an empty list of parts is a client bug, not an empty message
            raise ValueError("content is an empty list of parts; give a string or at least one text part")
        return self

    @property
    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class FunctionDef(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    #: OpenAI's structured-outputs promise: a forced call's arguments match ``parameters`` exactly,
    #: so a keyword the grammar cannot hold them to is refused (docs/serving.md)
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not TOOL_NAME.match(v):
            raise ValueError(f"tool name {v!r} must be 1-64 characters of a-z, A-Z, 0-9, _ or -")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError(f"parameters must be a JSON schema of type 'object', got type {v.get('type')!r}")
        if v is not None and "properties" in v and not isinstance(v["properties"], dict):
            raise ValueError("parameters.properties must be an object")
        return v


class ToolDef(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Lenient):
    include_usage: bool = False


class JsonSchemaSpec(_Lenient):
    """``response_format.json_schema``: the schema the reply must match (always enforced, as
    OpenAI's ``strict = true`` is; the schema itself is checked when the engine compiles it)."""

    name: str = Field("response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """OpenAI's ``response_format``: ``text`` (free), ``json_object`` (any JSON object) or
    ``json_schema`` (JSON matching a schema). The embedded engine enforces JSON token by token
    (docs/serving.md, "Structured output and forced tool calls"); forwarding engines pass it on."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            # a misspelt "schema" would otherwise be JSON of any shape, silently
            raise ValueError(
                "response_format of type 'json_schema' needs a 'json_schema' object with a 'schema'"
            )
        return self

    @property
    def constrains(self) -> bool:
        return self.type != "text"


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


#: ``tool_choice``: let the model decide, forbid calls, force a call, or force one named function.
ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice
TOOL_CHOICES = ("auto", "none", "required")


class ChatCompletionRequest(_Lenient):
    """``POST /v1/chat/completions`` body. Limits that depend on the config are checked in serving."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, ge=0, le=1)  # 0, as OpenAI allows: only the likeliest token
    # vLLM's and Anthropic's: draw only among the k likeliest tokens (0 or -1: all)
    top_k: int = Field(0, ge=-1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1)
    # OpenAI's repetition penalties, on the tokens this reply has generated so far
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what a 64-bit generator seed can hold
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Any = None  # a ToolChoice once validated (one readable error, not one per union branch)
    response_format: ResponseFormat | None = None
    # token id (as a string, the model's own vocabulary) -> bias added to its logit, -100..100
    logit_bias: dict[str, float] | None = None
    # session keys, also accepted as headers
    session_id: str | None = Field(None, min_length=1, max_length=256)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None
    # extension: return the prompt and sampled token ids
    return_token_ids: bool = False
    # OpenAI's end-user identifier: names the user when the caller is a trusted gateway (docs/users.md)
    user: str | None = Field(None, min_length=1, max_length=128)
    # vLLM's: the last (assistant) message is the start of the reply, which the model continues
    continue_final_message: bool = False
    # false: at most one tool call per reply (the first the model wrote); null, as some proxies send
    # it, is the default
    parallel_tool_calls: bool | None = None
    # OpenAI's older function calling, served as tools / tool_choice (see _legacy_functions); a
    # request that used it gets its call back as ``message.function_call``
    functions: list[FunctionDef] | None = None
    function_call: Any = None
    # output kinds: only text is produced here, so asking for audio is an error, not silently dropped
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_functions(cls, data: Any) -> Any:
        """``functions`` / ``function_call`` become ``tools`` / ``tool_choice`` (never both forms)."""
        if not isinstance(data, dict) or (
            data.get("functions") is None and data.get("function_call") is None
        ):
            return data
        if data.get("tools") is not None or data.get("tool_choice") is not None:
            raise ValueError(
                "functions / function_call (OpenAI's older form) and tools / tool_choice cannot be mixed"
            )
        out = dict(data)  # the functions become tools once validated (_functions_as_tools)
        choice = data.get("function_call")
        if isinstance(choice, dict) and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif choice in ("auto", "none"):
            out["tool_choice"] = choice
        elif choice is not None:
            raise ValueError(f'function_call: expected "auto", "none" or {{"name": ...}}, got {choice!r}')
        return out

    @model_validator(mode="after")
    def _functions_as_tools(self) -> ChatCompletionRequest:
        # before _checks (validators run in the order they are defined), which reads the tools
        if self.functions is not None:
            self.tools = [ToolDef(type="function", function=f) for f in self.functions]
        return self

    @property
    def legacy_functions(self) -> bool:
        """Whether the request used ``functions``: its reply names the call ``function_call``."""
        return self.functions is not None

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, v: list[str] | None) -> list[str] | None:
        other = sorted(set(v or []) - {"text"})
        if other:
            raise ValueError(f"this model produces text only; {other} output is not supported")
        return v

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            raise ValueError("this model produces text only; audio output is not supported")
        return v

    @field_validator("n")
    @classmethod
    def _single(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"n = {v} is not supported; this service returns one choice per request (n = 1)")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty strings")
        return stops

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> ToolChoice | None:
        if v is None or v in TOOL_CHOICES:
            return v
        if isinstance(v, dict):
            if v.get("type") == "function" and isinstance((v.get("function") or {}).get("name"), str):
                return NamedToolChoice.model_validate(v)
            raise ValueError(
                'a named tool choice is {"type": "function", "function": {"name": "<a tool\'s name>"}}'
            )
        raise ValueError(f"expected one of {', '.join(TOOL_CHOICES)} or a named function, got {v!r}")

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not (key.isascii() and key.isdigit()):  # "²".isdigit() is True, and int("²") fails
                raise ValueError(f"logit_bias key {key!r} must be a token id (a non-negative integer)")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias[{key}] = {bias} must be between -100 and 100")
        return v

    @model_validator(mode="after")
    def _tool_results_answer_calls(self) -> ChatCompletionRequest:
        """As OpenAI and Anthropic: each tool result answers a call of the assistant message before
        the run of results it is in. A result for no call (a stale id, a cut history) would be
        trained on as that turn's next state; the client is told its history is broken instead."""
        calls: set[str] | None = None  # ids of the assistant message the current tool results follow
        for i, m in enumerate(self.messages):
            if m.role == "tool":
                if calls is None:
                    raise ValueError(
                        f"messages[{i}]: a tool result must follow an assistant message that made tool "
                        "calls (its tool_calls / tool_use blocks)"
                    )
                if m.tool_call_id is not None and m.tool_call_id not in calls:
                    raise ValueError(
                        f"messages[{i}]: tool result for call id {m.tool_call_id!r}, which the assistant "
                        f"message before it did not make (its calls: {sorted(calls)})"
                    )
            elif m.role == "assistant" and m.tool_calls:
                calls = {c.id for c in m.tool_calls}
            else:
                calls = None
        return self

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs = true")
        if self.stream_options is not None and not self.stream:  # as OpenAI: a client bug, said so
            raise ValueError("stream_options: only allowed when stream = true")
        if self.tools is not None:
            names = [t.function.name for t in self.tools]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"tools: duplicate function name(s) {dupes}")
        choice = self.tool_choice
        if self.forces_tool_call and not self.tools:
            raise ValueError("tool_choice: forcing a tool call needs 'tools'")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name for t in self.tools or []
        }:
            raise ValueError(
                f"tool_choice: function {choice.function.name!r} is not one of the request's tools"
            )
        if self.continue_final_message:
            last = self.messages[-1]
            if last.role != "assistant" or last.tool_calls:
                raise ValueError(
                    "continue_final_message: the last message must be an assistant message with text "
                    f"(the start of the reply to continue), not a {last.role} message"
                    + (" with tool calls" if last.tool_calls else "")
                )
        return self

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def shows_call_markup(self) -> bool:
        """The prompt holds call markup (the tools block, or earlier calls rendered back), which
        the model may write again even when no call is wanted."""
        return bool(self.tools) or any(m.tool_calls for m in self.messages)

    @property
    def forces_tool_call(self) -> bool:
        """``tool_choice`` is ``required`` or names a function: the reply must be a tool call."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def token_biases(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}


class LoadWeightsRequest(BaseModel):
    """``POST /v1/admin/load_weights``: a directory written by the trainer's ``export_policy``."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    version: int = Field(ge=0)
    user: str | None = Field(None, min_length=1, max_length=128, description="per_user: that user's adapter")


class CloseSessionRequest(BaseModel):
    """``POST /v1/admin/close_session``: end a session whose client went away without closing it."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1, max_length=256)


class FeedbackRequest(BaseModel):
    """``POST /v1/feedback``: the user's own verdict on one response (docs/users.md)."""

    model_config = ConfigDict(extra="forbid")
    response_id: str = Field(min_length=1, max_length=128, description="the completion's `id`")
    rating: Literal[1, -1]
    comment: str | None = Field(None, max_length=8000)
    user: str | None = Field(None, min_length=1, max_length=128)

    @field_validator("rating", mode="before")
    @classmethod
    def _not_a_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # JSON true equals 1 to Python; a rating is a number
            raise ValueError("rating must be the number 1 or -1, not a boolean")
        return v


class ForgetUserRequest(BaseModel):
    """``POST /v1/admin/forget_user``: drop a deleted user's adapter from the running service."""

    model_config = ConfigDict(extra="forbid")
    user: str = Field(pattern=USER_NAME.pattern)  # what `users add` takes: no path, no control character


class PauseRequest(BaseModel):
    """``POST /v1/admin/pause``: hold (``true``) or release (``false``) new requests (lock-step runs)."""

    model_config = ConfigDict(extra="forbid")
    paused: bool


# --------------------------------------------------------------------------- errors
class APIError(Exception):
    """An error the service answers with an OpenAI-style JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def renamed(self, fields: dict[str, str]) -> APIError:
        """This error in the words of a protocol served through chat completions (Responses,
        Messages): ``param`` and the field path the message starts with, by ``fields`` (chat name ->
        that protocol's; a key ending in "." also renames the paths below it)."""

        def rename(path: str) -> str:
            for chat, theirs in fields.items():
                # "[*]" stands for any list index, kept in the new name ("tools[2].function.parameters")
                pattern = re.escape(chat.rstrip(".")).replace(re.escape("[*]"), r"(\[\d+\])")
                m = re.match(pattern + (r"(?=\.|$)" if chat.endswith(".") else "$"), path)
                if m:
                    new = theirs.rstrip(".")
                    for index in m.groups():
                        new = new.replace("[*]", index, 1)
                    return new + path[m.end() :]
            return path

        message = self.message
        head, sep, rest = message.partition(": ")
        if sep and " " not in head:
            message = f"{rename(head)}: {rest}"
        out = type(self).__new__(type(self))  # keeps a subclass and what it carries (the counts of
        out.__dict__.update(self.__dict__)  # ContextLengthExceeded), without calling its __init__
        Exception.__init__(out, message)
        out.message, out.param = message, rename(self.param) if self.param else None
        return out


def fields_by_origin(origins: list[str], fields: dict[str, str]) -> dict[str, str]:
    """``fields`` (for :meth:`APIError.renamed`) with each chat message named by the request field it
    was translated from: ``origins[k]`` for ``messages[k]`` (a Responses ``input[3]``, a Messages
    ``messages[1].content[2]``), so an error found in the chat request names the caller's field."""
    return {**{f"messages[{k}].": f"{where}." for k, where in enumerate(origins)}, **fields}


class ContextLengthExceeded(APIError):
    """A prompt that leaves no room to generate, worded as OpenAI words it (clients match
    ``context_length_exceeded`` or "maximum context length" to decide to compact); the counts let the
    Messages route word it as Anthropic does ("prompt is too long")."""

    def __init__(self, limit: int, prompt_tokens: int, tool_tokens: int = 0):
        # with tools, how many tokens are theirs (as OpenAI says it): a client that shortens its
        # history after this error gets nowhere when the tools' definitions alone fill the window
        split = (
            f" ({prompt_tokens - tool_tokens} in the messages, {tool_tokens} in the functions)"
            if tool_tokens
            else ""
        )
        super().__init__(
            400,
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens{split}, which leaves no room to generate. Please reduce "
            f"the length of the messages{' or functions' if tool_tokens else ''}.",
            param="messages",
            code="context_length_exceeded",
        )
        self.limit = limit
        self.prompt_tokens = prompt_tokens


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """One readable line per problem, each naming where in the body it is (``messages[1].role``)."""
    found: list[tuple[str, str, bool]] = []  # (where, message, the text branch of a str | parts field)
    for err in exc.errors():
        if err["type"] == "json_invalid":
            why = str(err.get("ctx", {}).get("error", err["msg"]))
            if why.startswith("recursion limit exceeded"):  # valid JSON, nested past what is parsed
                return (
                    f"request body is nested too deeply (over 200 levels of arrays or objects): {why}",
                    None,
                )
            return f"request body is not valid JSON: {why}", None
        if not err["loc"] and err["type"] in ("model_type", "dict_type"):
            return f"the request body must be a JSON object, got {_json_kind(err.get('input'))}", None
        parts: list[str] = []
        for p in err["loc"]:
            # union branches show up as locations ('str', 'list[TextPart]'): not useful to a client
            if isinstance(p, int):
                parts.append(f"[{p}]")
            elif p == "str" or "[" in p or "(" in p:  # a type, not a field: "list[TextPart]"
                continue
            else:
                parts.append(("." if parts else "") + str(p))
        msg = err["msg"].removeprefix("Value error, ")
        loc = "".join(parts)
        named = _NAMED_FIELD.match(msg)
        # a check across fields names the one at fault ("tool_choice: ..."), a field's own check
        # may name a part of it ("text.format.schema: ..." for text)
        if named and (not loc or named.group(1).startswith((loc + ".", loc + "["))):
            loc, msg = named.group(1), msg[named.end() :]
        found.append((loc or "body", msg, "str" in err["loc"] and err["type"] == "string_type"))
    # "content: Input should be a valid string" says nothing when the parts branch said what is wrong
    kept = [
        (loc, msg)
        for loc, msg, text_branch in found
        if not (text_branch and any(o != loc and o.startswith(loc) for o, _, _ in found))
    ]
    lines: list[str] = []
    for loc, msg in kept:
        line = f"{loc}: {msg}"
        if line not in lines:
            lines.append(line)
    return "; ".join(lines), kept[0][0] if kept else None


_NAMED_FIELD = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*|\[\d*\])*): ")


def parse_body(model: type[ModelT], raw: bytes) -> ModelT:
    """A request body validated strictly as ``model``; :class:`APIError` 400 naming the field."""
    try:
        return model.model_validate_json(raw or b"{}", strict=True)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's own words (``null``, ``array``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
