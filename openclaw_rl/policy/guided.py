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
    """What a request's reply must be: a JSON document (``schema`` None: any object), one tool call
    to one of ``functions`` (name -> parameters schema), or either (``json_or_call``: tools offered
    with ``tool_choice`` auto beside a format, as an agent with a structured final answer asks).
    ``paths``: where each function's parameters are in the request, for errors."""

    kind: Literal["json", "tool_call", "json_or_call"]
    schema: dict[str, Any] | None = None
    functions: tuple[tuple[str, dict[str, Any]], ...] = ()
    paths: tuple[str, ...] = ()
    #: ``strict: true`` on the format, and on each function: what the grammar cannot enforce is refused
    strict: bool = False
    strict_functions: tuple[bool, ...] = ()

    @property
    def param(self) -> str:
        """The request field a problem with this grammar is reported against."""
        return "tools" if self.kind == "tool_call" else "response_format"


#: An object with no declared parameters: what a function without ``parameters`` takes.
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def output_grammar(
    response_format: ResponseFormat | None, tools: Sequence[ToolDef] | None, tool_choice: Any
) -> OutputGrammar | None:
    """The grammar a request's fields ask for; None when the reply is free text.

    A forced call wins over a format: the format is for the final answer, which a turn that must
    call a tool does not give (OpenAI takes both the same way)."""
    forced = tool_choice == "required" or isinstance(tool_choice, NamedToolChoice)
    named = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
    offered = [
        (i, t.function) for i, t in enumerate(tools or []) if named is None or t.function.name == named
    ]
    functions = tuple((fn.name, fn.parameters or _NO_PARAMETERS) for _, fn in offered)
    paths = tuple(f"tools[{i}].function.parameters" for i, _ in offered)
    strict_functions = tuple(bool(fn.strict) for _, fn in offered)
    if tools and forced:
        return OutputGrammar("tool_call", functions=functions, paths=paths, strict_functions=strict_functions)
    if response_format is None or not response_format.constrains:
        return None
    schema, strict = None, False
    if response_format.type == "json_schema":
        assert response_format.json_schema is not None  # the protocol model requires it
        schema, strict = response_format.json_schema.schema_, bool(response_format.json_schema.strict)
    if tools and tool_choice != "none":
        return OutputGrammar(
            "json_or_call",
            schema=schema,
            strict=strict,
            functions=functions,
            paths=paths,
            strict_functions=strict_functions,
        )
    return OutputGrammar("json", schema=schema, strict=strict)


def call_schema(functions: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The JSON schema of one call: ``{"name": <one of functions>, "arguments": <its parameters>}``.

    A function's ``$defs`` (pydantic's nested models) move to the call schema's root, renamed per
    function, and its ``$ref`` s with them: a ``#/$defs/City`` means the root of the schema it is
    in, which its parameters no longer are."""
    defs: dict[str, Any] = {}
    calls = []
    for i, (name, params) in enumerate(functions):
        moved = {f"f{i}_{key}": sub for key, sub in _own_defs(params).items()}
        params = _refs_renamed(
            {k: v for k, v in params.items() if k not in ("$defs", "definitions")}, f"f{i}_"
        )
        defs.update({key: _refs_renamed(sub, f"f{i}_") for key, sub in moved.items()})
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "$defs": defs} if defs else schema


def _own_defs(params: dict[str, Any]) -> dict[str, Any]:
    """A schema's own definitions, by name (``$defs`` and the older ``definitions``)."""
    found: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        if isinstance(params.get(key), dict):
            found.update(params[key])
    return found


