"""The embedded policy: a transformers causal LM decoded in-process with continuous batching.

:class:`TransformersEngine` runs the policy in-process with **continuous batching**: one engine thread
owns the model and decodes every active request together, one token per step, over a shared KV cache
(left padding + attention mask + explicit position ids per row). A request that arrives while others
are decoding is prefilled on its own and merged into the running batch at the next step boundary; a
finished request is dropped from the batch (its cache rows are removed). Up to ``max_concurrent``
requests decode together; the serving layer keeps a bounded queue in front (429 beyond it). The batch
cache is a :class:`~openclaw_rl.policy.kv_cache.GrowingCache`: a decode step writes its one column
of keys/values into spare room, where transformers' ``DynamicCache`` would copy the whole cache.

Sampling and the recorded log-probs (what PPO's ``logp_old`` is):

* the token is drawn from ``softmax(logits / temperature)`` restricted to the ``top_k`` likeliest
  tokens and the ``top_p`` nucleus and renormalised (``temperature == 0``: the argmax); penalties,
  ``logit_bias`` and a reply's grammar (:mod:`openclaw_rl.policy.guided`) shape the logits first;
* the log-prob recorded and returned is the **model's own** ``log_softmax(logits)`` at that token —
  the very quantity the trainer computes for ``logp_new``. Recording the tempered, truncated
  probability instead would put a different distribution in the ratio's denominator than in its
  numerator: measured on SmolLM2 at temperature 0.7 / top_p 0.9, that mismatch alone left ~40% of
  tokens clipped before the first update. ``top_logprobs`` come from the same model distribution.

Every sampled token is recorded, including an end-of-sequence token and the token that completed a stop
string (the returned *text* excludes both, as OpenAI does); nothing is ever re-tokenised from text.

Weight swaps happen **between** decoding steps, never inside a forward pass; loading and merging the
new weights happens in the caller's thread, off the decoding path, and the copy into the model takes
milliseconds. ``[policy_service] non_blocking`` chooses when:

* ``true`` (default): at the very next step boundary. Nothing waits; in-flight requests
  continue on the new weights for their remaining tokens. Each token's recorded log-prob is still the
  one it was actually sampled with (the behaviour policy PPO's ratio needs); the turn records the
  version it *started* on, so staleness is never under-estimated.
* ``false``: once the running batch has drained. No new request is admitted while the swap is pending,
  in-flight requests finish on the weights they started with, so every response comes from exactly
  one version; new requests wait (never fail) for at most one response's duration.

Either way no request is refused or fails.

**Prefix cache** (``[policy_service] prefix_cache_mb``, 0 = off; see
:mod:`openclaw_rl.policy.prefix_cache`). A prompt whose leading tokens were seen before under the same
weights — the session's previous prompt and response, a system prompt other sessions share — starts
from their cached keys/values and prefills only the rest (always at least its last token, whose logits
are sampled). Rows admitted together that share uncached blocks (sessions starting at once with one
system prompt) do not all prefill them: the later ones wait one step for the first to store them.
Newly admitted rows are prefilled in up to two groups: rows with nothing cached exactly as without the
cache, rows with a cached prefix together, the cached keys/values of each placed right before its own
new tokens (left padding before the cache and between cache and the new tokens, explicit positions);
the group's cache is then compacted so each row's tokens are contiguous and right-aligned, the layout
:class:`_Batch` keeps. After prefill each prompt's blocks are stored; when a row finishes, its
response's too (prompt + response, except the last sampled token which was never fed in) — unless a
weight swap happened while it generated, since its cache then mixes two policies. A swap empties the
cache. The recorded log-probs are unchanged: each is still the model's log-softmax at the sampled token.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import torch

from openclaw_rl.config import Config
from openclaw_rl.policy.engine import Delta, Engine, Final, GenRequest, token_piece
from openclaw_rl.policy.guided import GrammarCompiler, RowGrammar
from openclaw_rl.policy.multi_lora import AdapterTable, ResidentAdapters, read_adapter
from openclaw_rl.policy.prefix_cache import PrefixCache
from openclaw_rl.policy.protocol import APIError
from openclaw_rl.policy.weights import WeightLoadError, check_compatible, load_policy_state

log = logging.getLogger("openclaw_rl.policy")
#: Floor for a reported top log-prob (``-inf`` is not valid JSON).
IMPOSSIBLE = -9999.0


class _Row:
    """One request inside the engine thread."""

    def __init__(self, req: GenRequest, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]):
        self.req = req
        self.loop = loop
        self.queue = queue
        p = req.params
        self.gen: torch.Generator | None = None
        if p.seed is not None and p.temperature > 0:
            self.gen = torch.Generator().manual_seed(p.seed)
        self.prompt = list(req.prompt_ids or [])
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""  # decoded text of ids so far (eos excluded, stop-truncated at the end)
        self.emitted = 0  # characters of text already sent
        self.version = 0
        self.epoch = 0  # the engine's weights epoch when admitted (prefix-cache entries are per epoch)
        self.slot = 0  # per_user mode: the row's adapter slot (0 = the base alone)
        # what the row's keys/values depend on: prefix-cache entries are found only under the same one
        self.scope: tuple[int, str | None, int] = (0, None, 0)
        self.deferred = False  # sent back once to wait for a shared prefix another row is prefilling
        self.cached = 0  # prompt tokens taken from the prefix cache at its prefill
        self.finish: str | None = None
        self.stop_string: str | None = None  # the request's stop string that ended the reply
        self.cancelled = False  # its client went away: dropped at the next step boundary
        self.queued_at = time.monotonic()

    def send(self, event: Delta | Final) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the request's event loop is gone (server shut down); nothing to deliver to
            if not self.cancelled:  # said once per reply, which stops here
                log.info(
                    "[policy_service] shutting down: a reply in progress is dropped (its client is gone)"
                )
            self.cancelled = True


def _stop_holdback(text: str, stops: list[str]) -> int:
    """How many trailing characters might still become a stop string (must not be sent yet)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return hold


