"""``tool_call``: OpenAI function-calling tasks with tools executed for real.

Tools offered to the agent (OpenAI ``tools`` schema, in ``reset()``'s ``info["tools"]``):

* ``python`` — runs code with ``python3`` in the episode's bubblewrap sandbox (same isolation and
  limits as the terminal env); the result is stdout / stderr / exit code.
* ``calculator`` — evaluates an arithmetic expression with a small AST walker (numbers, + - * / //
  % **, parentheses, abs/round/min/max/sqrt). Never ``eval``: the expression cannot reach Python.
* ``file`` — read, write or list files in the sandbox directory (paths cannot leave it).

Tasks: GSM8K word problems (train / held-out split shared with ``chat``) and lookup questions over
a small generated data file in the sandbox (needs the ``file`` or ``python`` tool). The episode ends
when the agent replies without a tool call; it succeeds when that final reply contains the
correct number.

Next state: one ``role: "tool"`` message per call (result or error trace). A malformed call — bad
JSON arguments, an unknown tool, a missing or wrongly typed argument — gets an error observation
that says what was wrong, never an exception. A tool call written as text (``<tool_call>{...}``
or a JSON block) is also understood, for models without native tool calling; its result comes back
as a user message since there is no ``tool_call_id`` to answer.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypedDict

from openclaw_rl.config import resolve_data_path
from openclaw_rl.envs.base import Env, Observation, StepResult, check_turns, register
from openclaw_rl.envs.data import GsmItem, gsm8k_split
from openclaw_rl.envs.sandbox import Sandbox, SandboxLimits, check_available

SYSTEM_PROMPT = (
    "You can call tools: python (run Python code), calculator (arithmetic) and file (read/write/list "
    "files in your working directory). Call a tool when it helps. When you know the result, reply "
    "without a tool call and end with: ANSWER: <number>"
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python 3 code in a sandbox; returns stdout, stderr and exit code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python source"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. (3 + 4) * 2 / 7.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "file",
            "description": "Read, write or list files in the working directory.",
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["read", "write", "list"]},
                    "path": {"type": "string", "description": "relative path (default '.' for list)"},
                    "content": {"type": "string", "description": "text to write (action=write)"},
                },
                "required": ["action"],
            },
        },
    },
]
TOOL_NAMES = [t["function"]["name"] for t in TOOLS]


class ToolError(ValueError):
    """A tool call the environment cannot execute; the message becomes the observation."""


# ---- calculator ----

_BINOPS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNOPS: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., float]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
}


def calculate(expression: str) -> float | int:
    """Evaluate arithmetic safely; raise :class:`ToolError` for anything else."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("calculator: 'expression' must be a non-empty string")
    if len(expression) > 500:
        raise ToolError("calculator: expression longer than 500 characters")
    expr = re.sub(r"(?<=\d),(?=\d{3}\b)", "", expression).replace("^", "**").replace("\u00d7", "*")
    expr = expr.replace("$", "")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"calculator: cannot parse {expression!r}: {exc.msg}") from None
    return _eval(tree.body)


#: Integers past this many bits (about 300 digits) are refused: Python would compute ever larger
#: products of them and refuse to print one of over 4,300 digits.
MAX_RESULT_BITS = 1000


def _bounded(value: float | int) -> float | int:
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise ToolError("calculator: result too large (over 300 digits)")
    return value


def _eval(node: ast.AST) -> float | int:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e12):
            raise ToolError("calculator: exponent too large")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("calculator: division by zero") from None
        except (OverflowError, ValueError) as exc:
            raise ToolError(f"calculator: {exc}") from None
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
        and len(node.args) <= 10
    ):
        args = [_eval(a) for a in node.args]
        try:
            value = _FUNCS[node.func.id](*args)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ToolError(f"calculator: {node.func.id}(): {exc}") from None
        return _bounded(value)
    raise ToolError(
        f"calculator: unsupported element {type(node).__name__!r}; only numbers, + - * / // % **, "
        f"parentheses and {', '.join(_FUNCS)} are allowed"
    )