def _refs_renamed(schema: Any, prefix: str) -> Any:
    """``schema`` with each local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) pointing at the
    root's ``#/$defs/<prefix>X``."""
    if isinstance(schema, list):
        return [_refs_renamed(s, prefix) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            for local in ("#/$defs/", "#/definitions/"):
                if value.startswith(local):
                    value = f"#/$defs/{prefix}{value.removeprefix(local)}"
            out[key] = value
        else:
            out[key] = _refs_renamed(value, prefix)
    return out


#: The longest schema (as JSON text) accepted: compiling is not free, and a request must not be able
#: to occupy the service with it.
MAX_SCHEMA_CHARS = 100_000

#: JSON-schema keywords the grammar compiler passes over without enforcing them (xgrammar 0.1, each
#: checked: a reply breaking them was accepted). A schema that uses one is refused with a 400 naming
#: where: a reply called valid must be valid. OpenAI's strict mode refuses them too.
UNENFORCED_KEYWORDS = (
    "allOf",
    "not",
    "uniqueItems",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentRequired",
    "dependentSchemas",
)

#: Keywords whose value is a map of names to schemas, and those whose value is a schema or a list of them.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def enforceable(schema: Any, where: str, strict: bool, root: str | None = None) -> Any:
    """``schema`` as the grammar compiler can hold a reply to it: an ``allOf`` of one schema (how
    pydantic and the SDKs wrap a ``$ref`` that has a description) is merged into its parent. With
    ``strict`` (the client's ``strict: true``, a promise that the reply matches), any other keyword of
    :data:`UNENFORCED_KEYWORDS` is an :class:`APIError` 400 naming its place (``param``: ``root``,
    the schema's own field); without, the reply is held to the rest, as OpenAI's non-strict mode
    makes a best effort."""
    root = root or where
    if isinstance(schema, list):
        return [enforceable(s, f"{where}[{i}]", strict, root) for i, s in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    one = out.get("allOf")
    if (
        isinstance(one, list)
        and len(one) == 1
        and isinstance(one[0], dict)
        and not set(one[0]) & (set(out) - {"allOf"})
    ):
        del out["allOf"]
        out.update(one[0])
    for key, value in list(out.items()):
        if key in UNENFORCED_KEYWORDS and strict:
            raise APIError(
                400,
                f"{where}.{key}: {key!r} cannot be enforced on the reply here (the grammar compiler passes "
                f"over it), so the reply could break it; express the constraint with type, enum, const, "
                f"anyOf, $ref, pattern, minimum / maximum, minItems / maxItems or required",
                param=root,
            )
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                name: enforceable(sub, f"{where}.{key}.{name}", strict, root) for name, sub in value.items()
            }
        elif key in _SCHEMA_VALUES or key in _SCHEMA_LISTS:
            out[key] = enforceable(value, f"{where}.{key}", strict, root)
    return out


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
        """The compiled grammar; :class:`APIError` 400 naming the field when a schema cannot be used."""
        xgr = self._xgr
        size = len(json.dumps(grammar.schema or {})) + sum(len(json.dumps(p)) for _, p in grammar.functions)
        if size > MAX_SCHEMA_CHARS:
            raise APIError(
                400,
                f"the schema to enforce is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,} are accepted",
                param=grammar.param,
            )
        parts = []
        if grammar.kind != "tool_call":
            where = "response_format.json_schema.schema"
            schema = (
                enforceable(grammar.schema, where, grammar.strict) if grammar.schema else {"type": "object"}
            )
            parts.append(self._from_schema(schema, where, "this JSON schema"))
        if grammar.kind != "json":
            functions = self._checked_functions(grammar.functions, grammar.paths, grammar.strict_functions)
            call = self._from_schema(call_schema(functions), "tools", "a call to these functions")
            with self._lock:
                parts.append(
                    xgr.Grammar.concat(
                        xgr.Grammar.from_ebnf(f"root ::= {json.dumps(OPEN)}"),
                        call,
                        xgr.Grammar.from_ebnf(f"root ::= {json.dumps(CLOSE)}"),
                    )
                )
        with self._lock:
            return self._compiler.compile_grammar(parts[0] if len(parts) == 1 else xgr.Grammar.union(*parts))

    def _checked_functions(
        self, functions: Sequence[tuple[str, dict[str, Any]]], paths: Sequence[str], strict: Sequence[bool]
    ) -> list[tuple[str, dict[str, Any]]]:
        """``functions`` with schemas the grammar can hold a call to; an :class:`APIError` 400 naming
        the first function's parameters that cannot be (an unknown type; with ``strict: true``, a
        keyword the grammar passes over)."""
        checked = []
        for i, (name, params) in enumerate(functions):
            where = paths[i] if i < len(paths) else "tools"
            params = enforceable(params, where, i < len(strict) and strict[i])
            self._from_schema(params or {"type": "object"}, where, f"the parameters of {name!r}")
            checked.append((name, params))
        return checked

    def _from_schema(self, schema: dict[str, Any], where: str, what: str) -> Any:
        try:
            with self._lock:
                return self._xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = _LOG_PREFIX.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
            raise APIError(400, f"{where}: {what} cannot be enforced: {reason[:300]}", param=where) from None


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
