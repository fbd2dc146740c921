"""Structured output and forced tool calls: a reply held to a grammar, token by token.

A client that asks for ``response_format`` JSON, or forces a tool call (``tool_choice`` ``"required"``
or a named function; Anthropic's ``any`` / ``tool``), relies on getting exactly that back: agent
frameworks parse the reply without a fallback. A small model asked nicely will not oblige, so the
embedded engine enforces it: before each token is drawn, every token that cannot continue a valid
reply gets probability zero (xgrammar's matcher over the model's vocabulary, the way vLLM and SGLang
do it). The log-prob recorded for training stays the model's own, unmasked (vLLM's default too),
so the trainer's ratio compares the same distribution on both sides.

* ``json_object``: any JSON object; ``json_schema``: JSON matching the schema (always strict);
* a forced call: the tool-call markup of :mod:`openclaw_rl.runtime.chat_format` around
  ``{"name": <one of the allowed functions>, "arguments": <its parameters' schema>}``, which the
  serving layer parses into ``tool_calls`` as it parses any other call.

JSON is written compactly (no free whitespace): a small model given room for whitespace can spend
its whole budget on it. docs/serving.md, "Structured output and forced tool calls".
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from openclaw_rl.policy.protocol import APIError, NamedToolChoice, ResponseFormat, ToolDef
from openclaw_rl.runtime.chat_format import CLOSE, OPEN

if TYPE_CHECKING:
    import torch

#: xgrammar's errors start with its log prefix ("[10:16:50] /project/cpp/x.cc:5082: "): not for a client
_LOG_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


@dataclass(frozen=True)
class OutputGrammar:
    """What a request's reply must be: a JSON document (``schema`` None: any object) or one tool
    call to one of ``functions`` (name -> parameters schema)."""

    kind: Literal["json", "tool_call"]
    schema: dict[str, Any] | None = None
    functions: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def param(self) -> str:
        """The request field a problem with this grammar is reported against."""
        return "response_format" if self.kind == "json" else "tools"


def output_grammar(
    response_format: ResponseFormat | None, tools: Sequence[ToolDef] | None, tool_choice: Any
) -> OutputGrammar | None:
    """The grammar a request's fields ask for; None when the reply is free text."""
    if tools and (tool_choice == "required" or isinstance(tool_choice, NamedToolChoice)):
        named = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
        functions = tuple(
            (t.function.name, t.function.parameters or {"type": "object", "properties": {}})
            for t in tools
            if named is None or t.function.name == named
        )
        return OutputGrammar("tool_call", functions=functions)
    if response_format is None or not response_format.constrains:
        return None
    if response_format.type == "json_object":
        return OutputGrammar("json")
    assert response_format.json_schema is not None  # the protocol model requires it
    return OutputGrammar("json", schema=response_format.json_schema.schema_)


def call_schema(functions: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The JSON schema of one call: ``{"name": <one of functions>, "arguments": <its parameters>}``."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, params in functions
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


#: The longest schema (as JSON text) accepted: compiling is not free, and a request must not be able
#: to occupy the service with it.
MAX_SCHEMA_CHARS = 100_000


class GrammarCompiler:
    """Compiles :class:`OutputGrammar` s against one tokenizer's vocabulary (thread-safe; compiled
    grammars are cached by xgrammar)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]):
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._lock = threading.Lock()

    def compile(self, grammar: OutputGrammar) -> Any:
        """The compiled grammar; :class:`APIError` 400 naming the field when the schema cannot be used."""
        xgr = self._xgr
        size = len(json.dumps(grammar.schema or {})) + sum(len(json.dumps(p)) for _, p in grammar.functions)
        if size > MAX_SCHEMA_CHARS:
            raise APIError(
                400,
                f"the schema to enforce is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,} are accepted",
                param=grammar.param,
            )
        try:
            with self._lock:
                if grammar.kind == "json":
                    schema = grammar.schema if grammar.schema else {"type": "object"}
                    return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
                call = xgr.Grammar.from_json_schema(
                    json.dumps(call_schema(grammar.functions)), any_whitespace=False
                )
                wrapped = xgr.Grammar.concat(
                    xgr.Grammar.from_ebnf(f"root ::= {json.dumps(OPEN)}"),
                    call,
                    xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CLOSE)}"),
                )
                return self._compiler.compile_grammar(wrapped)
        except (RuntimeError, ValueError, TypeError) as exc:
            where = "response_format.json_schema.schema" if grammar.kind == "json" else "tools"
            reason = _LOG_PREFIX.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
            what = "this JSON schema" if grammar.kind == "json" else "a forced call to these functions"
            if grammar.kind != "json":
                bad = self._unusable_functions(grammar)
                if bad:
                    what = "a forced call to " + ", ".join(repr(name) for name in bad)
            raise APIError(400, f"{where}: {what} cannot be enforced: {reason[:300]}", param=where) from None

    def _unusable_functions(self, grammar: OutputGrammar) -> list[str]:
        """The names of the functions whose parameters schema fails to compile on its own."""
        bad = []
        for name, params in grammar.functions:
            try:
                with self._lock:
                    self._xgr.Grammar.from_json_schema(
                        json.dumps(params or {"type": "object"}), any_whitespace=False
                    )
            except (RuntimeError, ValueError, TypeError):
                bad.append(name)
        return bad


class RowGrammar:
    """One reply's place in its grammar: which tokens may come next, and the tokens taken so far."""

    def __init__(self, compiled: Any, prefix: str = ""):
        import xgrammar as xgr

        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask: Any = None  # made at the first step, reused at every later one
        if prefix and not self._matcher.accept_string(prefix):
            raise ValueError("the prefilled start of the reply does not fit the requested format")

    def mask(self, logits_V: torch.Tensor) -> None:
        """Set the logit of every token that cannot come next to -inf (in place, one row)."""
        if self._bitmask is None:
            self._bitmask = self._xgr.allocate_token_bitmask(1, logits_V.shape[-1])
        self._matcher.fill_next_token_bitmask(self._bitmask, 0)
        self._xgr.apply_token_bitmask_inplace(logits_V.unsqueeze(0), self._bitmask)

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False if the grammar does not allow it (a caller bug)."""
        return bool(self._matcher.accept_token(token))
