"""HTTP routes of the policy service, bearer-key auth, and OpenAI-shaped errors for everything.

Two keys, two kinds of route:

* the model routes (``/v1/chat/completions``, ``/v1/feedback``, ``/v1/models``) require
  ``Authorization: Bearer <key>`` when ``[policy_service] api_key`` is set — the key a user gives
  their clients — or a user's own key (``openclaw-rl users add``), which also says who is talking
  (:mod:`openclaw_rl.policy.identity`);
* the admin routes (weight swaps, pause, closing sessions, and the SGLang / vLLM aliases) are
  never open: they take the run's admin secret (``<log_dir>/admin.key``, made by the launcher for
  each run and read by its own loops), whatever ``api_key`` is. An unauthenticated weight-update
  route is a known hole in peer servers. Weights load only from the run's export folder
  (``<log_dir>/policy``); a path elsewhere is refused without saying what is there.

Keys are compared with :func:`hmac.compare_digest`, so the comparison time does not reveal how
much of a guess was right.

Routes::

    POST /v1/chat/completions        OpenAI chat completions (JSON or SSE)
    POST /v1/responses               OpenAI Responses API (JSON or typed SSE events), see responses_api.py
    GET  /v1/responses/{id}          a stored response, as its client saw it
    GET  /v1/responses/{id}/input_items  the conversation it read, as items (limit, order, after)
    DELETE /v1/responses/{id}        forget a stored response (it can no longer be read or continued)
    POST /v1/messages                Anthropic Messages API (JSON or SSE; x-api-key too), see messages_api.py
    POST /v1/messages/count_tokens   Anthropic's token count of a Messages request's prompt
    POST /v1/feedback                {"response_id": ID, "rating": 1|-1, "comment": TEXT}: rate a response
    GET  /v1/models                  the served model and its policy_version
    GET  /v1/models/{id}             that model's card (404 for a model not served)
    GET  /healthz                    liveness + policy_version (no auth)
    POST /v1/admin/load_weights      {"path": DIR, "version": N[, "user": NAME]}: swap weights (the
                                     trainer's route); with "user", only that user's adapter
    POST /v1/admin/pause             {"paused": true|false}: hold new requests (lock-step runs)
    POST /v1/admin/close_session     {"session_id": ID}: end a session its client abandoned
    POST /v1/admin/forget_user       {"user": NAME}: drop a deleted user's adapter from memory
    POST /update_weights_from_disk   SGLang-compatible alias: {"model_path": DIR}
    POST /v1/load_lora_adapter       vLLM-compatible alias: {"lora_name": NAME, "lora_path": DIR}
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from openclaw_rl.config import ENV_VAR
from openclaw_rl.config import is_loopback as config_is_loopback
from openclaw_rl.policy.identity import Caller, browser_problem, is_loopback
from openclaw_rl.policy.messages_api import (
    CHAT_TO_MESSAGES,
    CountTokensRequest,
    MessagesCall,
    conversation_body,
    error_body,
)
from openclaw_rl.policy.protocol import (
    APIError,
    CloseSessionRequest,
    FeedbackRequest,
    ForgetUserRequest,
    LoadWeightsRequest,
    PauseRequest,
    fields_by_origin,
    parse_body,
)
from openclaw_rl.policy.responses_api import (
    ResponsesCall,
    delete_response,
    input_items,
    retrieve_response,
)
from openclaw_rl.policy.serving import Job, Serving, escape_for_log
from openclaw_rl.policy.weights import WeightLoadError
from openclaw_rl.runtime.users import KEY_PREFIX, UserError, check_user_name, key_matches, split_key

log = logging.getLogger("openclaw_rl.policy")


def _utf8(value: str) -> str:
    """A header value as its sender wrote it: HTTP carries header bytes, which the server reads as
    Latin-1, while clients send UTF-8 (``curl -H 'X-Session-Id: 会话二'``)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value  # not UTF-8 bytes: keep what came


# what session_headers percent-encodes: bytes of non-ASCII characters, and "%" itself
_ENCODED_RUN = re.compile(r"(?:%(?:[89A-Fa-f][0-9A-Fa-f]|25))+")


def _session_header(value: str) -> str:
    """An ``X-Session-Id`` as a client sends it: raw UTF-8, or as :func:`session_headers` wrote it in
    an answer (so that header can be sent back as it is). Only what that encoding writes is decoded
    (escapes of non-ASCII bytes, and ``%25``): a client's own ``a%20b`` stays ``a%20b``."""
    if "%" not in value:
        return value
    try:
        return _ENCODED_RUN.sub(lambda m: unquote(m.group(0), errors="strict"), value)
    except UnicodeDecodeError:  # escapes that spell no UTF-8: an id of the client's own
        return value


