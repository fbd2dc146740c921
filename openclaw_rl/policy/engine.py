"""The generation-engine interface the serving layer talks to, and the data that crosses it.

An :class:`Engine` turns a validated :class:`GenRequest` into a stream of :class:`Delta` events ending
in one :class:`Final`, and swaps policy weights on request. Implementations:

* :class:`~openclaw_rl.policy.transformers_engine.TransformersEngine`, the embedded policy decoded
  in-process with continuous batching;
* :class:`~openclaw_rl.policy.forward.ForwardEngine`, which forwards to an SGLang / vLLM server;
* :class:`~openclaw_rl.policy.replicas.ReplicatedEngine`, several embedded engines as Ray actors.

Which one runs is decided once, by :func:`openclaw_rl.policy.server.build_engine`.
"""

from __future__ import annotations

import copy
import functools
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.policy.guided import OutputGrammar, RowGrammar, output_grammar
from openclaw_rl.policy.protocol import APIError, ChatMessage, ContextLengthExceeded, ResponseFormat, ToolDef
from openclaw_rl.runtime import chat_format


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # only the k likeliest tokens may be drawn; 0 = all
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    #: OpenAI's: a token's logit is lowered by ``frequency_penalty`` per time the reply has already
    #: generated it, and by ``presence_penalty`` once if it has at all (before temperature).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: OpenAI's ``logit_bias``: token id -> added to that token's logit before sampling
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def penalised(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


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
    adapter: str | None = None  # per_user mode: the user whose adapter decodes this request
    #: whose words the prompt is: a prefix-cache block is found only by its owner's requests (the
    #: cache's hit counts, and its speed, would otherwise tell one user what another wrote)
    owner: str | None = None
    continue_final: bool = False  # the last (assistant) message is the reply's start, to continue
    response_format: ResponseFormat | None = None
    #: the reply's grammar, when its format is enforced here (set by an engine that decodes locally)
    grammar: RowGrammar | None = None

    @functools.cached_property
    def output_grammar(self) -> OutputGrammar | None:
        """What the reply must be (JSON, a forced tool call), None for free text."""
        return output_grammar(self.response_format, self.tools, self.tool_choice)

    @functools.cached_property
    def wire_messages(self) -> list[dict[str, Any]]:
        """The messages as the request sent them (what a :class:`~openclaw_rl.types.Turn` records);
        made once, for the prompt and for the record."""
        return [m.model_dump(exclude_none=True) for m in self.messages]

    @functools.cached_property
    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools the prompt describes: none under ``tool_choice = "none"``."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


@dataclass
class Delta:
    """Newly sampled tokens and the text they completed (text may lag tokens at a UTF-8 boundary)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    tokens: list[str]
    top: list[list[tuple[str, float]]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # forwarded engines that parse tool calls themselves
    # the tokens hold nothing of the reply: a stop string the reply was cut before (their ids are
    # the policy's sample and are recorded; their log-probs are not shown beside the reply's text)
    beyond_reply: bool = False


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE vocabularies (GPT-2's, SmolLM2's, Qwen's) spell each byte as one printable
    character: bytes that print as themselves keep their character, the other 68 take the code
    points from 256 on, in byte order. Returns character -> byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    spelled, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelled[chr(byte)] = byte
        else:
            spelled[chr(256 + extra)] = byte
            extra += 1
    return spelled


_BYTE_OF = _byte_level_alphabet()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def token_piece(tokenizer: Any, token_id: int) -> str:
    """A token's text as a client's log-probs show it. A token that holds part of a multi-byte
    character decodes to U+FFFD alone; it is written as OpenAI writes one, ``bytes:\\xe2\\x80``,
    so that :func:`piece_bytes` gives the client its real bytes to join with its neighbours'."""
    text = str(tokenizer.decode([token_id]))
    if "\ufffd" not in text:
        return text
    spelled = str(tokenizer.convert_ids_to_tokens(token_id))
    byte = _BYTE_TOKEN.fullmatch(spelled)
    if byte is not None:
        raw = bytes([int(byte.group(1), 16)])
    elif all(ch in _BYTE_OF for ch in spelled):
        raw = bytes(_BYTE_OF[ch] for ch in spelled)
    else:
        return text  # a vocabulary of another kind: its text is all there is
    try:
        return raw.decode("utf-8")  # whole characters after all (a real U+FFFD)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def piece_bytes(piece: str) -> list[int]:
    """The UTF-8 bytes of a :func:`token_piece`: a ``bytes:`` piece's own bytes, else its text's."""
    if piece.startswith("bytes:\\x"):
        return [int(h, 16) for h in piece[len("bytes:") :].split("\\x")[1:]]
    return list(piece.encode("utf-8"))


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
    #: the request's stop string that ended the reply (``finish_reason`` "stop"), None if another
    #: reason did: Anthropic's ``stop_sequence``
    stop_string: str | None = None
    #: prompt tokens whose keys/values came from the prefix cache (OpenAI's ``cached_tokens``)
    cached_tokens: int = 0


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

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def generate(self, req: GenRequest) -> AsyncGenerator[Delta | Final, None]: ...

    @abstractmethod
    def swap_weights(self, path: str | Path, version: int) -> None: ...

    def swap_adapter(self, user: str, path: str | Path, version: int) -> None:
        """Serve ``user``'s requests with the LoRA adapter at ``path`` from now on (per_user mode).
        Backends that cannot hold per-user adapters refuse with :class:`WeightLoadError`."""
        from openclaw_rl.policy.weights import WeightLoadError

        raise WeightLoadError(f"backend {self.backend!r} does not serve per-user adapters")

    def adapter_version(self, user: str) -> int:
        """The version of ``user``'s adapter new requests get (0: none, the base)."""
        return 0

    def forget_adapter(self, user: str) -> None:
        """Stop serving ``user``'s adapter and drop it from memory (``users delete``); no-op by default."""
        return None

    def stats(self) -> dict[str, Any]:
        """Backend-specific fields for ``/healthz`` (none by default)."""
        return {}

    def health_problem(self) -> str | None:
        """Why this engine cannot generate now, asked by ``/healthz`` (None: it can). An engine in
        this process can; one behind HTTP may have died."""
        return None

    def prompt_ids(self, req: GenRequest) -> list[int] | None:
        """The token ids of ``req``'s prompt as the model reads it (chat template, tools included);
        None without a local tokenizer."""
        if self.tokenizer is None:
            return None
        with self._prep_lock:
            if self._prep_tokenizer is None:
                # Requests are tokenised on worker threads while the engine thread decodes; a Rust fast
                # tokenizer must not be used from two threads at once, so preparation has its own copy.
                self._prep_tokenizer = copy.deepcopy(self.tokenizer)
            return chat_format.prompt_ids(
                self._prep_tokenizer, req.wire_messages, req.prompt_tools, req.continue_final
            )

    def prepare(self, req: GenRequest) -> None:
        """Tokenise the prompt with the chat template (when a tokenizer is available) and fit the
        output into the window.

        A prompt that leaves no room gets OpenAI's ``context_length_exceeded`` error (agent clients
        recognise it and compact their history). A ``max_tokens`` above what the window leaves is
        clamped to what is left — the answer then ends with ``finish_reason = "length"`` if it runs
        that long, as OpenAI does — or, with ``max_tokens_overflow = "reject"``, refused with 400.
        Agents ask for large output budgets by default (OpenClaw: 8,192) without knowing the window."""
        ids = self.prompt_ids(req)
        if ids is None:
            return
        vocab = len(self._prep_tokenizer)
        wrong = sorted(t for t in req.params.logit_bias if t >= vocab)
        if wrong:
            raise APIError(
                400,
                f"logit_bias: token id(s) {wrong[:5]} are outside this model's vocabulary (0-{vocab - 1})",
                param="logit_bias",
            )
        limit = self.cfg.policy_service.max_model_len
        if len(ids) >= limit:
            tools = req.prompt_tools
            shown = (
                len(self._prep_tokenizer.encode(chat_format.tools_block(tools), add_special_tokens=False))
                if tools
                else 0
            )
            raise ContextLengthExceeded(limit, len(ids), min(shown, len(ids)))
        room = limit - len(ids)
        if (
            req.max_tokens_given
            and req.params.max_tokens > room
            and self.cfg.policy_service.max_tokens_overflow == "reject"
        ):
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + req.params.max_tokens} tokens ({len(ids)} in the messages, "
                f"{req.params.max_tokens} in the completion). Please reduce the length of the "
                f"messages or completion (ask for at most max_tokens = {room}).",
                param="max_tokens",
                code="context_length_exceeded",
            )
        req.params.max_tokens = min(req.params.max_tokens, room)
        req.prompt_ids = ids
