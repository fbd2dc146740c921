"""Forwarding backends: generation runs in an external OpenAI-compatible engine, while this service
still owns sessions, next states and recording.

``backend = "sglang" | "vllm"`` forwards to ``[policy_service] engine_url`` (default
``http://127.0.0.1:<port + 1>``); ``backend = "api"`` forwards to the ``[api]`` channel with its key.
Every request is sent with ``stream = true`` (tokens are relayed to our client as the engine produces
them) and ``logprobs = true``.

Token ids, in order of preference (the recorded ``Turn`` says which through its contents):

1. ``return_token_ids`` (vLLM >= 0.10, and this service itself): the engine returns
   ``prompt_token_ids`` and, per chunk, the sampled ``token_ids`` — exact, used as is.
2. ``return_tokens_as_token_ids`` (vLLM): each log-prob entry's token reads ``token_id:<id>``.
3. Neither (SGLang's OpenAI route, hosted APIs): ids cannot be known without re-tokenising text, which
   would train on ids the model never sampled. The turn is still recorded — session, messages, text, tool calls, next state — but
   with empty ``response_ids`` / ``response_logprobs``, so it is never trained on (the sample builder
   skips empty responses), and a warning is logged once. ``prompt_ids`` then come from our own chat
   template when the model's tokenizer is available locally.

The two extension fields are sent only to ``sglang`` / ``vllm`` engines; hosted APIs may reject
unknown fields.

Weight sync (what ``swap_weights`` does), thin and documented:

* ``sglang``: ``POST {engine}/update_weights_from_disk {"model_path": path}`` (a full model directory);
* ``vllm``: ``POST {engine}/v1/load_lora_adapter {"lora_name": "policy-v<N>", "lora_path": path,
  "load_inplace": true}``
  (a LoRA adapter directory; the engine must run with ``--enable-lora``); later requests name that
  adapter as their ``model``;
* ``api``: a hosted model cannot be replaced — swapping raises :class:`WeightLoadError`.

This service answers both routes itself, so a second instance of it can stand in for the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.config import Config
from openclaw_rl.policy.engine import Delta, Engine, Final, GenRequest
from openclaw_rl.policy.guided import call_schema
from openclaw_rl.policy.weights import WeightLoadError
from openclaw_rl.runtime import chat_format
from openclaw_rl.runtime.chat_stream import add_tool_call_deltas, read_error, tool_calls_in_order
from openclaw_rl.runtime.secrets import without_key

log = logging.getLogger("openclaw_rl.policy")


def _token_id(entry: dict[str, Any]) -> int | None:
    tok = entry.get("token")
    if isinstance(tok, str) and tok.startswith("token_id:"):
        try:
            return int(tok.split(":", 1)[1])
        except ValueError:
            return None
    return None


class ForwardEngine(Engine):
    """Generation by an external OpenAI-compatible engine (SGLang, vLLM or a hosted API)."""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        pcfg = cfg.policy_service
        self.backend = pcfg.backend
        self.pcfg = pcfg
        if self.backend == "api":
            self.v1 = cfg.api.v1_url
            key = cfg.api.api_key.get_secret_value()
        else:
            root = pcfg.engine_root
            self.v1 = root if root.endswith("/v1") else f"{root}/v1"
            key = pcfg.engine_api_key.get_secret_value() if pcfg.engine_api_key is not None else ""
        self.root = self.v1.removesuffix("/v1")
        self._key = key  # masked out of any engine error a client is shown
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.serve_model = pcfg.model
        self._user_models: dict[str, tuple[str, int]] = {}  # per_user, vllm: user -> (LoRA name, version)
        self._lora_paths: dict[str, Path] = {}  # vllm: each LoRA name this service loaded -> its folder
        self._retiring: dict[str, str] = {}  # vllm: LoRA family ("policy", "user-x") -> name to unload next
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None
        self._reload_lock: asyncio.Lock | None = None
        self._warned = False
        self.active_count = 0

    def start(self) -> None:
        try:
            from openclaw_rl.runtime.models import load_tokenizer

            self.tokenizer = load_tokenizer(self.pcfg.model)
        except (OSError, ValueError) as exc:  # the model may live only on the engine's machine
            log.info(
                "no local tokenizer for %r (%s); prompt ids come from the engine only", self.pcfg.model, exc
            )
            self.tokenizer = None

    def stop(self) -> None:
        client, loop = self._client, self._client_loop
        self._client = None
        if client is not None and loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(client.aclose(), loop)

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = httpx.Timeout(self.pcfg.request_timeout_sec, connect=10.0)
            self._client = httpx.AsyncClient(timeout=timeout, headers=self._headers)
            self._client_loop = loop
            self._sem = asyncio.Semaphore(self.pcfg.max_concurrent)
            self._reload_lock = asyncio.Lock()
        return self._client

    @property
    def renders_tools(self) -> bool:
        """vllm / sglang: tools and tool calls are rendered into the messages here, by
        :mod:`openclaw_rl.runtime.chat_format`, not sent as ``tools``. So the engine reads the prompt
        the embedded engine and the OPD teacher read, and needs no ``--tool-call-parser`` (without
        one, vLLM refuses every request that carries ``tools``); the reply's calls are parsed from its
        text as the embedded engine's are. ``api``: a hosted API renders its own tools."""
        return self.backend in ("sglang", "vllm")

    def forced_call(self, req: GenRequest) -> bool:
        """The request forces a tool call that this service holds the engine to (:meth:`renders_tools`)."""
        grammar = req.output_grammar
        return self.renders_tools and grammar is not None and grammar.kind == "tool_call"

    def body(self, req: GenRequest) -> dict[str, Any]:
        """The request sent to the engine."""
        p = req.params
        own = self._user_models.get(req.adapter) if req.adapter is not None else None
        messages: list[dict[str, Any]] = (
            list(chat_format.template_messages(req.wire_messages, req.prompt_tools))
            if self.renders_tools
            else req.wire_messages
        )
        body: dict[str, Any] = {
            "model": own[0] if own is not None else self.serve_model,
            "messages": messages,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "top_logprobs": p.top_logprobs,
        }
        if p.stop:
            body["stop"] = p.stop
        if p.seed is not None:
            body["seed"] = p.seed
        if p.penalised:
            body.update(frequency_penalty=p.frequency_penalty, presence_penalty=p.presence_penalty)
        if p.top_k and self.backend in ("sglang", "vllm"):  # a hosted OpenAI-style API has no top_k
            body["top_k"] = p.top_k
        if p.logit_bias:
            body["logit_bias"] = {str(t): b for t, b in p.logit_bias.items()}
        if req.response_format is not None:  # the engine enforces it (vLLM / SGLang guided decoding)
            body["response_format"] = req.response_format.model_dump(by_alias=True, exclude_none=True)
        if self.forced_call(req):
            # held to the call's JSON by the engine's structured output; made a tool call on return
            grammar = req.output_grammar
            assert grammar is not None  # forced_call says so
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "tool_call",
                    "schema": call_schema(grammar.functions),
                    "strict": True,
                },
            }
        elif req.tools and not self.renders_tools:
            body["tools"] = [t.model_dump(exclude_none=True) for t in req.tools]
            if req.tool_choice is not None:
                choice = req.tool_choice
                body["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
        if req.continue_final:  # vLLM's and SGLang's name; an OpenAI-style API has no prefill
            body.update(continue_final_message=True, add_generation_prompt=False)
        if self.backend in ("sglang", "vllm"):
            body["return_token_ids"] = True
            if self.backend == "vllm":
                body["return_tokens_as_token_ids"] = True
        return body

    async def generate(self, req: GenRequest) -> AsyncGenerator[Delta | Final, None]:
        from openclaw_rl.policy.protocol import APIError

        client = self._http()
        assert self._sem is not None
        own = self._user_models.get(req.adapter) if req.adapter is not None else None
        version = own[1] if own is not None else (0 if req.adapter is not None else self._version)
        prompt_ids: list[int] | None = None
        ids: list[int] = []
        lps: list[float] = []
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish = "stop"
        stop_string: str | None = None
        ids_ok = True
        forced = self.forced_call(req)
        async with self._sem:
            self.active_count += 1
            try:
                body = self.body(req)
                # vllm: a restarted engine has forgotten the LoRAs loaded into it; reload once and retry
                for attempt in (0, 1):
                    async with client.stream("POST", f"{self.v1}/chat/completions", json=body) as resp:
                        if resp.status_code != 200:
                            detail = read_error((await resp.aread()).decode("utf-8", "replace")).message
                            if attempt == 0 and await self._reloaded(resp.status_code, body["model"]):
                                continue
                            raise self._engine_error(resp.status_code, detail[:500])
                        async for line in resp.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                break
                            chunk = json.loads(data)
                            if "error" in chunk:
                                raise APIError(
                                    502,
                                    f"the {self.backend} engine failed mid-stream: "
                                    + without_key(
                                        str(chunk["error"].get("message", chunk["error"])), self._key
                                    ),
                                    type_="upstream_error",
                                )
                            if chunk.get("prompt_token_ids") is not None:
                                prompt_ids = list(chunk["prompt_token_ids"])
                            for choice in chunk.get("choices") or []:
                                delta = choice.get("delta") or {}
                                entries = ((choice.get("logprobs") or {}).get("content")) or []
                                new_lp = [float(e.get("logprob", 0.0)) for e in entries]
                                new_ids = choice.get("token_ids")
                                # this service as the engine: tokens beyond the reply (the end token, a
                                # stop string's) have no entry, but their ids and log-probs are sent
                                own = choice.get("token_logprobs")
                                beyond = (
                                    not entries
                                    and isinstance(new_ids, list)
                                    and isinstance(own, list)
                                    and len(own) == len(new_ids) > 0
                                )
                                if beyond:
                                    new_lp = [float(x) for x in own]
                                if new_ids is None:
                                    parsed = [_token_id(e) for e in entries]
                                    new_ids = parsed if all(i is not None for i in parsed) else None
                                if new_ids is None or len(new_ids) != len(new_lp):
                                    ids_ok = ids_ok and not entries
                                    new_ids = []
                                ids.extend(int(i) for i in new_ids)
                                lps.extend(new_lp)
                                add_tool_call_deltas(calls, delta.get("tool_calls"))
                                piece = delta.get("content") or ""
                                text.append(piece)
                                if forced:  # the call's JSON is not content: it becomes tool_calls at the end
                                    piece = ""
                                if beyond:
                                    yield Delta(
                                        piece,
                                        [int(i) for i in new_ids],
                                        new_lp,
                                        [""] * len(new_lp),
                                        None,
                                        beyond_reply=True,
                                    )
                                elif piece or entries:
                                    top = None
                                    if req.params.top_logprobs:
                                        top = [
                                            [
                                                (
                                                    self._token_text(t.get("token", "")),
                                                    float(t.get("logprob", 0.0)),
                                                )
                                                for t in e.get("top_logprobs") or []
                                            ]
                                            for e in entries
                                        ]
                                    yield Delta(
                                        piece,
                                        [int(i) for i in new_ids],
                                        new_lp,
                                        [self._token_text(e.get("token", "")) for e in entries],
                                        top,
                                    )
                                if choice.get("finish_reason"):
                                    finish = choice["finish_reason"]
                                # vLLM names the stop string that ended the reply (a token id for a stop token)
                                said = choice.get("stop_reason") or choice.get("matched_stop")
                                if isinstance(said, str) and said in req.params.stop:
                                    stop_string = said
                    break
            except httpx.HTTPError as exc:
                raise APIError(
                    502,
                    f"the {self.backend} engine at {self.v1} is unreachable or failed: "
                    f"{type(exc).__name__}: {str(exc) or 'no answer within request_timeout_sec'}",
                    type_="upstream_error",
                ) from exc
            finally:
                self.active_count -= 1
        if not ids_ok or len(ids) != len(lps):
            if not self._warned:
                log.warning(
                    "the %s engine returned no token ids; turns are recorded without response ids "
                    "and will not be trained on (see docs/serving.md)",
                    self.backend,
                )
                self._warned = True
            ids, lps = [], []
        exact_prompt = prompt_ids is not None
        if prompt_ids is None:
            prompt_ids = list(req.prompt_ids or [])
        tool_calls = tool_calls_in_order(calls)
        reply = "".join(text)
        if forced and finish == "stop":
            tool_calls = _forced_call(reply)
            reply = "" if tool_calls else reply
        yield Final(
            "tool_calls" if tool_calls and finish == "stop" else finish,
            prompt_ids,
            ids,
            lps,
            reply,
            version,
            tool_calls=tool_calls,
            ids_exact=exact_prompt and ids_ok,
            stop_string=stop_string if finish == "stop" else None,
        )

    def _token_text(self, token: Any) -> str:
        """A token as the client reads it: vllm names tokens ``token_id:N`` for this service's own
        recording (``return_tokens_as_token_ids``); clients get the token's text, as OpenAI sends."""
        tok = str(token)
        if tok.startswith("token_id:") and self.tokenizer is not None:
            tid = _token_id({"token": tok})
            if tid is not None:
                return str(self.tokenizer.decode([tid]))
        return tok

    def _engine_error(self, status: int, detail: str) -> Exception:
        """The client's error for an engine that refused a request: a prompt longer than the
        engine's window is the client's 400 ``context_length_exceeded`` (agents compact on it); any
        other refusal but a bad request is the service's problem, a 502."""
        from openclaw_rl.policy.protocol import APIError

        message = (
            f"the {self.backend} engine at {self.v1} answered {status}: {without_key(detail, self._key)}"
        )
        if status == 400 and "context length" in detail.lower():
            return APIError(400, message, type_="invalid_request_error", code="context_length_exceeded")
        return APIError(status if status in (400, 422) else 502, message, type_="upstream_error")

    async def _reloaded(self, status: int, model: str) -> bool:
        """After a 404 for a LoRA this service loaded (the engine restarted, or something unloaded
        it): load it again from where it was published; True when the request is worth one retry.
        Requests that meet the 404 together reload one at a time; a load refused because a request
        beside this one has just loaded the LoRA is still a reason to retry."""
        path = self._lora_paths.get(model)
        if status != 404 or self.backend != "vllm" or path is None or self._reload_lock is None:
            return False
        async with self._reload_lock:
            try:
                await asyncio.to_thread(
                    self._post_weights,
                    f"{self.v1}/load_lora_adapter",
                    _lora_body(model, path),
                    path,
                )
            except WeightLoadError as exc:
                log.info("reloading %s into the vllm engine: %s; retrying the request", model, exc)
                return True
        log.info("the vllm engine had lost %s; loaded it again from %s", model, path)
        return True

    def health_problem(self) -> str | None:
        """An engine (sglang / vllm) that does not answer ``GET /v1/models`` within 3 s; a hosted
        API is not asked on every health check."""
        if self.backend == "api":
            return None
        try:
            status = httpx.get(f"{self.v1}/models", headers=self._headers, timeout=3.0).status_code
        except httpx.HTTPError as exc:
            return f"the {self.backend} engine at {self.v1} does not answer ({type(exc).__name__})"
        return None if status < 500 else f"the {self.backend} engine at {self.v1} answered {status}"

    # -------------------------------------------------------------- weight sync
    def swap_adapter(self, user: str, path: str | Path, version: int) -> None:
        """vllm: load ``user``'s adapter as the named LoRA ``user-<user>-v<version>``; their later
        requests name it as their ``model`` (the engine batches requests of different LoRAs itself).
        Other users' adapters stay loaded. sglang / api: refused."""
        if self.backend != "vllm":
            raise WeightLoadError(
                f'backend {self.backend!r} does not serve per-user adapters here; use "vllm" or "transformers"'
            )
        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise WeightLoadError(f"path: {p} is not a LoRA adapter directory (no adapter_config.json)")
        name = f"user-{user}-v{version}"
        self._post_weights(f"{self.v1}/load_lora_adapter", _lora_body(name, p), p)
        previous = self._user_models.get(user)
        self._user_models[user] = (name, version)
        self._lora_paths[name] = p
        if previous is not None and previous[0] != name:
            self._retire(f"user-{user}", previous[0])

    def adapter_version(self, user: str) -> int:
        own = self._user_models.get(user)
        return own[1] if own is not None else 0

    def forget_adapter(self, user: str) -> None:
        """vllm: unload ``user``'s named LoRA from the engine; their next request gets the base."""
        own = self._user_models.pop(user, None)
        retiring = self._retiring.pop(f"user-{user}", None)
        for name in [n for n in (own[0] if own else None, retiring) if n is not None]:
            self._lora_paths.pop(name, None)  # a deleted user's adapter is never loaded again
            if self.backend == "vllm":
                self._post_weights(f"{self.v1}/unload_lora_adapter", {"lora_name": name}, Path(name))

    def swap_weights(self, path: str | Path, version: int) -> None:
        """Ask the engine to load ``path``; see the module docstring for each backend."""
        p = Path(path)
        if self.backend == "api":
            raise WeightLoadError('backend "api" serves a hosted model whose weights cannot be replaced')
        if not p.is_dir():
            raise WeightLoadError(f"path: {p} is not a directory (expected the output of export_policy)")
        if self.backend == "sglang":
            url, body = f"{self.root}/update_weights_from_disk", {"model_path": str(p)}
        else:
            if not (p / "adapter_config.json").is_file():
                raise WeightLoadError(
                    f"path: {p} is not a LoRA adapter directory; the vllm backend swaps "
                    "weights through /v1/load_lora_adapter, which takes adapters only"
                )
            name = f"policy-v{version}"
            url, body = f"{self.v1}/load_lora_adapter", _lora_body(name, p)
        self._post_weights(url, body, p)
        if self.backend == "vllm":
            previous, self.serve_model = self.serve_model, f"policy-v{version}"
            self._lora_paths[self.serve_model] = p
            if previous in self._lora_paths and previous != self.serve_model:
                self._retire("policy", previous)
        self._version = version

    def _retire(self, family: str, old: str) -> None:
        """A new version of ``family`` ("policy", "user-<name>") replaced the LoRA ``old``: unload
        the version before ``old``, lest a long run hold every version it ever served. ``old`` itself,
        which may still be streaming its last replies, stays loaded until the next swap. A retired
        version is not loaded again; a request still naming it meets the engine's 404."""
        before = self._retiring.get(family)
        self._retiring[family] = old
        if before is None or before == old:
            return
        self._lora_paths.pop(before, None)
        try:
            self._post_weights(f"{self.v1}/unload_lora_adapter", {"lora_name": before}, Path(before))
        except WeightLoadError as exc:
            log.info("could not unload %s from the vllm engine (%s); it stays loaded", before, exc)

    def _post_weights(self, url: str, body: dict[str, Any], p: Path) -> None:
        """POST a weight-load request to the engine; :class:`WeightLoadError` unless it took them."""
        timeout = httpx.Timeout(self.pcfg.request_timeout_sec, connect=10.0)
        try:
            resp = httpx.post(url, json=body, headers=self._headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise WeightLoadError(f"the {self.backend} engine at {url} is unreachable: {exc}") from exc
        ok = resp.status_code == 200
        if ok and self.backend == "sglang":
            try:
                ok = bool(resp.json().get("success", True))
            except ValueError:
                ok = True
        if not ok:
            raise WeightLoadError(
                f"the {self.backend} engine refused the weights at {p}: {resp.status_code} {resp.text[:300]}"
            )


def _lora_body(name: str, path: Path) -> dict[str, Any]:
    """vLLM's ``load_lora_adapter`` body. In place: an engine that outlives this service (restarted,
    or a second run's) may hold a LoRA of that name already, and refuses the name otherwise; the
    weights at ``path`` are what the name must now serve."""
    return {"lora_name": name, "lora_path": str(path), "load_inplace": True}


def _forced_call(text: str) -> list[dict[str, Any]] | None:
    """The tool call a forced reply's JSON (``{"name", "arguments"}``, schema-held by the engine) is;
    None if the engine did not hold to it (then the text stays the reply's content)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)},
        }
    ]