def _headers(request: Request) -> dict[str, str]:
    """A request's headers under lower-case names, as the serving layer reads them."""
    out = {k.lower(): _utf8(v) for k, v in request.headers.items()}
    if "x-session-id" in out:
        out["x-session-id"] = _session_header(out["x-session-id"])
    return out


# printable ASCII but "%": what an answer's X-Session-Id carries as it is
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def session_headers(session_id: str, turn_index: int) -> dict[str, str]:
    """The ``X-Session-Id`` / ``X-Turn-Index`` headers of an answer. A header holds only Latin-1, so an
    id with other characters ("我的会话") comes back percent-encoded as UTF-8, and a ``%`` of the id as
    ``%25`` so that the two cannot read alike (the body's ``session_id`` has it as sent)."""
    sid = quote(session_id, safe=_HEADER_SAFE)
    return {"X-Session-Id": sid, "X-Turn-Index": str(turn_index)}


#: How often a JSON (non-streamed) answer checks that its client is still connected.
DISCONNECT_POLL_S = 0.25


async def _stream_while_connected(job: Job, events: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """Relay a streamed answer; when the client goes away (the server stops iterating this), stop its
    generation (a no-op once the reply is complete)."""
    try:
        async with contextlib.aclosing(events) as relayed:
            async for chunk in relayed:
                yield chunk
    finally:
        job.cancel()


async def _answer_while_connected(
    request: Request, job: Job, answer: Awaitable[dict[str, Any]], headers: dict[str, str]
) -> Response:
    """Wait for a JSON answer; stop its generation if the client hangs up first (timed out, closed)."""
    task = asyncio.ensure_future(answer)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                job.cancel()
                return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        return JSONResponse(task.result(), headers=headers)
    finally:
        task.cancel()  # a no-op once it is done


class _SglangLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: str = Field(min_length=1)
    version: int | None = Field(None, ge=0)


class _VllmLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


#: Bytes of request body per token of the window. Real text runs 2-6 bytes a token (JSON escapes
#: included); no prompt that fits the window comes near 64, so a larger body is refused before it is
#: read whole, parsed and tokenised (a 20 MB body kept the other clients waiting for seconds).
BODY_BYTES_PER_TOKEN = 64
BODY_SLACK_BYTES = 1 << 20  # tool schemas and other fields beyond the messages


def max_body_bytes(max_model_len: int) -> int:
    """The largest request body a service with a ``max_model_len`` window reads."""
    return max_model_len * BODY_BYTES_PER_TOKEN + BODY_SLACK_BYTES


#: A request body that stops arriving for this long is answered 408: a client that sends part of a
#: body and stalls (a dead network, or on purpose) would otherwise hold its place, and the server's
#: stop, for as long as it likes.
BODY_STALL_S = 30.0
#: ... and one that trickles in (a byte every few seconds) is answered 408 once it has taken this long
#: in all: the largest body the window allows arrives in seconds on any working link.
BODY_DEADLINE_S = 60.0


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed ``limit`` bytes (by its
    Content-Length, or while it streams in without one), or a 408 when it stops arriving for
    :data:`BODY_STALL_S` seconds or is not whole after :data:`BODY_DEADLINE_S`."""

    def too_large(size: str) -> APIError:
        return APIError(
            413,
            f"request body is {size} bytes; this service reads at most {limit} (its window is "
            f"{(limit - BODY_SLACK_BYTES) // BODY_BYTES_PER_TOKEN} tokens)",
            code="request_too_large",
        )

    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # read as JSON it would be "not valid JSON ... column 1"
        raise APIError(
            415,
            f"Content-Encoding {escape_for_log(encoding, 40)!r}: this service reads request bodies "
            "uncompressed; send the body without Content-Encoding",
            param="Content-Encoding",
            code="unsupported_content_encoding",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(declared)
    chunks, size = [], 0
    stream = request.stream()
    deadline = asyncio.get_running_loop().time() + BODY_DEADLINE_S
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(min(BODY_STALL_S, max(left, 0.0))):
                chunk = await anext(stream)
        except StopAsyncIteration:
            break
        except TimeoutError:
            said = (
                f"stopped arriving: nothing for {BODY_STALL_S:g} s after {size} bytes"
                if left > BODY_STALL_S
                else f"came too slowly: {size} bytes in {BODY_DEADLINE_S:g} s"
            )
            raise APIError(408, f"the request body {said}", code="request_timeout") from None
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


class RequestIds:
    """ASGI middleware: every answer carries a fresh id in ``x-request-id`` (what the openai SDK
    reads as ``_request_id``) and ``request-id`` (the anthropic SDK's), and a refused request's log
    line names it, so a client's report of a failure finds its line in the service's log."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                ids = [(b"x-request-id", rid.encode()), (b"request-id", rid.encode())]
                message["headers"] = [*message.get("headers", []), *ids]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _error(exc: APIError, request: Request) -> JSONResponse:
    """The error in the shape of the caller's protocol: Anthropic's on ``/v1/messages``, and on
    ``/v1/models`` to a request that names an ``anthropic-version`` (the Anthropic SDK's), else
    OpenAI's."""
    path = request.url.path
    # only where the protocol is not the route's own: an OpenAI route keeps OpenAI's shape (its
    # code / param) whatever headers a proxy forwards
    anthropic = path.startswith("/v1/messages") or (
        path.startswith("/v1/models") and "anthropic-version" in request.headers
    )
    body = error_body(exc) if anthropic else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


#: OpenAI routes a client may try that this service does not have: a 404 that says so, not "Not Found".
NOT_SERVED = {
    "/v1/embeddings": "embeddings",
    "/v1/completions": "the legacy text completions API",
    "/v1/audio/speech": "audio",
    "/v1/audio/transcriptions": "audio",
    "/v1/images/generations": "image generation",
    "/v1/moderations": "moderation",
}
SERVED_ROUTES = (
    "this service serves one chat policy at /v1/chat/completions, /v1/responses and /v1/messages "
    "(docs/serving.md)"
)


def _bearer(request: Request) -> str:
    """The client's key: ``Authorization: Bearer <key>`` (any whitespace after the scheme), a user key
    sent in ``Authorization`` without its scheme, or Anthropic's ``x-api-key`` header."""
    auth = request.headers.get("authorization", "").strip()
    scheme, _, given = auth.replace("\t", " ").partition(" ")
    if scheme.lower() == "bearer" or given.strip().lower().startswith(KEY_PREFIX):  # any scheme: a user key
        return given.strip()
    if auth.lower().startswith(KEY_PREFIX):
        return auth
    return request.headers.get("x-api-key", "").strip()


def _bearer_matches(request: Request, expected: bytes) -> bool:
    return hmac.compare_digest(_bearer(request).encode(), expected)


def build_app(serving: Serving, api_key: str | None, admin_key: str, weights_root: Path) -> FastAPI:
    """The FastAPI application around ``serving``.

    ``api_key`` None or empty leaves the model routes open; ``admin_key`` (never empty) guards the
    admin routes; ``weights_root`` is the only folder the weight routes load from.
    """
    expected = api_key.encode() if api_key else None
    if not admin_key:
        raise ValueError("admin_key must be a non-empty secret")
    admin = admin_key.encode()
    root = weights_root.resolve()
    body_limit = max_body_bytes(serving.pcfg.max_model_len)

    def refused(message: str) -> APIError:
        return APIError(
            401,
            message,
            type_="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def caller(request: Request) -> Caller:
        """Authenticate a model-route request and say what it may claim about its user."""
        given = _bearer(request)
        unexpanded = ENV_VAR.fullmatch(given)  # OpenClaw sends ${VAR} as is when VAR is unset
        if unexpanded:  # never a key: a client config's ${VAR} whose variable was not set
            raise refused(
                f"the client sent its key as {given!r}, unexpanded: the environment variable "
                f"{unexpanded.group(1)} is not set where the client runs; export it there"
            )
        parts = split_key(given) if given else None
        if parts is not None:  # shaped like a user key: it is one, or the request is refused
            found = serving.store.user_key(parts[0])
            if found is None or not key_matches(parts[1], found[1], found[2]):
                raise refused("unknown or revoked user key")
            return Caller(key_user=found[0], trusted=False)
        if given.lower().startswith(KEY_PREFIX) and not (
            expected is not None and hmac.compare_digest(given.encode(), expected)
        ):
            # a user key cut short or mistyped: serving it as the anonymous user would file that
            # user's words under someone else (and out of reach of `users export` / `delete`)
            raise refused(
                f"malformed user key: a user key is {KEY_PREFIX}<key id>-<secret>, as `users add` printed it"
            )
        if expected is not None:
            if not hmac.compare_digest(given.encode(), expected):
                raise refused(
                    "missing or wrong API key: send Authorization: Bearer <key>"
                    + (
                        " or x-api-key: <key>"
                        if request.url.path.startswith("/v1/messages")
                        or "anthropic-version" in request.headers
                        else ""
                    )
                )
            return Caller(key_user=None, trusted=True)
        problem = browser_problem(request.headers, config_is_loopback(serving.pcfg.host))
        if problem is not None:
            raise APIError(403, problem, type_="permission_error", code="browser_request_refused")
        return Caller(key_user=None, trusted=is_loopback(request.client.host if request.client else None))

    def require_admin(request: Request) -> None:
        if not _bearer_matches(request, admin):
            raise APIError(
                401,
                "admin route: missing or wrong admin key (the run's own loops send it; "
                "it is not the clients' api_key)",
                type_="authentication_error",
                code="invalid_admin_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def inside_export_folder(path: str) -> str:
        """The weight path, if it lies inside the run's export folder; 400 otherwise."""
        if "\0" in path:
            raise APIError(
                400, "path: holds a NUL byte, which no path can", param="path", code="path_not_allowed"
            )
        try:
            resolved = Path(path).expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop
            raise APIError(
                400,
                f"path: cannot be resolved ({exc.__class__.__name__})",
                param="path",
                code="path_not_allowed",
            ) from None
        if not resolved.is_relative_to(root):
            raise APIError(
                400,
                f"path: weights load only from the run's export folder {root}",
                param="path",
                code="path_not_allowed",
            )
        return str(resolved)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has closed the connections; generations whose client left are still recording
        left = await serving.drain()
        if left:
            log.info("[policy_service] drained %d in-flight generation(s)", left)

    app = FastAPI(
        title="openclaw-rl policy service", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(RequestIds)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        # messages may quote client input: escaped so a request cannot forge log lines
        log.info(
            "[policy_service] %d on %s (%s): %s",
            exc.status,
            request.url.path,
            getattr(request.state, "request_id", "-"),
            escape_for_log(exc.message, 300),
        )
        return _error(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(
            APIError(400, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())),
            request,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail)
        unserved = NOT_SERVED.get(request.url.path.rstrip("/")) if exc.status_code == 404 else None
        if unserved is not None:
            detail = f"{unserved} is not served here: {SERVED_ROUTES}"
        return _error(
            APIError(
                exc.status_code,
                f"{request.method} {request.url.path}: {detail}",
                code={404: "unknown_route", 405: "method_not_allowed"}.get(exc.status_code),
            ),
            request,
        )

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        # the client left while its body was arriving: nobody to answer, nothing to log at length
        log.info("client left before its request body arrived on %s", request.url.path)
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return _error(APIError(500, f"internal error: {type(exc).__name__}", type_="server_error"), request)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return await run_in_threadpool(serving.health)  # a forwarding engine is asked over HTTP

    @app.get("/v1/models", dependencies=[Depends(caller)])
    async def models() -> dict[str, Any]:
        return serving.models()

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(caller)])
    async def model(model_id: str) -> dict[str, Any]:
        return serving.model(model_id)

    @app.post("/v1/chat/completions")
    async def chat(request: Request, who: Caller = Depends(caller)):
        body = await read_body(request, body_limit)
        headers = _headers(request)
        job = await serving.start_job(body, headers, who)
        session = session_headers(job.assign.client_session_id, job.assign.turn_index)
        if job.req.stream:
            return StreamingResponse(
                _stream_while_connected(job, serving.stream(job)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **session},
            )
        return await _answer_while_connected(request, job, serving.complete(job), session)

    async def _other_protocol(request: Request, call: ResponsesCall | MessagesCall):
        """Start a Responses / Messages call on the chat path and answer in its protocol."""
        await call.start()
        session = session_headers(call.job.assign.client_session_id, call.job.assign.turn_index)
        if call.req.stream:
            return StreamingResponse(
                _stream_while_connected(call.job, call.stream()),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **session},
            )
        return await _answer_while_connected(request, call.job, call.complete(), session)

    @app.post("/v1/responses")
    async def responses(request: Request, who: Caller = Depends(caller)):
        headers = _headers(request)
        return await _other_protocol(
            request, ResponsesCall(serving, await read_body(request, body_limit), headers, who)
        )

    @app.get("/v1/responses/{response_id}")
    async def response(response_id: str, request: Request, who: Caller = Depends(caller)) -> dict[str, Any]:
        if request.query_params.get("stream", "").lower() == "true":
            raise APIError(400, "stream: a stored response is read whole, not streamed again", param="stream")
        headers = _headers(request)
        return await run_in_threadpool(retrieve_response, serving, response_id, who, headers)

    @app.get("/v1/responses/{response_id}/input_items")
    async def response_items(
        response_id: str, request: Request, who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        headers = _headers(request)
        query = dict(request.query_params)
        return await run_in_threadpool(input_items, serving, response_id, who, headers, query)

    @app.delete("/v1/responses/{response_id}")
    async def forget_response(
        response_id: str, request: Request, who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        headers = _headers(request)
        return await run_in_threadpool(delete_response, serving, response_id, who, headers)

    @app.post("/v1/messages")
    async def messages(request: Request, who: Caller = Depends(caller)):
        headers = _headers(request)
        return await _other_protocol(
            request, MessagesCall(serving, await read_body(request, body_limit), headers, who)
        )

    @app.post("/v1/messages/count_tokens", dependencies=[Depends(caller)])
    async def count_tokens(request: Request) -> dict[str, Any]:
        # Anthropic's token count: the prompt the model would read, tools included; nothing recorded
        req: CountTokensRequest = await _parse(request, CountTokensRequest)
        origins: list[str] = []
        body = json.dumps(conversation_body(req, origins)).encode()
        headers = _headers(request)
        try:
            return {"input_tokens": await run_in_threadpool(serving.count_tokens, body, headers)}
        except APIError as exc:  # checked as a chat request: named as the caller named the fields
            raise exc.renamed(fields_by_origin(origins, CHAT_TO_MESSAGES)) from None

    @app.post("/v1/feedback")
    async def feedback(request: Request, who: Caller = Depends(caller)) -> dict[str, Any]:
        req: FeedbackRequest = await _parse(request, FeedbackRequest)
        headers = _headers(request)
        return await run_in_threadpool(serving.feedback, req, headers, who)

    async def _parse(request: Request, model: type[BaseModel]) -> Any:
        return parse_body(model, await read_body(request, body_limit))

    async def _swap(path: str, version: int, user: str | None = None) -> dict[str, Any]:
        path = inside_export_folder(path)
        if user is not None:
            try:
                check_user_name(user)
            except UserError as exc:
                raise APIError(400, str(exc), param="user") from None
        try:
            await run_in_threadpool(serving.swap_weights, path, version, user)
        except WeightLoadError as exc:
            raise APIError(400, str(exc), param="path") from None
        except TimeoutError as exc:
            raise APIError(503, str(exc), type_="server_error") from None
        return {"ok": True, "policy_version": version, **({"user": user} if user else {})}

    @app.post("/v1/admin/load_weights", dependencies=[Depends(require_admin)])
    async def load_weights(request: Request) -> dict[str, Any]:
        req: LoadWeightsRequest = await _parse(request, LoadWeightsRequest)
        return await _swap(req.path, req.version, req.user)

    @app.post("/v1/admin/pause", dependencies=[Depends(require_admin)])
    async def pause(request: Request) -> dict[str, Any]:
        req: PauseRequest = await _parse(request, PauseRequest)
        return {"ok": True, "paused": serving.set_paused(req.paused)}

    @app.post("/v1/admin/close_session", dependencies=[Depends(require_admin)])
    async def close_session(request: Request) -> dict[str, Any]:
        req: CloseSessionRequest = await _parse(request, CloseSessionRequest)
        await run_in_threadpool(serving.store.close_session, req.session_id)
        return {"ok": True, "session_id": req.session_id}

    @app.post("/v1/admin/forget_user", dependencies=[Depends(require_admin)])
    async def forget_user(request: Request) -> dict[str, Any]:
        req: ForgetUserRequest = await _parse(request, ForgetUserRequest)
        stopped = serving.forget_user(req.user)
        await run_in_threadpool(serving.engine.forget_adapter, req.user)
        return {"ok": True, "user": req.user, "requests_stopped": stopped}

    @app.post("/update_weights_from_disk", dependencies=[Depends(require_admin)])
    async def sglang_update(request: Request) -> dict[str, Any]:
        req: _SglangLoad = await _parse(request, _SglangLoad)
        version = req.version if req.version is not None else serving.engine.policy_version + 1
        out = await _swap(req.model_path, version)
        return {"success": True, "message": json.dumps(out)}

    @app.post("/v1/load_lora_adapter", dependencies=[Depends(require_admin)])
    async def vllm_load_lora(request: Request):
        req: _VllmLoad = await _parse(request, _VllmLoad)
        await _swap(req.lora_path, serving.engine.policy_version + 1)
        return JSONResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

    return app