# ---- parsing tool calls out of an action ----

_TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>|```(?:json)?\s*(\{.*?\})\s*```", re.S)


def _bare_call(text: str) -> bool:
    """Whether ``text`` is only one call's JSON: ``{"name": ..., "arguments": {...}}``."""
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and set(obj) <= {"name", "arguments", "parameters"}
        and len(obj) == 2
    )


def parse_tool_calls(action: str | dict[str, Any]) -> tuple[str, list[dict[str, Any]], bool]:
    """``(content, calls, native)``: calls in OpenAI shape; ``native`` False when parsed from text
    (``<tool_call>{...}</tool_call>``, a fenced JSON block, or a reply that is only the call's JSON)."""
    if isinstance(action, dict):
        content = str(action.get("content") or "")
        calls = action.get("tool_calls") or []
        if not isinstance(calls, list):
            calls = [calls]
        return content, calls, True
    calls = []
    stripped = action.strip()
    # a reply that is nothing but one call's JSON, as models without call markup write it: a name
    # and its arguments (a JSON answer such as {"name": "melon", "price": 38} is not a call)
    blobs = [stripped] if _bare_call(stripped) else []
    if not blobs:
        # a <tool_call> block is a call whatever it holds; a fenced JSON block only when it is one
        # (a final answer in a ```json fence is an answer)
        blobs = [
            m.group(1) if m.group(1) is not None else m.group(2)
            for m in _TEXT_CALL.finditer(action)
            if m.group(1) is not None or _bare_call(m.group(2).strip())
        ]
    for blob in blobs:
        try:
            obj = json.loads(blob)
        except json.JSONDecodeError as exc:
            # A text tool call that is not JSON is still a (malformed) tool call: report it.
            calls.append(
                {
                    "id": None,
                    "function": {"name": "?", "arguments": blob},
                    "parse_error": f"tool call is not valid JSON: {exc}",
                }
            )
            continue
        if isinstance(obj, dict) and "name" in obj:
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append(
                {
                    "id": None,
                    "function": {
                        "name": obj["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
    return action, calls, False


class _InventoryRow(TypedDict):
    """One row of a lookup task's ``inventory.json``."""

    item: str
    price: int
    stock: int


@register("tool_call")
class ToolCallEnv(Env):
    """GSM8K and lookup tasks with real tools; see the module docstring."""

    name = "tool_call"

    def __init__(
        self,
        split: Literal["train", "eval"] = "train",
        data_path: str = "gsm8k",
        eval_size: int = 50,
        max_turns: int = 4,
        kind: Literal["gsm8k", "lookup"] | None = None,
        items: list[GsmItem] | None = None,
        limits: SandboxLimits | None = None,
        seed: int | None = None,
        config_source: str | None = None,
        **_: Any,
    ):
        check_available()  # no bubblewrap: say so now, so the environment service skips the type
        self.split = split
        self._data = (data_path, eval_size, config_source)
        self._items = items
        if kind not in (None, "gsm8k", "lookup"):
            raise ValueError(f"kind must be 'gsm8k', 'lookup' or None (either), got {kind!r}")
        self.kind = kind
        self.max_turns = check_turns("max_turns", max_turns)
        self.limits = limits or SandboxLimits(timeout_sec=10)
        self.rng = random.Random(seed)
        self.sandbox: Sandbox | None = None
        self.answer: str = ""
        self.turns = 0
        self.task: dict[str, Any] = {}

    @property
    def items(self) -> list[GsmItem]:
        if self._items is None:  # loaded lazily: lookup-only use needs no data file
            path, size, src = self._data
            self._items = gsm8k_split(resolve_data_path(path, src), size, self.split)
        return self._items

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self.rng = random.Random(seed)
        opts = options or {}
        self.close()
        self.sandbox = Sandbox(self.limits)
        self.turns = 0
        kind = opts.get("kind") or self.kind or self.rng.choice(["gsm8k", "lookup"])
        if kind == "gsm8k":
            item = self.items[opts["item"]] if "item" in opts else self.rng.choice(self.items)
            question = item.question
            self.answer = item.answer
            self.task = {"kind": "gsm8k", "item_index": item.index}
        elif kind == "lookup":
            question, self.answer = self._lookup_task()
            self.task = {"kind": "lookup"}
        else:
            raise ValueError(f"kind must be 'gsm8k' or 'lookup', got {kind!r}")
        obs = question
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs}]
        return obs, {**self.task, "tools": TOOLS, "next_state_role": "user", "messages": messages}

    def _lookup_task(self) -> tuple[str, str]:
        """A small inventory file and one question about it; eval draws from a disjoint seed space."""
        assert self.sandbox is not None
        r = random.Random(self.rng.randrange(1 << 30) * 2 + (1 if self.split == "eval" else 0))
        names = [
            "apple",
            "pear",
            "plum",
            "kiwi",
            "mango",
            "lime",
            "fig",
            "date",
            "melon",
            "peach",
            "cherry",
            "grape",
        ]
        r.shuffle(names)
        rows: list[_InventoryRow] = [
            {"item": n, "price": r.randint(1, 40), "stock": r.randint(0, 200)} for n in names[:8]
        ]
        self.sandbox.write_file("inventory.json", json.dumps(rows, indent=1) + "\n")
        target = r.choice(rows)
        form = r.choice(("price", "stock", "value"))
        if form == "price":
            q, a = f"What is the price of {target['item']} in inventory.json?", target["price"]
        elif form == "stock":
            q, a = f"How many {target['item']} are in stock according to inventory.json?", target["stock"]
        else:
            q = "What is the total stock of all items in inventory.json?"
            a = sum(row["stock"] for row in rows)
        return q + " Use the file tool (or python) to look it up.", str(a)

    def step(self, action: str | dict[str, Any]) -> StepResult:
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        self.turns += 1
        content, calls, native = parse_tool_calls(action)
        if not calls:
            success = _final_number_matches(content, self.answer)
            verdict = "Correct." if success else "That answer is not correct."
            info = {
                **self.task,
                "success": success,
                "final": True,
                "next_state_role": "user",
                "messages": [{"role": "user", "content": verdict}],
            }
            return verdict, 1.0 if success else 0.0, True, False, info
        messages = []
        errors = 0
        for i, call in enumerate(calls[:8]):  # a reply with dozens of calls gets the first 8 run
            name, result, ok = self._execute(call)
            errors += not ok
            if native:
                call_id = call.get("id") if isinstance(call, dict) else None
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(call_id or f"call_{i}"),
                        "name": name,
                        "content": result,
                    }
                )
            else:
                messages.append({"role": "user", "content": f"[tool {name} result]\n{result}"})
        obs: Observation = (
            messages
            if native
            else messages[0]["content"]
            if len(messages) == 1
            else "\n\n".join(m["content"] for m in messages)
        )
        truncated = self.turns >= self.max_turns
        info = {
            **self.task,
            "success": False,
            "tool_errors": errors,
            "next_state_role": "tool" if native else "user",
            "messages": messages,
        }
        return obs, 0.0, False, truncated, info

    def _execute(self, call: Any) -> tuple[str, str, bool]:
        """``(tool name, result text, ok)`` — every failure becomes text, never an exception."""
        try:
            if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                raise ToolError('malformed tool call: expected {"function": {"name": ..., "arguments": ...}}')
            if call.get("parse_error"):
                raise ToolError(call["parse_error"])
            fn = call["function"]
            name = fn.get("name")
            if name not in TOOL_NAMES:
                raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")
            raw = fn.get("arguments", "{}")
            if isinstance(raw, dict):
                args = raw
            else:
                try:
                    args = json.loads(raw or "{}")
                except (json.JSONDecodeError, TypeError) as exc:
                    raise ToolError(f"arguments for tool {name!r} are not valid JSON: {exc}") from None
            if not isinstance(args, dict):
                raise ToolError(
                    f"arguments for tool {name!r} must be a JSON object, got {type(args).__name__}"
                )
            return name, getattr(self, f"_tool_{name}")(args), True
        except ToolError as exc:
            name = (
                call.get("function", {}).get("name", "?")
                if isinstance(call, dict) and isinstance(call.get("function"), dict)
                else "?"
            )
            return str(name), f"error: {exc}", False

    @staticmethod
    def _arg(args: dict[str, Any], key: str, tool: str, required: bool = True, default: str = "") -> str:
        if key not in args:
            if required:
                raise ToolError(f"tool {tool!r}: missing required argument {key!r}")
            return default
        value = args[key]
        if not isinstance(value, str):
            raise ToolError(f"tool {tool!r}: argument {key!r} must be a string, got {type(value).__name__}")
        return value

    def _tool_python(self, args: dict[str, Any]) -> str:
        assert self.sandbox is not None
        code = self._arg(args, "code", "python")
        return self.sandbox.run("python3 -", stdin=code).as_observation()

    def _tool_calculator(self, args: dict[str, Any]) -> str:
        value = calculate(self._arg(args, "expression", "calculator"))
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return str(value)

    def _tool_file(self, args: dict[str, Any]) -> str:
        assert self.sandbox is not None
        action = self._arg(args, "action", "file")
        path = self._arg(args, "path", "file", required=action != "list", default=".")
        if "\x00" in path:
            raise ToolError(f"file: the path {path!r} contains a NUL byte")
        try:
            if action == "list":
                target = self.sandbox.path(path)
                if not target.is_dir():
                    raise ToolError(f"file: {path!r} is not a directory")
                return (
                    "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()))
                    or "(empty)"
                )
            if action == "read":
                self.sandbox.path(path)  # raises PermissionError for a path leaving the sandbox
                text = self.sandbox.read_file(path, max_bytes=16384)
                if text is None:
                    raise ToolError(f"file: {path!r} does not exist or is not a regular file")
                return text
            if action == "write":
                content = self._arg(args, "content", "file")
                if len(content) > 1 << 20:
                    raise ToolError("file: content larger than 1 MiB")
                self.sandbox.write_file(path, content)
                return f"wrote {len(content.encode())} bytes to {path}"
        except PermissionError:
            raise ToolError(f"file: {path!r} is outside the working directory") from None
        except IsADirectoryError:
            raise ToolError(f"file: {path!r} is a directory") from None
        except OSError as exc:  # "inventory.json/x": a file in the way; named without the host path
            reason = exc.strerror or type(exc).__name__
            if isinstance(exc, FileExistsError | NotADirectoryError):
                reason = "a part of the path is a file, not a directory"
            raise ToolError(f"file: cannot {action} {path!r}: {reason}") from None
        raise ToolError(f"file: unknown action {action!r}; use read, write or list")

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def _final_number_matches(content: str, answer: str) -> bool:
    """The number after ``ANSWER:`` (else the last number in the reply) equals ``answer``."""
    m = re.search(r"answer\s*[:=]?\s*\**\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", content, re.I)
    nums = [m.group(1)] if m else re.findall(r"-?\d[\d,]*(?:\.\d+)?", content)
    if not nums:
        return False
    try:
        return abs(float(nums[-1].replace(",", "")) - float(answer.replace(",", ""))) < 1e-6
    except ValueError:
        return False


def new_call_id() -> str:
    """An OpenAI-style tool call id (tests and scripted agents)."""
    return "call_" + uuid.uuid4().hex[:12]