class TransformersEngine(Engine):
    """The embedded policy: a transformers causal LM decoded with continuous batching on one thread."""

    backend = "transformers"
    #: Per_user mode: how long a row may wait for an adapter slot before rows that arrived after it
    #: and would keep a slot busy wait behind it (without, a user whose requests overlap holds their
    #: slot forever and the waiting user starves).
    SLOT_WAIT_S = 1.0
    #: The batch cache's kind: ``"growing"`` (:mod:`openclaw_rl.policy.kv_cache`: a decode step writes
    #: its keys/values into spare room) or ``"dynamic"`` (transformers' ``DynamicCache``, which copies
    #: the whole cache every step; kept so ``bench/decode.py`` measures the two side by side).
    cache_kind = "growing"

    def __init__(self, cfg: Config, model: Any = None, tokenizer: Any = None):
        super().__init__(cfg)
        self.pcfg = cfg.policy_service
        self.model = model
        self.tokenizer = tokenizer
        self._cv = threading.Condition()
        self._pending: collections.deque[_Row] = collections.deque()
        self._swap: tuple[dict[str, torch.Tensor], int, threading.Event] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.active_count = 0
        self.cancelled_rows = 0  # rows dropped mid-reply because their client went away
        self.steps = 0
        self.mid_batch_swaps = 0
        self._swap_error: Exception | None = None
        self._died: str | None = None  # why the decoding thread stopped, if it did
        self._epoch = 0  # bumped by every weight swap: prefix-cache entries never cross one
        mb = self.pcfg.prefix_cache_mb
        self._prefix: PrefixCache | None = PrefixCache(mb * 2**20) if mb > 0 else None
        self.prefill_tokens = 0  # prompt tokens actually run through a prefill forward pass
        self._adapters: ResidentAdapters | None = None  # per_user mode (docs/users.md)
        self._adapter_ops: list[tuple[str, Any, int, threading.Event]] = []
        self._grammars: GrammarCompiler | None = None  # made on the first request that needs one
        self._grammars_lock = threading.Lock()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.model is None:
            from openclaw_rl.runtime.models import load_model

            self.model, self.tokenizer = load_model(self.pcfg.model, self.pcfg.device, self.pcfg.dtype)
        from openclaw_rl.runtime.models import resolve_model_dir, stop_token_ids

        self.base_dir = resolve_model_dir(self.pcfg.model)
        self.eos_ids = stop_token_ids(self.tokenizer, getattr(self.model, "generation_config", None))
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        if self.cfg.users.mode == "per_user" and self._adapters is None:
            tr = self.cfg.training
            table = AdapterTable(
                self.model, tr.lora_target_modules, tr.lora_rank, self.cfg.users.max_resident
            )
            self._adapters = ResidentAdapters(table)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="policy-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish every admitted and queued request, then end the engine thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.pcfg.request_timeout_sec)

    # -------------------------------------------------------------- requests
    def prepare(self, req: GenRequest) -> None:
        """The prompt's ids (:meth:`Engine.prepare`), and the grammar the reply is held to when the
        request asks for JSON or forces a tool call (:mod:`openclaw_rl.policy.guided`)."""
        super().prepare(req)
        self._attach_grammar(req)

    def _attach_grammar(self, req: GenRequest) -> None:
        wanted = req.output_grammar
        if wanted is None or req.grammar is not None:
            return
        with self._grammars_lock:
            if self._grammars is None:
                vocab = self.model.get_output_embeddings().weight.shape[0]
                self._grammars = GrammarCompiler(self.tokenizer, vocab, sorted(self.eos_ids))
        compiled = self._grammars.compile(wanted)
        prefix = req.messages[-1].text if req.continue_final else ""
        try:
            req.grammar = RowGrammar(compiled, prefix)
        except ValueError as exc:
            raise APIError(400, f"messages[-1]: {exc}", param="messages") from None

    async def generate(self, req: GenRequest) -> AsyncGenerator[Delta | Final, None]:
        if req.prompt_ids is None:
            self.prepare(req)
        else:  # prepared elsewhere (a replica's driver): the grammar is this engine's to make
            self._attach_grammar(req)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        row = _Row(req, asyncio.get_running_loop(), queue)
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                raise APIError(503, "the policy engine is not running", type_="server_error")
            self._pending.append(row)
            self._cv.notify_all()
        finished = False
        try:
            while True:
                event = await queue.get()
                yield event
                if isinstance(event, Final):
                    finished = True
                    return
        finally:
            if not finished:  # the reader stopped (its client went away): stop decoding for it
                with self._cv:
                    row.cancelled = True
                    self._cv.notify_all()

    def swap_weights(self, path: str | Path, version: int) -> None:
        """Load ``path`` (LoRA adapter or full model) and apply it at a step boundary (see the module
        docstring for ``non_blocking``); blocks until applied. Call after :meth:`start`."""
        state = load_policy_state(path, self.base_dir, getattr(torch, self.pcfg.dtype))
        check_compatible(self.model, state)
        done = threading.Event()
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                self._apply(state, version)
                return
            self._swap = (state, version, done)
            self._cv.notify_all()
        if not done.wait(self.pcfg.request_timeout_sec * 2):
            raise TimeoutError("the engine did not reach a step boundary to apply the new weights")
        error, self._swap_error = self._swap_error, None
        if error is not None:
            raise WeightLoadError(f"applying the weights from {path} failed: {error}") from error

    def swap_adapter(self, user: str, path: str | Path, version: int) -> None:
        """Serve ``user`` with the adapter at ``path`` (version ``version``) from the next step boundary
        on; other users' adapters and the base are untouched. Blocks until applied. Rows of ``user``
        already decoding continue on the new adapter (each token's log-prob is the one it was sampled
        with; the turn keeps the version it started on), as with ``non_blocking`` weight swaps."""
        if self._adapters is None:
            raise WeightLoadError('per-user adapters are served only with [users] mode = "per_user"')
        adapter = read_adapter(path)
        self._adapters.table.check(adapter)
        done = threading.Event()
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                self._adapters.publish(user, adapter, version)
                return
            self._adapter_ops.append((user, adapter, version, done))
            self._cv.notify_all()
        if not done.wait(self.pcfg.request_timeout_sec * 2):
            raise TimeoutError("the engine did not reach a step boundary to apply the adapter")

    def adapter_version(self, user: str) -> int:
        return self._adapters.version(user) if self._adapters is not None else 0

    def forget_adapter(self, user: str) -> None:
        """Drop ``user``'s adapter from memory and from the served set (their slot is zeroed at the
        next step boundary); their next request gets the base. Blocks until applied."""
        if self._adapters is None:
            return
        done = threading.Event()
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                self._adapters.forget(user)
                return
            self._adapter_ops.append((user, None, 0, done))
            self._cv.notify_all()
        if not done.wait(self.pcfg.request_timeout_sec * 2):
            raise TimeoutError("the engine did not reach a step boundary to drop the adapter")

    def stats(self) -> dict[str, Any]:
        """Prefix-cache figures for ``/healthz`` (zeros but the prefill count when the cache is off)."""
        if self._prefix is not None:
            cache = self._prefix.stats()
        else:
            cache = dict.fromkeys(
                (
                    "prefix_cache_bytes",
                    "prefix_cache_max_bytes",
                    "prefix_cache_peak_bytes",
                    "prefix_cache_entries",
                    "prefix_cache_block_tokens",
                    "prefix_cache_hits",
                    "prefix_cache_misses",
                    "prefix_cache_hit_tokens",
                    "prefix_cache_evictions",
                ),
                0,
            )
        extra = self._adapters.stats() if self._adapters is not None else {}
        return {**cache, "prefix_cache_prefill_tokens": self.prefill_tokens, **extra}

    def _apply(self, state: dict[str, torch.Tensor], version: int) -> None:
        # whatever happens below, keys/values cached so far may not belong to the weights that will serve
        self._epoch += 1
        if self._prefix is not None:
            self._prefix.clear()
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)  # keys were checked by check_compatible
        self._version = version
        log.info("[policy_service] weights swapped, policy_version=%d", version)

    # -------------------------------------------------------------- engine thread
    def _loop(self) -> None:
        """The decoding thread. A step's own failure fails its rows and decoding goes on
        (:meth:`_decode_forever`); anything that still stops the thread is said in ``/healthz``, and
        the requests waiting for it get an error now instead of waiting out their timeout."""
        try:
            self._decode_forever()
        except Exception as exc:
            self._died = f"{type(exc).__name__}: {exc}"
            log.exception("[policy_service] the decoding thread stopped")
            with self._cv:
                for r in self._pending:
                    r.send(Final("error", r.prompt, [], [], "", 0, error=f"the engine stopped: {self._died}"))
                self._pending.clear()

    def health_problem(self) -> str | None:
        if self._died is not None:
            return (
                f"the decoding thread stopped ({self._died}); every request gets a 503: restart the service"
            )
        return None

    def _decode_forever(self) -> None:
        torch.set_grad_enabled(False)
        batch: _Batch | None = None
        while True:
            new: list[_Row] = []
            with self._cv:
                active = batch.size if batch else 0
                if self._swap is not None and (active == 0 or self.pcfg.non_blocking):
                    state, version, done = self._swap
                    self._swap = None
                    try:
                        self._apply(state, version)
                        self.mid_batch_swaps += active > 0
                    except (RuntimeError, ValueError) as exc:  # the old weights keep serving
                        self._swap_error = exc
                    done.set()
                self._adapter_ops = [op for op in self._adapter_ops if not self._apply_adapter_op(op, batch)]
                held = {op[0] for op in self._adapter_ops}  # users whose new adapter waits for their rows
                if any(r.cancelled for r in self._pending):
                    self._pending = collections.deque(r for r in self._pending if not r.cancelled)
                if active == 0 and not self._pending:
                    if self._stopping:
                        return
                    self._cv.wait(timeout=0.5)
                    continue
                if self._swap is None and self._pending and active < self.pcfg.max_concurrent:
                    if (
                        active == 0
                        and self.pcfg.batch_wait_ms > 0
                        and len(self._pending) < self.pcfg.max_concurrent
                    ):
                        # an idle engine waits a moment so that a burst of requests shares one prefill
                        self._cv.wait(timeout=self.pcfg.batch_wait_ms / 1000)
                    while self._pending and active + len(new) < self.pcfg.max_concurrent:
                        new.append(self._pending.popleft())
                    if held:  # their rows start once the new adapter is in: one adapter per reply
                        self._pending.extendleft(reversed([r for r in new if r.req.adapter in held]))
                        new = [r for r in new if r.req.adapter not in held]
                    if self._adapters is not None:
                        new = self._assign_slots(new, batch)
                    for r in new:
                        r.epoch = self._epoch
                        if self._adapters is None:
                            r.version = self._version
                        # whose blocks: the adapter's user (per_user), the prompt's owner (shared)
                        who = r.req.adapter if self._adapters is not None else r.req.owner
                        r.scope = (self._epoch, who, r.version)
                    if self._prefix is not None and len(new) > 1:
                        new = self._defer_shared(new)
            self.active_count = active + len(new)
            try:
                if batch is not None and any(r.cancelled for r in batch.rows):
                    for r in batch.rows:
                        if r.cancelled:
                            r.finish = "cancelled"
                            self.cancelled_rows += 1
                    batch = batch.keep_unfinished()
                if new:
                    batch = self._prefill(new, batch)
                if batch is not None and batch.size:
                    batch = self._decode(batch)
            except Exception as exc:  # a failed forward must not kill the service: fail these rows, go on
                log.exception("engine step failed")
                rows = (batch.rows if batch else []) + [
                    r for r in new if batch is None or r not in batch.rows
                ]
                for r in rows:
                    r.send(
                        Final(
                            "error",
                            r.prompt,
                            r.ids,
                            r.logprobs,
                            r.text,
                            r.version,
                            error=f"generation failed: {type(exc).__name__}: {exc}",
                        )
                    )
                batch = None
            self.active_count = batch.size if batch else 0

    def _apply_adapter_op(self, op: tuple[str, Any, int, threading.Event], batch: _Batch | None) -> bool:
        """Apply one queued per-user adapter change (lock held); False: not yet. With
        ``non_blocking = false`` a new adapter waits until none of its user's rows is decoding, as a
        shared swap waits for every row. Either way the user's cached prefixes go: they were
        computed with what they are no longer served (and a deleted user's must not outlive them)."""
        assert self._adapters is not None
        user, adapter, version, done = op
        decoding = batch is not None and any(r.req.adapter == user for r in batch.rows)
        if adapter is not None and decoding and not self.pcfg.non_blocking:
            return False
        if adapter is None:
            self._adapters.forget(user)
        else:
            self._adapters.publish(user, adapter, version)  # checked against the table already
            log.info("[policy_service] adapter of user %s swapped, version=%d", user, version)
        self._drop_cached(user)
        done.set()
        return True

    def _drop_cached(self, user: str) -> None:
        if self._prefix is not None:
            self._prefix.drop(lambda scope: isinstance(scope, tuple) and len(scope) == 3 and scope[1] == user)

    def _assign_slots(self, rows: list[_Row], batch: _Batch | None) -> list[_Row]:
        """Per_user mode: give each new row its user's adapter slot (loading it from disk if it is
        not resident). A row whose adapter has no free slot — every slot holds an adapter an active
        row is decoding with — goes back to the queue's front until one finishes; an adapter that
        fails to load fails its row only. Called with the lock held."""
        assert self._adapters is not None
        busy = {r.slot for r in batch.rows} if batch is not None else set()
        kept: list[_Row] = []
        later: list[_Row] = []
        starved = False  # a row waited past SLOT_WAIT_S for a slot: later rows holding slots queue behind it
        for r in rows:
            if starved and r.req.adapter in self._adapters.slot_of:
                # a resident user's new row would keep their slot busy, and the waiting user waiting
                # for as long as that user's requests overlap
                later.append(r)
                continue
            if self._adapters.removed(r.req.adapter):  # `users delete` took their folder
                assert r.req.adapter is not None
                self._adapters.forget(r.req.adapter)
                self._drop_cached(r.req.adapter)
            try:
                got = self._adapters.acquire(r.req.adapter, busy)
            except WeightLoadError as exc:
                log.error("[policy_service] adapter of user %s: %s", r.req.adapter, exc)
                r.send(
                    Final("error", r.prompt, [], [], "", 0, error=f"the user's adapter failed to load: {exc}")
                )
                continue
            if got is None:
                later.append(r)
                starved = starved or time.monotonic() - r.queued_at >= self.SLOT_WAIT_S
                continue
            r.slot, r.version = got
            busy.add(r.slot)
            kept.append(r)
        self._pending.extendleft(reversed(later))
        return kept

    def _use_slots(self, rows: list[_Row]) -> None:
        if self._adapters is not None:
            self._adapters.table.use([r.slot for r in rows])

    def cache_scope(
        self, adapter: str | None = None, owner: str | None = None
    ) -> tuple[int, str | None, int]:
        """The prefix-cache scope a new row gets now (see :mod:`prefix_cache`): per_user, of
        ``adapter``'s user; shared, of the prompt's ``owner`` (a user's blocks are theirs in both)."""
        if self._adapters is None:
            return (self._epoch, owner, self._version)
        return (self._epoch, adapter, self._adapters.version(adapter))

    def _current_scope(self, r: _Row) -> tuple[int, str | None, int]:
        """The scope a row would get now: unlike its own once a swap happened while it decoded."""
        return self.cache_scope(r.req.adapter, r.req.owner)

    def new_cache(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        """An empty batch cache, or one holding ``kv`` (one ``(keys, values)`` pair per layer)."""
        if self.cache_kind == "dynamic":
            from transformers import DynamicCache

            return DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        from openclaw_rl.policy.kv_cache import GrowingCache

        return GrowingCache(kv)

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any):
        # transformers >= 5.24 names the cache argument ``cache``; older versions ``past_key_values``
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: cache},
        )
        new_cache = getattr(out, "cache", None)
        # sampling runs on the CPU (per-request seeded generators are CPU generators)
        logits = out.logits[:, -1, :].float().cpu()
        return logits, new_cache if new_cache is not None else out.past_key_values

    def _defer_shared(self, rows: list[_Row]) -> list[_Row]:
        """Send back to the queue's front each row that shares at least one block more than it has
        cached with an earlier row of this admission: that row's prefill stores the blocks, so at the next
        step boundary the deferred row prefills only the rest — sessions starting together with one system
        prompt prefill it once. A row waits at most once. Called with the lock held."""
        assert self._prefix is not None
        bt = self._prefix.block_tokens
        kept: list[_Row] = []
        later: list[_Row] = []
        for r in rows:
            if not r.deferred:
                n = self._prefix.cached_tokens(r.prompt, r.scope) + bt
                if n < len(r.prompt) and any(
                    k.scope == r.scope and k.prompt[:n] == r.prompt[:n] for k in kept
                ):
                    r.deferred = True
                    later.append(r)
                    continue
            kept.append(r)
        self._pending.extendleft(reversed(later))
        return kept

    def _prefill(self, rows: list[_Row], batch: _Batch | None) -> _Batch:
        groups = [rows]
        hits: dict[int, list[Any]] = {}
        if self._prefix is not None:
            hits = {id(r): self._prefix.match(r.prompt, r.scope) for r in rows}
            # rows with nothing cached apart from rows with a cached prefix: one group mixing a long
            # uncached prompt with a long cached prefix would pad every row to the sum of both
            groups = [
                g for g in ([r for r in rows if not hits[id(r)]], [r for r in rows if hits[id(r)]]) if g
            ]
        for group in groups:
            fresh = self._prefill_group(group, [hits.get(id(r), []) for r in group])
            if batch is None or batch.size == 0:
                batch = fresh
            elif fresh.size:  # else every row of this group finished on its first token
                batch = batch.merge(fresh)
        assert batch is not None
        return batch

    def _prefill_group(self, rows: list[_Row], blocks: list[list[Any]]) -> _Batch:
        """Prefill ``rows`` (each after its cached ``blocks``, if any) and sample their first tokens."""
        pad = self.tokenizer.pad_token_id
        dev = self.pcfg.device
        bt = self._prefix.block_tokens if self._prefix is not None else 0
        cached = [len(b) * bt for b in blocks]
        for r, c in zip(rows, cached, strict=True):
            r.cached = c
        c_max = max(cached, default=0)
        if c_max == 0:
            width = max(len(r.prompt) for r in rows)
            ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in rows], device=dev)
            mask = torch.tensor(
                [[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in rows], device=dev
            )
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            self._use_slots(rows)
            logits, cache = self._forward(ids, mask, positions, self.new_cache())
        else:
            # columns: [pad | cached prefix] (c_max wide, in the cache) then [pad | new tokens] (the input)
            new = [r.prompt[c:] for r, c in zip(rows, cached, strict=True)]
            width = max(len(t) for t in new)
            ids = torch.tensor([[pad] * (width - len(t)) + t for t in new], device=dev)
            mask = torch.tensor(
                [
                    [0] * (c_max - c) + [1] * c + [0] * (width - len(t)) + [1] * len(t)
                    for c, t in zip(cached, new, strict=True)
                ],
                device=dev,
            )
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, c_max:]
            self._use_slots(rows)
            logits, cache = self._forward(ids, mask, positions, self._cached_kv(blocks, c_max))
            if any(len(t) < width for t in new):  # padding between a cached prefix and its new tokens
                mask = _compact(mask, cache)
        self.prefill_tokens += sum(len(r.prompt) - c for r, c in zip(rows, cached, strict=True))
        fresh = _Batch(
            rows,
            cache,
            mask,
            torch.tensor([len(r.prompt) for r in rows], device=dev),
            torch.zeros(len(rows), dtype=torch.long, device=dev),
        )
        self._sample(fresh, logits)
        if self._prefix is not None:  # after sampling: the first tokens are on their way meanwhile
            for i, r in enumerate(rows):
                self._store(fresh, i, r.prompt)
        return fresh.keep_unfinished()

    def _cached_kv(self, blocks: list[list[Any]], width: int) -> Any:
        """A batch cache ``width`` columns wide holding each row's cached blocks right-aligned."""
        bt = self._prefix.block_tokens if self._prefix is not None else 0
        first = next(b for row in blocks for b in row).kv  # [2 * layers, heads, bt, dim]
        kv = first.new_zeros((first.shape[0], len(blocks), first.shape[1], width, first.shape[3]))
        for i, row in enumerate(blocks):
            start = width - len(row) * bt
            for j, block in enumerate(row):
                kv[:, i, :, start + j * bt : start + (j + 1) * bt] = block.kv
        return self.new_cache([(kv[2 * n], kv[2 * n + 1]) for n in range(first.shape[0] // 2)])

    def _store(self, batch: _Batch, i: int, tokens: list[int]) -> None:
        """Put the keys/values of ``tokens`` — row ``i``'s, right-aligned in the batch cache — in the
        prefix cache (only the blocks it does not hold yet are copied)."""
        assert self._prefix is not None
        n = len(tokens)
        if n < self._prefix.block_tokens or n > batch.mask.shape[1]:
            return
        if int(batch.mask[i].sum()) != n or not bool(batch.mask[i, -n:].all()):
            log.warning("prefix cache: a row's cache is not laid out as expected; not stored")
            return
        start = batch.mask.shape[1] - n
        layers = batch.cache.layers

        def kv_of(a: int, b: int) -> torch.Tensor:
            return torch.stack(
                [t[i, :, start + a : start + b] for layer in layers for t in (layer.keys, layer.values)]
            )

        try:
            self._prefix.insert(tokens, batch.rows[i].scope, kv_of)
        except (
            RuntimeError,
            ValueError,
        ):  # e.g. out of memory: the cache is an optimisation, serving goes on
            log.exception("prefix cache: storing failed")

    def _decode(self, batch: _Batch) -> _Batch:
        batch.mask = torch.cat(
            [batch.mask, torch.ones(batch.size, 1, dtype=batch.mask.dtype, device=batch.mask.device)], dim=1
        )
        self._use_slots(batch.rows)
        logits, batch.cache = self._forward(
            batch.last[:, None], batch.mask, batch.positions[:, None], batch.cache
        )
        batch.positions = batch.positions + 1
        self._sample(batch, logits)
        self.steps += 1
        if self._prefix is not None:
            for i, r in enumerate(batch.rows):
                # a row that straddled a weight swap holds keys/values of two policies: store nothing
                if r.finish is not None and r.scope == self._current_scope(r):
                    self._store(batch, i, r.prompt + r.ids[:-1])  # the last token was never fed in
        return batch.keep_unfinished()

    def _sample(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Draw one token per row, record its log-prob, stream it, finish rows that are done."""
        rows = batch.rows
        temps = torch.tensor(
            [r.req.params.temperature if r.req.params.temperature > 0 else 1.0 for r in rows]
        )
        model_logp = torch.log_softmax(logits, dim=-1)  # what is recorded (see the module docstring)
        penalised = [i for i, r in enumerate(rows) if r.req.params.penalised and r.ids]
        biased = [i for i, r in enumerate(rows) if r.req.params.logit_bias]
        guided = [i for i, r in enumerate(rows) if r.req.grammar is not None]
        if penalised or biased or guided:
            # penalties, biases and grammars shape what is drawn; the recorded log-prob stays the model's
            logits = logits.clone()
            for i in penalised:
                p = rows[i].req.params
                counts = torch.bincount(torch.tensor(rows[i].ids), minlength=logits.shape[-1])
                counts = counts[: logits.shape[-1]].to(logits.dtype)
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
            for i in biased:
                bias = rows[i].req.params.logit_bias
                logits[i, list(bias)] += torch.tensor(list(bias.values()), dtype=logits.dtype)
            for i in guided:
                grammar = rows[i].req.grammar
                assert grammar is not None
                grammar.mask(logits[i])
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # what is sampled from
        toks: list[int | None] = [None] * len(rows)
        plain: list[int] = []  # rows sampled with the shared generator, in one multinomial call
        for i, row in enumerate(rows):
            p = row.req.params
            if p.temperature <= 0:
                toks[i] = int(torch.argmax(logp[i]).item())
                continue
            if 0 < p.top_k < logp.shape[-1]:
                kth = torch.topk(logp[i], p.top_k).values[-1]
                row_lp = logp[i].masked_fill(logp[i] < kth, float("-inf"))
                logp[i] = row_lp - torch.logsumexp(row_lp, 0)
            if p.top_p < 1.0:
                sorted_lp, order = torch.sort(logp[i], descending=True)
                before = torch.cumsum(sorted_lp.exp(), 0) - sorted_lp.exp()
                drop = order[before >= p.top_p]  # the first token always stays
                row_lp = logp[i].clone()
                row_lp[drop] = float("-inf")
                logp[i] = row_lp - torch.logsumexp(row_lp, 0)
            if row.gen is not None:
                toks[i] = int(torch.multinomial(logp[i].exp(), 1, generator=row.gen).item())
            else:
                plain.append(i)
        if plain:
            drawn = torch.multinomial(logp[plain].exp(), 1).squeeze(1).tolist()
            for i, t in zip(plain, drawn, strict=True):
                toks[i] = int(t)
        limit = self.pcfg.max_model_len
        for i, row in enumerate(rows):
            tok = toks[i]
            assert tok is not None
            lp = float(model_logp[i, tok].item())
            top = None
            k = row.req.params.top_logprobs
            if k:
                vals, idx = torch.topk(model_logp[i], k)
                top = [
                    [
                        (token_piece(self.tokenizer, int(j)), max(float(v), IMPOSSIBLE))
                        for v, j in zip(vals, idx, strict=True)
                    ]
                ]
            if row.req.grammar is not None and not row.req.grammar.accept(tok):
                log.error("a guided reply drew token %d its grammar does not allow; it goes on unguided", tok)
                row.req.grammar = None
            row.ids.append(tok)
            row.logprobs.append(lp)
            self._advance(row, tok, lp, top, limit)
        batch.last = torch.tensor(toks, device=batch.mask.device)

    def _advance(self, row: _Row, tok: int, lp: float, top: Any, limit: int) -> None:
        p = row.req.params
        before = len(row.text)  # the reply's text up to the previous token
        cut_before = False
        piece = token_piece(self.tokenizer, tok)  # its log-prob entry's text; "bytes:..." mid-character
        if tok in self.eos_ids:
            row.finish = "stop"
            cut_before = True  # the end token is no text of the reply: no log-prob entry, as OpenAI
        else:
            row.text = self.tokenizer.decode(
                [t for t in row.ids if t not in self.eos_ids],
                skip_special_tokens=True,
                clean_up_tokenization_spaces=False,
            )
            for s in p.stop:
                at = row.text.find(s, max(0, row.emitted - len(s)))
                if at >= 0:
                    row.text = row.text[:at]
                    row.finish, row.stop_string = "stop", s
                    cut_before = at <= before  # this token adds nothing to the reply
                    break
        if row.finish is None and (len(row.ids) >= p.max_tokens or len(row.prompt) + len(row.ids) >= limit):
            row.finish = "length"
            if row.text.endswith("\ufffd") and piece.startswith("bytes:"):
                # cut inside a multi-byte character: the reply ends before it, not in a U+FFFD
                row.text = row.text.rstrip("\ufffd")
                row.emitted = min(row.emitted, len(row.text))
        if row.finish is None:
            # half of a multi-byte character (a trailing U+FFFD) waits for the rest, and is no part of
            # the text a stop string may be beginning in: "美丽英" + half of "国" holds "美丽英" back
            whole = row.text.rstrip("\ufffd")
            safe = len(whole) - _stop_holdback(whole, p.stop)
        else:
            safe = len(row.text)
        chunk = row.text[row.emitted : safe] if safe > row.emitted else ""
        row.emitted = max(row.emitted, safe)
        row.send(Delta(chunk, [tok], [lp], [piece], top, beyond_reply=cut_before))
        if row.finish is not None:
            row.send(
                Final(
                    row.finish,
                    row.prompt,
                    list(row.ids),
                    list(row.logprobs),
                    row.text,
                    row.version,
                    stop_string=row.stop_string,
                    cached_tokens=row.cached,
                )
            )


def _compact(mask: torch.Tensor, cache: Any) -> torch.Tensor:
    """Move each row's tokens (``mask`` ones, in order) to the right end of a cache as wide as the longest
    row; return the new mask (zeros, then ones). The padding left of a row points at one of its own columns
    (finite values, masked out)."""
    n = mask.shape[0]
    lengths = mask.sum(dim=1)
    width = int(lengths.max().item())
    idx = torch.empty(n, width, dtype=torch.long, device=mask.device)
    for i in range(n):
        cols = mask[i].nonzero().squeeze(1)
        idx[i, width - len(cols) :] = cols
        idx[i, : width - len(cols)] = cols[0]
    for layer in cache.layers:
        k = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        layer.keys = layer.keys.gather(2, k)
        layer.values = layer.values.gather(2, k)
    return (torch.arange(width, device=mask.device)[None, :] >= (width - lengths)[:, None]).to(mask.dtype)


class _Batch:
    """The running batch: rows, their shared KV cache, attention mask, next positions, last tokens.

    Invariant between steps: the cache holds every token of every row except its last sampled one
    (``last``), which the next decode step feeds in.
    """

    def __init__(
        self, rows: list[_Row], cache: Any, mask: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
    ):
        self.rows = rows
        self.cache = cache
        self.mask = mask
        self.positions = positions
        self.last = last

    @property
    def size(self) -> int:
        return len(self.rows)

    def keep_unfinished(self) -> _Batch:
        keep = [i for i, r in enumerate(self.rows) if r.finish is None]
        if len(keep) == len(self.rows):
            return self
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            return self
        idx = torch.tensor(keep, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.positions = self.positions[idx]
        self.last = self.last[idx]
        # drop leading columns that are padding for every remaining row
        cols = self.mask.any(dim=0).nonzero()
        start = int(cols[0].item()) if len(cols) else 0
        if start > 0:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, start:]
                layer.values = layer.values[:, :, start:]
        return self

    def merge(self, other: _Batch) -> _Batch:
        """Append ``other``'s rows, left-padding the shorter cache so both share one length."""
        t_self, t_other = self.mask.shape[1], other.mask.shape[1]
        width = max(t_self, t_other)

        def lpad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
            if n == 0:
                return x
            shape = list(x.shape)
            shape[dim] = n
            return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([lpad(mine.keys, width - t_self, 2), lpad(theirs.keys, width - t_other, 2)])
            mine.values = torch.cat(
                [lpad(mine.values, width - t_self, 2), lpad(theirs.values, width - t_other, 2)]
            )
        self.mask = torch.cat([lpad(self.mask, width - t_self, 1), lpad(other.mask, width - t_other, 1)])
        self.positions = torch.cat([self.positions, other.positions])
        self.last = torch.cat([self.last, other.last])
        self.rows = self.rows + other.rows
        return self
