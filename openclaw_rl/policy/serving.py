"""Chat completions: validation, admission, generation, the OpenAI response, and durable recording.

One request goes through, in order:

1. parse and validate the body (strict JSON, OpenAI-style 400 naming the field on any problem);
2. admission: at most ``max_concurrent`` generate, at most ``max_queue`` more wait; beyond that the
   answer is 429 with ``Retry-After`` at once (never a hang, never unbounded memory);
3. tokenise with the chat template and check the context length (400 if it cannot fit);
4. session assignment (explicit keys or prefix stitching, see ``sessions.py``);
5. generation runs in its own task; the response — JSON or SSE — only reads from that task. A
   client that goes away before the reply is complete (closes the stream, times out, hangs up)
   cancels it: the engine stops decoding for it, the reply nobody read is not recorded, and the
   next state its request carried still is;
6. recording: a main turn is written with ``store.record_turn`` together with the next state it
   carries for the previous main turn (one commit); a side turn is written with ``turn_type = "side"``
   and never judged; ``session_done`` closes the session after the turn is stored; the
   ``X-Episode-*`` headers of an environment's episode (group, group size, outcome) are kept on the
   session, validated before anything is recorded, and a simulated environment's ``X-Turn-Truth``
   goes with the next state it scores. A request that
   fails to generate still delivers its next state (``attach_next_state``) so that no signal is lost.

Logged user text is escaped (CR, LF and other control characters become ``\\n``-style escapes) so it
cannot forge log lines; keys never reach this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openclaw_rl.config import Config
from openclaw_rl.policy.client_rules import clean_user_text, housekeeping_reason
from openclaw_rl.policy.engine import Delta, Engine, Final, GenRequest, SamplingParams, piece_bytes
from openclaw_rl.policy.identity import Caller
from openclaw_rl.policy.protocol import (
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    FeedbackRequest,
    completion_id,
    now,
    validation_message,
)
from openclaw_rl.policy.sessions import Assignment, SessionManager, client_session_id, scoped_session_id
from openclaw_rl.policy.tools import (
    OPEN,
    call_markup_start,
    parse_tool_calls,
    without_call_markup,
    without_unfinished_call,
)
from openclaw_rl.runtime.loop_main import disk_full
from openclaw_rl.runtime.store import Store
from openclaw_rl.runtime.users import Feedback, adapter_meta, name_for_user_field
from openclaw_rl.types import DEFAULT_USER, EpisodeTag, Turn

#: A request that came through no HTTP route (the in-process API, tests): it may name its user.
IN_PROCESS = Caller(key_user=None, trusted=True)

log = logging.getLogger("openclaw_rl.policy")
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def escape_for_log(text: str, limit: int = 160) -> str:
    """User text made safe for one log line: control characters (CR, LF, ESC, U+2028 ...) escaped."""
    out = []
    for ch in text[:limit]:
        if ch.isprintable():
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "".join(out) + ("..." if len(text) > limit else "")


def quoted_for_log(text: str, limit: int = 160) -> str:
    """A client's text as one quoted field of a log line: :func:`escape_for_log`, in double quotes,
    with its own quotes and backslashes escaped, so no field of the line can be forged
    (``session=zz turn=77`` sent as a session id, a ``"`` ending ``last_user`` early)."""
    return '"' + escape_for_log(text.replace("\\", "\\\\").replace('"', '\\"'), limit) + '"'


def _bool_header(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise APIError(
        400, f"header {name}: expected true or false, got {escape_for_log(value, 40)!r}", param=name
    )


def _refuse_control_characters(value: str, what: str, param: str) -> None:
    """A 400 for an id with a control character in it: a line break or NUL cannot go back in an
    answer's header, and an escape sequence would reach the operator's terminal (``openclaw-rl
    turns``, the logs)."""
    if not all(c.isprintable() or c == " " for c in value):
        raise APIError(
            400, f"{what} must not hold control characters (line breaks, tabs, NUL, escapes)", param=param
        )


def _episode_headers(headers: dict[str, str]) -> EpisodeTag | None:
    """``X-Episode-Group`` / ``X-Episode-Group-Size`` / ``X-Episode-Outcome``: an environment's word on
    which group of episodes this session belongs to and, on its closing request, how it ended."""
    group = headers.get("x-episode-group")
    size, outcome = headers.get("x-episode-group-size"), headers.get("x-episode-outcome")
    if group is None:
        if size is not None or outcome is not None:
            name = "X-Episode-Group-Size" if size is not None else "X-Episode-Outcome"
            raise APIError(
                400, f"header {name} needs X-Episode-Group (the group the episode belongs to)", param=name
            )
        return None
    _refuse_control_characters(group, "header X-Episode-Group", "X-Episode-Group")
    fields: dict[str, Any] = {"group_id": group.strip()}
    for name, raw, key, kind in (
        ("X-Episode-Group-Size", size, "group_size", int),
        ("X-Episode-Outcome", outcome, "outcome", float),
    ):
        if raw is None:
            continue
        try:
            fields[key] = kind(raw.strip())
        except ValueError:
            raise APIError(
                400,
                f"header {name}: expected {'an integer' if kind is int else 'a number'}, "
                f"got {escape_for_log(raw, 40)!r}",
                param=name,
            ) from None
    try:
        return EpisodeTag(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = {
            "group_id": "X-Episode-Group",
            "group_size": "X-Episode-Group-Size",
            "outcome": "X-Episode-Outcome",
        }[str(err["loc"][0])]
        raise APIError(400, f"header {name}: {err['msg']}", param=name) from None


def _truth_header(raw: str | None) -> float | None:
    """``X-Turn-Truth``: a simulated environment's score (0..1) of the turn this request's newest
    message answers; see :class:`~openclaw_rl.types.NextState`."""
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise APIError(
            400,
            f"header X-Turn-Truth: expected a number from 0 to 1, got {escape_for_log(raw, 40)!r}",
            param="X-Turn-Truth",
        )
    return value


def _logprob_entry(token: str, lp: float, top: list[tuple[str, float]] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"token": token, "logprob": lp, "bytes": piece_bytes(token)}
    entry["top_logprobs"] = [{"token": t, "logprob": v, "bytes": piece_bytes(t)} for t, v in (top or [])]
    return entry


def _logprob_entries(event: Delta) -> list[dict[str, Any]]:
    """The log-probs a client sees of a delta's tokens: none of tokens beyond the reply (a stop string)."""
    if event.beyond_reply:
        return []
    return [
        _logprob_entry(t, lp, event.top[i] if event.top else None)
        for i, (t, lp) in enumerate(zip(event.tokens, event.logprobs, strict=True))
    ]


class _ShownLogprobs:
    """Log-prob entries shown to a client only once the text they spell is: a stop string's first
    tokens, half a character cut off by ``max_tokens`` and call markup are sampled but never content,
    so their entries never show, and a client's joined entries spell its content (as OpenAI's do)."""

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []
        self._shown = 0  # entries[:shown] went to the client
        self._shown_bytes = 0

    def add(self, entries: list[dict[str, Any]]) -> None:
        self._entries += entries

    def release(self, room: int) -> list[dict[str, Any]]:
        """The waiting entries that fit, with those shown before, within ``room`` bytes of content
        (the UTF-8 length of what the client has been sent so far)."""
        start = self._shown
        while (
            self._shown < len(self._entries)
            and self._shown_bytes + len(self._entries[self._shown]["bytes"]) <= room
        ):
            self._shown_bytes += len(self._entries[self._shown]["bytes"])
            self._shown += 1
        return self._entries[start : self._shown]


def _history(req: ChatCompletionRequest) -> list[ChatMessage]:
    """The conversation before this turn's reply: a prefilled reply's start is part of the reply."""
    return req.messages[:-1] if req.continue_final_message else req.messages


def _reply_text(job: Job) -> str | None:
    """The whole reply as the client will send it back: a prefill's start, then what was generated."""
    if not job.req.continue_final_message:
        return job.content
    return job.req.messages[-1].text + (job.content or "")


class Job:
    """One admitted request: its generation task and the events it relays to the response."""

    def __init__(self, req: ChatCompletionRequest, gen: GenRequest, assign: Assignment):
        self.req = req
        self.gen = gen
        self.assign = assign
        self.events: asyncio.Queue[Delta | Final | APIError] = asyncio.Queue()
        self.id = completion_id()
        self.created = now()
        self.final: Final | None = None
        self.tool_calls: list[dict[str, Any]] | None = None
        self.content: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.keyed = False  # the user's own key authenticated it: kept only while that key exists
        self.revoked = False  # its user was deleted while it ran (Serving.forget_user)
        self.user = ""  # the user it was admitted for (their share of the service, per_user mode)

    def cancel(self) -> bool:
        """Stop generating for a client that went away; False once the reply is complete (it is
        recorded then, as for a client that stayed)."""
        if self.task is None or self.task.done() or self.final is not None:
            return False
        self.task.cancel()
        return True


def _revoked_error() -> APIError:
    return APIError(
        401,
        "this user was deleted while the request was generating; their key is no longer valid",
        type_="authentication_error",
        code="user_deleted",
    )


class Serving:
    """The chat-completion logic shared by the HTTP routes and the in-process API."""

    def __init__(self, cfg: Config, engine: Engine, store: Store):
        self.cfg = cfg
        self.pcfg = cfg.policy_service
        self.engine = engine
        self.store = store
        self.sessions = SessionManager(store)
        self.model_name = self.pcfg.model
        self._known_case: dict[str, str] = {}  # lower-cased gateway name -> the one spelling seen
        self._by_user: dict[str, int] = {}  # requests each user has in the system (their sum: in flight)
        self._jobs: set[Job] = set()  # generating now: drained at shutdown; forget_user stops a user's
        self._swap_lock = threading.Lock()
        self._resumed: asyncio.Event | None = None  # created in the server's loop on first use
        self.started_at = time.time()
        self.served = 0

    # ------------------------------------------------------------------ admission & status
    @property
    def capacity(self) -> int:
        return self.pcfg.max_concurrent + self.pcfg.max_queue

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished (generating or queued), all users together."""
        return sum(self._by_user.values())

    def health(self) -> dict[str, Any]:
        """``/healthz``: 200 whenever this process answers; ``status`` is "degraded" (with
        ``engine_problem``) while a forwarding engine does not answer, so every request would fail."""
        problem = self.engine.health_problem()
        return {
            "status": "ok" if problem is None else "degraded",
            **({"engine_problem": problem} if problem else {}),
            "backend": self.engine.backend,
            "model": self.model_name,
            "policy_version": self.engine.policy_version,
            "in_flight": self.in_flight,
            "generating": getattr(self.engine, "active_count", 0),
            "max_concurrent": self.pcfg.max_concurrent,
            "max_queue": self.pcfg.max_queue,
            "served": self.served,
            "paused": self.paused,
            **self.engine.stats(),
        }

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(self.started_at),
                    "owned_by": "openclaw-rl",
                    # Anthropic's model object, for its SDK's models.list / retrieve
                    "type": "model",
                    "display_name": self.model_name,
                    "created_at": datetime.fromtimestamp(self.started_at, UTC)
                    .isoformat()
                    .replace("+00:00", "Z"),
                    "policy_version": self.engine.policy_version,
                    # The window under each name clients read: vLLM's, OpenRouter's / LiteLLM's, and others'.
                    "max_model_len": self.pcfg.max_model_len,
                    "context_length": self.pcfg.max_model_len,
                    "context_window": self.pcfg.max_model_len,
                }
            ],
        }

    def model(self, model_id: str) -> dict[str, Any]:
        """The card of the served model named ``model_id`` (``GET /v1/models/{id}``); 404 otherwise."""
        card = next((m for m in self.models()["data"] if m["id"] == model_id), None)
        if card is None:
            raise APIError(
                404,
                f"The model {escape_for_log(model_id, 80)!r} does not exist; this service serves "
                f"{self.model_name!r}",
                type_="invalid_request_error",
                param="model",
                code="model_not_found",
            )
        return card

    def count_tokens(self, body: bytes, headers: dict[str, str]) -> int:
        """How many tokens the prompt of a chat request ``body`` takes (nothing is generated or
        recorded); 501 when no local tokenizer knows the model."""
        _, gen = self.parse(body, headers)
        ids = self.engine.prompt_ids(gen)
        if ids is None:
            raise APIError(
                501,
                f"counting tokens needs the tokenizer of {self.model_name!r} on this machine, and "
                "none is there",
                type_="server_error",
            )
        return len(ids)

    def swap_weights(self, path: str | Path, version: int, user: str | None = None) -> int:
        """Replace the policy weights (blocking; in-flight requests complete) and record the version;
        ``user``: only that user's adapter (per_user mode), nobody else's weights change."""
        with self._swap_lock:
            if user is None:
                self.engine.swap_weights(path, version)
                self.store.set_meta("policy_version", version)
            else:
                self.engine.swap_adapter(user, path, version)
                self.store.set_meta(adapter_meta(user), version)
        return version

    def _gate(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
            self._resumed.set()
        return self._resumed

    def set_paused(self, paused: bool) -> bool:
        """Lock-step mode (``async_mode = false``): while paused, new requests wait in the queue —
        they are held, never refused — and run once serving resumes. Call from the server's loop."""
        gate = self._gate()
        gate.clear() if paused else gate.set()
        return paused

    @property
    def paused(self) -> bool:
        return self._resumed is not None and not self._resumed.is_set()

    async def drain(self, timeout: float | None = None) -> int:
        """Wait for every generation task (including ones whose client left) to finish and record."""
        pending = [j.task for j in self._jobs if j.task is not None and not j.task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout or self.pcfg.request_timeout_sec)
        return len(pending)

    # ------------------------------------------------------------------ request handling
    def parse(self, body: bytes, headers: dict[str, str]) -> tuple[ChatCompletionRequest, GenRequest]:
        """Validate a request body; raise APIError 400 saying what is wrong."""
        if not body.strip():
            raise APIError(400, "request body is empty; send a JSON object with 'messages'")
        try:
            req = ChatCompletionRequest.model_validate_json(body, strict=True)
        except ValidationError as exc:
            message, param = validation_message(exc)
            raise APIError(400, message, param=param) from None
        ttype = headers.get("x-turn-type")
        if ttype is not None and ttype.strip().lower() not in ("main", "side"):
            raise APIError(
                400,
                f"header X-Turn-Type: expected main or side, got {escape_for_log(ttype, 40)!r}",
                param="X-Turn-Type",
            )
        requested = req.requested_max_tokens
        if (
            requested is not None
            and requested > self.pcfg.max_model_len
            and self.pcfg.max_tokens_overflow == "reject"
        ):
            raise APIError(
                400,
                f"This model's maximum context length is {self.pcfg.max_model_len} tokens. "
                f"However, you requested {requested} tokens for the completion alone "
                f"(max_tokens exceeds max_model_len). Please reduce max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        greedy = req.top_p == 0  # OpenAI's top_p 0: a nucleus of the likeliest token alone
        params = SamplingParams(
            temperature=0.0 if greedy else req.temperature,
            top_p=1.0 if greedy else req.top_p,
            top_k=max(req.top_k, 0),
            max_tokens=requested if requested is not None else self.pcfg.max_tokens_default,
            stop=req.stops,
            seed=req.seed,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            logit_bias=req.token_biases,
        )
        gen = GenRequest(
            messages=req.messages,
            tools=req.tools if req.tools_enabled else None,
            params=params,
            max_tokens_given=requested is not None,
            tool_choice=req.tool_choice,
            continue_final=req.continue_final_message,
            response_format=req.response_format,
        )
        return req, gen

    def user_of(self, caller: Caller, body_user: str | None, headers: dict[str, str]) -> str:
        """The request's user (:mod:`openclaw_rl.policy.identity`): the configured header wins over
        the body's ``user`` field."""
        header = self.cfg.users.header
        if header is not None and header.lower() in headers:
            where, user = f"header {header}", caller.user(headers[header.lower()], where=f"header {header}")
        else:
            # OpenAI's field is any string: one that is no user name names a user of its own
            where, user = "user", caller.user(name_for_user_field(body_user) if body_user else None)
        if caller.key_user is None and self._known_case.get(user.lower()) != user:
            # a gateway's name: refused if it differs only in case from a user the run knows, whose
            # folders (policy/users/NAME) it would share on a case-insensitive file system
            twin = self.store.case_twin(user)
            if twin is not None:
                raise APIError(
                    400,
                    f"{where}: user {user!r} differs only in case from the user {twin!r} this run "
                    "already knows; names may not differ only in case",
                    param=where,
                )
            self._known_case[user.lower()] = user
        return user

    @property
    def user_share(self) -> int | None:
        """The most requests one user may have in the system in ``per_user`` mode (half of it, at
        least ``max_concurrent``); None in shared mode, where a gateway may be one user for many."""
        if self.cfg.users.mode != "per_user":
            return None
        return max(self.pcfg.max_concurrent, self.capacity // 2)

    def _release(self, user: str) -> None:
        left = self._by_user.get(user, 1) - 1
        if left > 0:
            self._by_user[user] = left
        else:
            self._by_user.pop(user, None)

    async def start_job(
        self,
        body: bytes,
        headers: dict[str, str],
        caller: Caller = IN_PROCESS,
        response_id: str | None = None,
    ) -> Job:
        """Validate, admit, assign a session and start generating; errors are APIError.
        ``response_id``: the id the client sees (another protocol's, e.g. ``resp_...``); the turn is
        recorded under it, so feedback can name it."""
        req, gen = self.parse(body, headers)
        user = self.user_of(caller, req.user, headers)
        gen.owner = user
        if self.cfg.users.mode == "per_user":
            gen.adapter = user
        if self.in_flight >= self.capacity:
            raise APIError(
                429,
                f"server busy: {self.pcfg.max_concurrent} requests generating and "
                f"{self.pcfg.max_queue} queued; retry shortly",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        share = self.user_share
        if share is not None and self._by_user.get(user, 0) >= share:
            # one user's flood must not lock the others out of a service they share
            raise APIError(
                429,
                f"user {user!r} has {share} requests in flight, the most one user may hold (half of "
                f"this service's {self.capacity}); retry when some finish",
                type_="rate_limit_error",
                code="user_share_full",
                headers={"Retry-After": "1"},
            )
        self._by_user[user] = self._by_user.get(user, 0) + 1
        try:
            await self._gate().wait()  # open unless a lock-step run is training
            sid = headers.get("x-session-id") or req.session_id
            where = "X-Session-Id" if headers.get("x-session-id") else "session_id"  # as the client sent it
            # HTTP drops a header's surrounding spaces: the body's id loses them too, so both forms
            # of " work" name one session (and the answer's header can hold it)
            sid = sid.strip() if sid is not None else None
            if sid is not None and not (0 < len(sid) <= 256):
                raise APIError(400, f"{where} must be 1-256 characters", param=where)
            if sid is not None:
                _refuse_control_characters(sid, where, where)
                sid = scoped_session_id(user, sid)
                owner = await asyncio.to_thread(self.store.session_user, sid)
                if owner is not None and owner != user:
                    raise APIError(
                        403,
                        f"{where}: this session belongs to another user",
                        type_="permission_error",
                        param=where,
                        code="session_of_another_user",
                    )
            ttype_h = headers.get("x-turn-type")
            ttype = ttype_h.strip().lower() if ttype_h else req.turn_type
            rules = self.pcfg.client_rules
            chore = housekeeping_reason(req.messages, bool(req.tools), rules) if rules else None
            if chore:  # a client's own request, even under a "main" header: served, never trained on
                ttype = "side"
                log.debug("[policy_service] %s served as a side turn", chore)
            done_h = _bool_header(headers.get("x-session-done"), "X-Session-Done")
            done = done_h if done_h is not None else bool(req.session_done)
            episode = _episode_headers(headers)
            if episode is not None and (await asyncio.to_thread(self.store.group_users, episode.group_id)) - {
                user
            }:
                # a group's rewards are compared with each other: another user's episodes (or outcome)
                # in it would move this user's advantages, as a shared session would their turns
                raise APIError(
                    403,
                    "X-Episode-Group: this group belongs to another user",
                    type_="permission_error",
                    param="X-Episode-Group",
                    code="group_of_another_user",
                )
            truth = _truth_header(headers.get("x-turn-truth"))
            clean = (lambda text: clean_user_text(text, rules)) if rules else None
            # off the event loop: stitching reads the store and hashes the conversation's prefixes
            assign = await asyncio.to_thread(
                self.sessions.assign,
                _history(req),
                sid,
                ttype,  # type: ignore[arg-type]
                done,
                user,
                clean,
            )
            assign.episode = episode
            if assign.next_state is not None and truth is not None:
                assign.next_state.truth = truth
            gen.session_id = assign.session_id
            job = Job(req, gen, assign)
            job.keyed = caller.key_user is not None
            if response_id is not None:
                job.id = response_id
            try:
                await asyncio.to_thread(self.engine.prepare, gen)
            except APIError:
                # e.g. the conversation outgrew max_model_len: no answer, but the message it carries
                # is still the previous turn's next state, so it is recorded
                await asyncio.to_thread(self._record_state_only, job)
                raise
        except BaseException:
            self._release(user)
            raise
        job.user = user
        job.task = asyncio.create_task(self._run(job))
        self._jobs.add(job)  # the set holds the task too, so it is not garbage-collected mid-run
        job.task.add_done_callback(lambda _: self._jobs.discard(job))
        return job

    def forget_user(self, user: str) -> int:
        """A deleted user's requests still generating stop now: each client gets a 401 in place of
        the rest of its reply, and nothing of them is recorded (``users delete``). Returns how many."""
        stopped = 0
        for job in list(self._jobs):
            if job.assign.user == user and job.final is None and job.task is not None and not job.task.done():
                job.revoked = True
                job.task.cancel()
                stopped += 1
        return stopped

    async def _run(self, job: Job) -> None:
        """Generate, relay events, record. A client that goes away before the reply is complete
        cancels this (:meth:`Job.cancel`): the engine stops decoding for it, nothing of the reply is
        recorded (its client never read it), and the next state its request carried still is."""
        try:
            async with contextlib.aclosing(self.engine.generate(job.gen)) as events:
                async for event in events:
                    if isinstance(event, Final):
                        job.final = event
                        if event.error is None:
                            content, calls = (
                                (event.text, event.tool_calls)
                                if event.tool_calls
                                else parse_tool_calls(event.text, job.gen.tools)
                            )
                            if job.gen.tools and not calls and event.finish_reason == "length":
                                content = without_unfinished_call(content)
                            elif job.gen.tools is None and job.req.shows_call_markup:
                                content = without_call_markup(content)
                            one = job.req.legacy_functions or job.req.parallel_tool_calls is False
                            if calls and one:
                                # one call asked for (or the older form, which has one): what the
                                # client sees is what is recorded and stitched
                                calls = calls[:1]
                            job.content, job.tool_calls = content, calls
                            await asyncio.to_thread(self._record, job, event)
                        else:
                            await asyncio.to_thread(self._record_state_only, job)
                    await job.events.put(event)
        except asyncio.CancelledError:
            if job.revoked:  # its user was deleted: tell the client, keep nothing
                log.info("[policy_service] a request of a deleted user was stopped; nothing of it is kept")
                await job.events.put(_revoked_error())
                return
            log.info(
                "[policy_service] session=%s turn=%d: the client went away; generation stopped",
                quoted_for_log(job.assign.session_id, 80),
                job.assign.turn_index,
            )
            await self._record_state_if_possible(job)
            raise
        except APIError as exc:
            await self._record_state_if_possible(job)
            await job.events.put(exc)
        except Exception as exc:  # reported to this client; the service keeps serving
            if disk_full(exc):  # recording failed, not the model: say what the operator must do
                log.error("[policy_service] a reply could not be recorded: the disk is full (%s)", exc)
                error = APIError(
                    503,
                    "the reply could not be recorded: the disk under the run's folder is full; "
                    "the service answers again once there is room",
                    type_="server_error",
                    code="disk_full",
                )
            else:
                log.exception("generation failed")
                error = APIError(500, f"generation failed: {type(exc).__name__}", type_="server_error")
            await self._record_state_if_possible(job)
            await job.events.put(error)  # always: a client left without an end would wait for ever
        finally:
            self._release(job.user)
            self.served += 1

    def _record(self, job: Job, final: Final) -> None:
        a = job.assign
        turn = Turn(
            session_id=a.session_id,
            turn_index=a.turn_index,
            turn_type=a.turn_type,
            messages=job.gen.wire_messages,
            tools=job.gen.prompt_tools,
            continues_final=job.gen.continue_final,
            prompt_ids=final.prompt_ids,
            response_ids=final.response_ids,
            response_logprobs=final.logprobs,
            response_text=final.text,
            tool_calls=job.tool_calls,
            finish_reason=final.finish_reason,
            policy_version=final.policy_version,
            user=a.user,
            response_id=job.id,
        )
        main = a.turn_type == "main"
        key = (
            self.sessions.prefix_key(_history(job.req), _reply_text(job), job.tool_calls, a.user)
            if main
            else None
        )
        kept = self.store.record_turn(
            turn,
            next_state_for_previous=a.next_state if main else None,
            prefix_digest=key,
            episode=a.episode,
            key_owner=a.user if job.keyed else None,
        )
        if not kept:  # its user was deleted while it was generating (a service not told of it)
            log.info("[policy_service] a reply to a deleted user was served but not recorded")
            return
        if key is not None:  # a main turn
            self.sessions.remember_key(key, a.session_id)
        if a.done:
            self.store.close_session(a.session_id)
        last = job.req.messages[-1]
        # a named user's words stay in the store, where `users delete` reaches them; an operator's
        # console log (often kept in a file) shows only how much they wrote
        said = quoted_for_log(last.text) if a.user == DEFAULT_USER else f"<{len(last.text)} characters>"
        log.info(
            "[policy_service] session=%s turn=%d type=%s prompt_tokens=%d response_tokens=%d version=%d "
            "finish=%s stitched=%s last_%s=%s",
            quoted_for_log(a.session_id, 80),
            a.turn_index,
            a.turn_type,
            len(final.prompt_ids),
            len(final.response_ids),
            final.policy_version,
            final.finish_reason,
            a.stitched,
            last.role,
            said,
        )

    async def _record_state_if_possible(self, job: Job) -> None:
        """:meth:`_record_state_only` after a failed reply; a store that cannot take it either (a
        full disk) is logged in one line: the client's answer must not wait on it."""
        try:
            await asyncio.to_thread(self._record_state_only, job)
        except Exception as exc:
            log.warning("[policy_service] the next state of a failed reply was not recorded: %s", exc)

    def _record_state_only(self, job: Job) -> None:
        a = job.assign
        self.sessions.release(a.session_id, a.turn_index)  # no turn of this index was recorded
        if job.keyed and not self.store.user_has_key(a.user):
            return  # deleted meanwhile: nothing of theirs is written again
        if a.episode is not None:
            self.store.tag_session(a.session_id, a.episode)
        if a.turn_type == "main" and a.next_state is not None:
            self.store.attach_next_state(a.session_id, a.next_state, before=a.turn_index)
        if a.done:
            self.store.close_session(a.session_id)

    # ------------------------------------------------------------------ feedback
    def feedback(self, req: FeedbackRequest, headers: dict[str, str], caller: Caller) -> dict[str, Any]:
        """``POST /v1/feedback``: the rating becomes the turn's explicit next state (blocking).

        404 for an id no main turn was served under, 403 when the turn is another user's; nothing
        is recorded then."""
        user = self.user_of(caller, req.user, headers)
        found = self.store.turn_by_response(req.response_id)
        if found is None:
            raise APIError(
                404,
                f"response_id: no response {escape_for_log(req.response_id, 80)!r} was served here "
                "(or it was a side request, which is never trained on)",
                type_="not_found_error",
                param="response_id",
                code="response_not_found",
            )
        _, owner = found
        if owner != user:
            raise APIError(
                403,
                "response_id: that response was served to another user; only they may rate it",
                type_="permission_error",
                param="response_id",
                code="not_your_response",
            )
        comment = req.comment.strip() if req.comment else None
        outcome = self.store.record_feedback(
            Feedback(
                response_id=req.response_id,
                user=user,
                rating=req.rating,
                comment=comment or None,
                created_at=time.time(),
            )
        )
        if outcome is None:  # deleted between the two looks
            raise APIError(404, "response_id: that response is gone", param="response_id")
        log.info(
            "[policy_service] feedback %+d on session=%s turn=%d%s",
            req.rating,
            quoted_for_log(outcome.session_id, 80),
            outcome.turn_index,
            ""
            if outcome.will_train
            else " (its sample is in an update or trained: recorded, trains only if that update is taken back)",
        )
        return {
            "object": "feedback",
            "response_id": req.response_id,
            "rating": req.rating,
            "session_id": client_session_id(user, outcome.session_id),
            "turn_index": outcome.turn_index,
            "will_train": outcome.will_train,
            "replaced_next_state": outcome.replaced_next_state,
        }

    # ------------------------------------------------------------------ responses
    def finish_reason(self, job: Job) -> str:
        assert job.final is not None
        if job.tool_calls:
            return "function_call" if job.req.legacy_functions else "tool_calls"
        return job.final.finish_reason

    async def complete(self, job: Job) -> dict[str, Any]:
        """Wait for the whole generation and build a ``chat.completion`` object."""
        logprobs = _ShownLogprobs()
        while True:
            event = await job.events.get()
            if isinstance(event, APIError):
                raise event
            if isinstance(event, Delta):
                logprobs.add(_logprob_entries(event))
                continue
            if event.error is not None:
                raise APIError(500, event.error, type_="server_error")
            break
        final = job.final
        assert final is not None
        message: dict[str, Any] = {"role": "assistant", "content": job.content}
        if job.tool_calls and job.req.legacy_functions:  # the older form: one call, no id
            message["function_call"] = job.tool_calls[0]["function"]
        elif job.tool_calls:
            message["tool_calls"] = job.tool_calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": self.finish_reason(job),
            "logprobs": {"content": logprobs.release(len((job.content or "").encode()))}
            if job.req.logprobs
            else None,
        }
        out: dict[str, Any] = {
            "id": job.id,
            "object": "chat.completion",
            "created": job.created,
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(final),
            "policy_version": final.policy_version,
            "session_id": job.assign.client_session_id,
            "turn_index": job.assign.turn_index,
        }
        if job.req.return_token_ids:
            out["prompt_token_ids"] = final.prompt_ids
            choice["token_ids"], choice["token_logprobs"] = final.response_ids, final.logprobs
        return out

    @staticmethod
    def _usage(final: Final) -> dict[str, Any]:
        n = len(final.response_ids)
        return {
            "prompt_tokens": len(final.prompt_ids),
            "completion_tokens": n,
            "total_tokens": len(final.prompt_ids) + n,
            # objects, never null, as OpenAI's (clients read usage.prompt_tokens_details.cached_tokens)
            "prompt_tokens_details": {"cached_tokens": final.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    async def stream(self, job: Job) -> AsyncGenerator[str, None]:
        """``chat.completion.chunk`` SSE events as tokens are sampled, then ``data: [DONE]``."""

        def chunk(
            delta: dict[str, Any],
            finish: str | None = None,
            extra: dict[str, Any] | None = None,
            choice_extra: dict[str, Any] | None = None,
        ) -> str:
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **(choice_extra or {}),
            }
            body = {
                "id": job.id,
                "object": "chat.completion.chunk",
                "created": job.created,
                "model": self.model_name,
                "choices": [choice],
                **(extra or {}),
            }
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        first = {"session_id": job.assign.client_session_id, "turn_index": job.assign.turn_index}
        want_ids = job.req.return_token_ids
        if want_ids and job.gen.prompt_ids is not None:
            first["prompt_token_ids"] = job.gen.prompt_ids
        # with tools the reply may be calls alone, whose message content is null (as OpenAI's
        # stream leaves it): the text, if any, starts the content with its first delta
        yield chunk(
            {"role": "assistant"} if job.gen.tools else {"role": "assistant", "content": ""}, extra=first
        )
        tools = job.req.shows_call_markup  # call markup is never content, tools on or off
        text = ""  # everything the engine produced so far
        sent = 0  # characters of it sent as content
        sent_bytes = 0  # their UTF-8 length: the room the log-prob entries shown so far fill
        held = False  # a tool call started: the rest is not content
        logprobs = _ShownLogprobs()
        while True:
            event = await job.events.get()
            if isinstance(event, APIError) or (isinstance(event, Final) and event.error is not None):
                err = (
                    event
                    if isinstance(event, APIError)
                    else APIError(500, event.error or "", type_="server_error")
                )
                yield f"data: {json.dumps(err.body())}\n\n"
                yield "data: [DONE]\n\n"
                return
            if isinstance(event, Final):
                break
            text += event.text
            safe = len(text)
            if tools and not held:
                at = call_markup_start(text)
                if at is not None:  # a whole "<tool_call>" holds the rest; a begun one may become one
                    safe, held = at, text.startswith(OPEN, at)
            elif held:
                safe = sent
            piece = text[sent:safe] if safe > sent else ""
            sent = max(sent, safe)
            sent_bytes += len(piece.encode())
            extra: dict[str, Any] = {}
            logprobs.add(_logprob_entries(event) if job.req.logprobs else [])
            shown = logprobs.release(sent_bytes)
            if shown:
                extra["logprobs"] = {"content": shown}
            if want_ids:  # with their log-probs, those of tokens beyond the reply (an end token) too
                extra["token_ids"], extra["token_logprobs"] = event.token_ids, event.logprobs
            if piece or extra or event.tool_calls:
                yield chunk({"content": piece} if piece else {}, choice_extra=extra)
        final = job.final
        assert final is not None
        # the entries of text only the end released (a held stop-string start that was not one)
        shown = logprobs.release(len((job.content or "").encode()))
        rest = {"logprobs": {"content": shown}} if shown else None
        if job.tool_calls and job.req.legacy_functions:
            yield chunk({"function_call": job.tool_calls[0]["function"]}, choice_extra=rest)
        elif job.tool_calls:
            calls = [{"index": i, **c} for i, c in enumerate(job.tool_calls)]
            yield chunk({"tool_calls": calls}, choice_extra=rest)
        elif sent < len(job.content or "") or rest:
            yield chunk({"content": (job.content or "")[sent:]}, choice_extra=rest)
        yield chunk({}, finish=self.finish_reason(job), extra={"policy_version": final.policy_version})
        if job.req.stream_options is not None and job.req.stream_options.include_usage:
            body = {
                "id": job.id,
                "object": "chat.completion.chunk",
                "created": job.created,
                "model": self.model_name,
                "choices": [],
                "usage": self._usage(final),
            }
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
