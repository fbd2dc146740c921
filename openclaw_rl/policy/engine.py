"""Generation engines: the interface the serving layer talks to, and the embedded transformers engine.

:class:`TransformersEngine` runs the policy in-process with **continuous batching**: one engine thread
owns the model and decodes every active request together, one token per step, over a shared KV cache
(left padding + attention mask + explicit position ids per row). A request that arrives while others
are decoding is prefilled on its own and merged into the running batch at the next step boundary; a
finished request is dropped from the batch (its cache rows are removed). Up to ``max_concurrent``
requests decode together; the serving layer keeps a bounded queue in front (429 beyond it).

Sampling and the recorded log-probs (what PPO's ``logp_old`` is):

* the token is drawn from ``softmax(logits / temperature)`` restricted to the ``top_p`` nucleus and
  renormalised (``temperature == 0``: the argmax);
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

* ``true`` (default, SPEC §3): at the very next step boundary. Nothing waits; in-flight requests
  continue on the new weights for their remaining tokens. Each token's recorded log-prob is still the
  one it was actually sampled with (the behaviour policy PPO's ratio needs); the turn records the
  version it *started* on, so staleness is never under-estimated.
* ``false``: once the running batch has drained. No new request is admitted while the swap is pending,
  in-flight requests finish on the weights they started with, so every response comes from exactly
  one version; new requests wait (never fail) for at most one response's duration.

Either way no request is refused or fails.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from openclaw_rl.config import Config
from openclaw_rl.policy.protocol import APIError, ChatMessage, ToolDef
from openclaw_rl.policy.tools import template_messages

log = logging.getLogger("openclaw_rl.policy")
IMPOSSIBLE = -9999.0


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0


@dataclass
class GenRequest:
    """One generation, already validated by the serving layer."""

    messages: list[ChatMessage]
    tools: list[ToolDef] | None
    params: SamplingParams
    max_tokens_given: bool = False
    prompt_ids: list[int] | None = None  # filled by Engine.prepare when the engine tokenises locally
    tool_choice: Any = None
    session_id: str | None = None  # set by serving once the session is known (replicas route by it)


@dataclass
class Delta:
    """Newly sampled tokens and the text they completed (text may lag tokens at a UTF-8 boundary)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    top: list[list[tuple[str, float]]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # forwarded engines that parse tool calls themselves


@dataclass
class Final:
    """The end of a generation: everything a Turn needs."""

    finish_reason: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    policy_version: int
    tool_calls: list[dict[str, Any]] | None = None
    ids_exact: bool = True
    error: str | None = None


class WeightLoadError(ValueError):
    """A weight directory that cannot be applied to the serving model; says why."""


class Engine(ABC):
    """What the serving layer needs from a generation backend."""

    backend: str = "?"

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model_name = cfg.policy_service.model
        self.tokenizer: Any = None
        self._prep_tokenizer: Any = None
        self._prep_lock = threading.Lock()
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def set_initial_version(self, version: int) -> None:
        self._version = version

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def generate(self, req: GenRequest) -> AsyncIterator[Delta | Final]: ...

    @abstractmethod
    def swap_weights(self, path: str | Path, version: int) -> None: ...

    def stats(self) -> dict[str, Any]:
        """Backend-specific fields for ``/healthz`` (none by default)."""
        return {}

    def prepare(self, req: GenRequest) -> None:
        """Tokenise the prompt with the chat template (when a tokenizer is available) and check that
        prompt + max_tokens fits ``max_model_len``; raises :class:`APIError` 400 otherwise."""
        if self.tokenizer is None:
            return
        limit = self.cfg.policy_service.max_model_len
        with self._prep_lock:
            if self._prep_tokenizer is None:
                # Requests are tokenised on worker threads while the engine thread decodes; a Rust fast
                # tokenizer must not be used from two threads at once, so preparation has its own copy.
                self._prep_tokenizer = copy.deepcopy(self.tokenizer)
            text = self._prep_tokenizer.apply_chat_template(
                template_messages(req.messages, req.tools if req.tool_choice != "none" else None),
                add_generation_prompt=True, tokenize=False)
            ids = self._prep_tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= limit:
            raise APIError(400, f"messages: the prompt is {len(ids)} tokens, which leaves no room to generate "
                           f"within max_model_len = {limit}; shorten the conversation", param="messages",
                           code="context_length_exceeded")
        room = limit - len(ids)
        if req.max_tokens_given and req.params.max_tokens > room:
            raise APIError(400, f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({req.params.max_tokens}) "
                           f"exceeds max_model_len = {limit}; ask for at most {room}", param="max_tokens",
                           code="context_length_exceeded")
        req.params.max_tokens = min(req.params.max_tokens, room)
        req.prompt_ids = ids


# ------------------------------------------------------------------------------ weights
def load_policy_state(path: str | Path, base_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The full state dict described by ``path``: a peft LoRA adapter directory (merged into a fresh
    copy of the base model) or a full Hugging Face model directory."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not p.is_dir():
        raise WeightLoadError(f"path: {p} is not a directory (expected the output of export_policy)")
    if (p / "adapter_config.json").is_file():
        merged_fast = merge_lora_from_disk(p, base_dir, dtype)
        if merged_fast is not None:
            return merged_fast
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
        try:
            merged = PeftModel.from_pretrained(base, p).merge_and_unload()
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise WeightLoadError(f"path: {p} holds a LoRA adapter that does not fit the base model "
                                  f"{base_dir}: {exc}") from exc
        return merged.state_dict()
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin")):
        try:
            return AutoModelForCausalLM.from_pretrained(p, dtype=dtype).state_dict()
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise WeightLoadError(f"path: {p} is not a loadable model directory: {exc}") from exc
    raise WeightLoadError(f"path: {p} has neither adapter_config.json (LoRA adapter) nor config.json + "
                          "*.safetensors (full model)")


LORA_SUFFIX_A = ".lora_A.weight"


def merge_lora_from_disk(adapter: Path, base_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """Merged weights of just the LoRA-adapted matrices: ``W = W_base + (alpha / r) * B @ A``.

    Why: a swap happens every few training steps while requests are being decoded in the same
    process. Re-loading the whole base model and merging through peft costs seconds of CPU and
    stalls decoding; reading only the adapted matrices from the base safetensors (memory-mapped)
    and adding a rank-r product costs a fraction of that. Returns None for adapters this fast path
    does not cover (rank patterns, DoRA, bias or modules_to_save), which then take the peft path.
    The partial state dict is complete for a swap because every adapter of a run adapts the same
    matrices and leaves all others at their base values.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    conf = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    if (conf.get("rank_pattern") or conf.get("alpha_pattern") or conf.get("use_dora")
            or conf.get("modules_to_save") or conf.get("bias", "none") != "none"):
        return None
    files = sorted(adapter.glob("adapter_model*.safetensors"))
    shards = sorted(base_dir.glob("*.safetensors"))
    if len(files) != 1 or not shards:
        return None
    r = int(conf["r"])
    scale = float(conf["lora_alpha"]) / (r ** 0.5 if conf.get("use_rslora") else r)
    lora = load_file(str(files[0]))
    where: dict[str, Path] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as fh:
            where.update({k: shard for k in fh.keys()})
    merged: dict[str, torch.Tensor] = {}
    for key_a, a in lora.items():
        if not key_a.endswith(LORA_SUFFIX_A):
            continue
        prefix = key_a[: -len(LORA_SUFFIX_A)]
        b = lora.get(prefix + ".lora_B.weight")
        name = prefix.removeprefix("base_model.model.") + ".weight"
        if b is None or name not in where:
            return None
        with safe_open(str(where[name]), framework="pt") as fh:
            w = fh.get_tensor(name).float()
        merged[name] = (w + scale * (b.float() @ a.float())).to(dtype)
    return merged or None


def check_compatible(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Refuse a state dict whose keys or shapes differ from the serving model's (before the swap).
    A LoRA merge carries only the adapted matrices: its keys must be a subset of the model's."""
    own = model.state_dict()
    partial = len(state) < len(own) and all(k.endswith(".weight") for k in state)
    missing = [] if partial else sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or extra or shapes:
        raise WeightLoadError(f"weights do not match the serving model: missing {missing[:3]}, "
                              f"unexpected {extra[:3]}, wrong shape {shapes[:3]}")


# ------------------------------------------------------------------------------ embedded engine
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
        self.text = ""        # decoded text of ids so far (eos excluded, stop-truncated at the end)
        self.emitted = 0      # characters of text already sent
        self.version = 0
        self.finish: str | None = None

    def send(self, event: Delta | Final) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the request's event loop is gone (server shut down); nothing to deliver to
            log.warning("dropping an event for a request whose event loop has closed")


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
        self.steps = 0
        self.mid_batch_swaps = 0
        self._swap_error: Exception | None = None

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.model is None:
            from openclaw_rl.runtime.models import load_model

            self.model, self.tokenizer = load_model(self.pcfg.model, self.pcfg.device, self.pcfg.dtype)
        from openclaw_rl.runtime.models import resolve_model_dir

        self.base_dir = resolve_model_dir(self.pcfg.model)
        eos = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, list) else ({gen_eos} if gen_eos is not None else set())
        self.eos_ids = {e for e in eos if e is not None}
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
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
    async def generate(self, req: GenRequest) -> AsyncIterator[Delta | Final]:
        if req.prompt_ids is None:
            self.prepare(req)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        row = _Row(req, asyncio.get_running_loop(), queue)
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                raise APIError(503, "the policy engine is not running", type_="server_error")
            self._pending.append(row)
            self._cv.notify_all()
        while True:
            event = await queue.get()
            yield event
            if isinstance(event, Final):
                return

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

    def _apply(self, state: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)  # keys were checked by check_compatible
        self._version = version
        log.info("[policy_service] weights swapped, policy_version=%d", version)

    # -------------------------------------------------------------- engine thread
    def _loop(self) -> None:
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
                if active == 0 and not self._pending:
                    if self._stopping:
                        return
                    self._cv.wait(timeout=0.5)
                    continue
                if self._swap is None and self._pending and active < self.pcfg.max_concurrent:
                    if active == 0 and self.pcfg.batch_wait_ms > 0 and len(self._pending) < self.pcfg.max_concurrent:
                        # an idle engine waits a moment so that a burst of requests shares one prefill
                        self._cv.wait(timeout=self.pcfg.batch_wait_ms / 1000)
                    while self._pending and active + len(new) < self.pcfg.max_concurrent:
                        new.append(self._pending.popleft())
            self.active_count = active + len(new)
            try:
                if new:
                    for r in new:
                        r.version = self._version
                    batch = self._prefill(new, batch)
                if batch is not None and batch.size:
                    batch = self._decode(batch)
            except Exception as exc:  # a failed forward must not kill the service: fail these rows, go on
                log.exception("engine step failed")
                rows = (batch.rows if batch else []) + [r for r in new if batch is None or r not in batch.rows]
                for r in rows:
                    r.send(Final("error", r.prompt, r.ids, r.logprobs, r.text, r.version,
                                 error=f"generation failed: {type(exc).__name__}: {exc}"))
                batch = None
            self.active_count = batch.size if batch else 0

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any):
        # transformers >= 5.24 names the cache argument ``cache``; older versions ``past_key_values``
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
        new_cache = getattr(out, "cache", None)
        # sampling runs on the CPU (per-request seeded generators are CPU generators)
        logits = out.logits[:, -1, :].float().cpu()
        return logits, new_cache if new_cache is not None else out.past_key_values

    def _prefill(self, rows: list[_Row], batch: _Batch | None) -> _Batch:
        from transformers import DynamicCache

        width = max(len(r.prompt) for r in rows)
        pad = self.tokenizer.pad_token_id
        dev = self.pcfg.device
        ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in rows], device=dev)
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in rows], device=dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, positions, DynamicCache())
        fresh = _Batch(rows, cache, mask, torch.tensor([len(r.prompt) for r in rows], device=dev),
                       torch.zeros(len(rows), dtype=torch.long, device=dev))
        self._sample(fresh, logits)
        fresh = fresh.keep_unfinished()
        if batch is None or batch.size == 0:
            return fresh
        if fresh.size == 0:  # every new row finished on its first token
            return batch
        return batch.merge(fresh)

    def _decode(self, batch: _Batch) -> _Batch:
        batch.mask = torch.cat([batch.mask, torch.ones(batch.size, 1, dtype=batch.mask.dtype,
                                                       device=batch.mask.device)], dim=1)
        logits, batch.cache = self._forward(batch.last[:, None], batch.mask, batch.positions[:, None], batch.cache)
        batch.positions = batch.positions + 1
        self._sample(batch, logits)
        self.steps += 1
        return batch.keep_unfinished()

    def _sample(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Draw one token per row, record its log-prob, stream it, finish rows that are done."""
        rows = batch.rows
        temps = torch.tensor([r.req.params.temperature if r.req.params.temperature > 0 else 1.0 for r in rows])
        model_logp = torch.log_softmax(logits, dim=-1)  # what is recorded (see the module docstring)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # what is sampled from
        toks: list[int | None] = [None] * len(rows)
        plain: list[int] = []  # rows sampled with the shared generator, in one multinomial call
        for i, row in enumerate(rows):
            p = row.req.params
            if p.temperature <= 0:
                toks[i] = int(torch.argmax(logp[i]).item())
                continue
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
                top = [[(self.tokenizer.decode([int(j)]), max(float(v), IMPOSSIBLE))
                        for v, j in zip(vals, idx, strict=True)]]
            row.ids.append(tok)
            row.logprobs.append(lp)
            self._advance(row, tok, lp, top, limit)
        batch.last = torch.tensor(toks, device=batch.mask.device)

    def _advance(self, row: _Row, tok: int, lp: float, top: Any, limit: int) -> None:
        p = row.req.params
        if tok in self.eos_ids:
            row.finish = "stop"
        else:
            row.text = self.tokenizer.decode([t for t in row.ids if t not in self.eos_ids],
                                             skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for s in p.stop:
                at = row.text.find(s, max(0, row.emitted - len(s)))
                if at >= 0:
                    row.text = row.text[:at]
                    row.finish = "stop"
                    break
        if row.finish is None and (len(row.ids) >= p.max_tokens or len(row.prompt) + len(row.ids) >= limit):
            row.finish = "length"
        if row.finish is None:
            safe = len(row.text) - _stop_holdback(row.text, p.stop)
            if row.text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                safe = min(safe, len(row.text) - 1)
        else:
            safe = len(row.text)
        chunk = row.text[row.emitted:safe] if safe > row.emitted else ""
        row.emitted = max(row.emitted, safe)
        row.send(Delta(chunk, [tok], [lp], [self.tokenizer.decode([tok])], top))
        if row.finish is not None:
            row.send(Final(row.finish, row.prompt, list(row.ids), list(row.logprobs), row.text, row.version))


class _Batch:
    """The running batch: rows, their shared KV cache, attention mask, next positions, last tokens.

    Invariant between steps: the cache holds every token of every row except its last sampled one
    (``last``), which the next decode step feeds in.
    """

    def __init__(self, rows: list[_Row], cache: Any, mask: torch.Tensor, positions: torch.Tensor,
                 last: torch.Tensor):
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
            mine.values = torch.cat([lpad(mine.values, width - t_self, 2), lpad(theirs.values, width - t_other, 2)])
        self.mask = torch.cat([lpad(self.mask, width - t_self, 1), lpad(other.mask, width - t_other, 1)])
        self.positions = torch.cat([self.positions, other.positions])
        self.last = torch.cat([self.last, other.last])
        self.rows = self.rows + other.rows
        return self


def build_engine(cfg: Config) -> Engine:
    """The engine named by ``[policy_service] backend``."""
    if cfg.policy_service.backend == "transformers":
        if cfg.policy_service.num_engines > 1:
            from openclaw_rl.policy.replicas import ReplicatedEngine

            return ReplicatedEngine(cfg)
        return TransformersEngine(cfg)
    from openclaw_rl.policy.forward import ForwardEngine

    return ForwardEngine(cfg)


def wall() -> float:
    return time.perf_counter()
