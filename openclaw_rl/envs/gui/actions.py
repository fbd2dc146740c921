"""The ``gui`` environment's action language: parsing plain text and tool calls into :class:`Action`.

One small grammar serves both ways an agent can act (see docs/gui.md)::

    click ID              click a link, button, checkbox, radio ...
    type ID "text"        replace the content of a text box with text
    select ID "option"    choose an option of a drop-down by its visible text
    scroll up|down        scroll the page by most of a screen
    back                  go back to the previous page
    done                  declare the task finished (ends the episode)

``ID`` is the number in square brackets in the observation; ``[3]`` and ``#3`` are accepted too.
Text may be in double quotes (JSON escapes such as ``\\"`` work), single quotes, or unquoted to
the end of the line. Commands are case-insensitive. A model that thinks aloud before acting is
fine: when the whole reply is not one command, the *last* line that is a command is used
(reasoning first, action last is how chat models write), and code fences are ignored.

Tool calls use the same names: ``{"name": "click", "arguments": {"id": 3}}`` with ``arguments``
as a dict or a JSON string, or the OpenAI shape ``{"type": "function", "function": {...}}``.
:data:`TOOLS` holds the matching OpenAI tool definitions to pass to a chat completion.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from openclaw_rl.envs.tool_call import parse_tool_calls

ActionKind = Literal["click", "type", "select", "scroll", "back", "done"]

GRAMMAR = (
    'click ID | type ID "text" | select ID "option" | scroll up|down | back | done '
    "(ID is the number in [brackets])"
)

MAX_TEXT = 2000  # longer "type" text is almost surely a model running on, not an intended input


class ActionError(ValueError):
    """The action could not be understood; the message says why and what is accepted."""


@dataclass(frozen=True)
class Action:
    """A parsed action. ``element`` is set for click/type/select, ``text`` for type/select."""

    kind: ActionKind
    element: int | None = None
    text: str | None = None
    direction: Literal["up", "down"] | None = None

    def describe(self) -> str:
        """The action written back in the command language (for observations and logs)."""
        if self.kind == "click":
            return f"click [{self.element}]"
        if self.kind in ("type", "select"):
            return f"{self.kind} [{self.element}] {json.dumps(self.text, ensure_ascii=False)}"
        if self.kind == "scroll":
            return f"scroll {self.direction}"
        return self.kind


_ID = r"(?:\[\s*(\d+)\s*\]|#?(\d+))"
_LINE = re.compile(
    r"""^\s*(?:action\s*:\s*|>\s*|`)?\s*
    (?P<cmd>click|type|select|scroll|back|done)\b
    (?P<rest>.*?)`?\s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_ID_AT_START = re.compile(rf"^\s*{_ID}(?P<tail>.*)$", re.DOTALL)


def _parse_text_arg(raw: str, cmd: str) -> str:
    raw = raw.strip()
    if not raw:
        raise ActionError(f'{cmd} needs text after the id, e.g. {cmd} 3 "hello"')
    if raw[0] == '"':
        try:
            value, end = json.JSONDecoder().raw_decode(raw)
        except json.JSONDecodeError:
            # An unterminated or oddly escaped quote: take what is inside the outer quotes.
            value, end = raw.strip('"'), len(raw)
        if not isinstance(value, str):
            raise ActionError(f"{cmd} text must be a string, got {raw!r}")
        if raw[end:].strip():
            raise ActionError(f"unexpected text after the quoted string in {cmd}: {raw[end:].strip()!r}")
    elif raw[0] == "'" and raw.endswith("'") and len(raw) >= 2:
        value = raw[1:-1]
    else:
        value = raw
    if len(value) > MAX_TEXT:
        raise ActionError(f"{cmd} text is {len(value)} characters long; at most {MAX_TEXT} are accepted")
    return value


def _parse_line(line: str) -> Action:
    m = _LINE.match(line)
    if not m:
        raise ActionError(f"not a command: {line.strip()[:80]!r}; expected {GRAMMAR}")
    cmd, rest = m.group("cmd").lower(), m.group("rest")
    if cmd in ("back", "done"):
        if rest.strip():
            raise ActionError(f"{cmd} takes no arguments, got {rest.strip()[:40]!r}")
        return Action(cmd)  # type: ignore[arg-type]
    if cmd == "scroll":
        direction = rest.strip().lower()
        if direction not in ("up", "down"):
            raise ActionError(f"scroll needs a direction, up or down, got {rest.strip()[:40]!r}")
        return Action("scroll", direction=direction)  # type: ignore[arg-type]
    idm = _ID_AT_START.match(rest)
    if not idm:
        raise ActionError(f"{cmd} needs an element id (the number in brackets), got {rest.strip()[:40]!r}")
    element = int(idm.group(1) or idm.group(2))
    tail = idm.group("tail")
    if cmd == "click":
        if tail.strip():
            raise ActionError(f"click takes only an element id, got extra {tail.strip()[:40]!r}")
        return Action("click", element=element)
    return Action(cmd, element=element, text=_parse_text_arg(tail, cmd))  # type: ignore[arg-type]


def parse_text(text: str) -> Action:
    """Parse a plain-text reply into an action (see the module docstring for the rules)."""
    if not isinstance(text, str):
        raise ActionError(f"an action must be text or a tool call dict, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ActionError(f"the action is empty; expected {GRAMMAR}")
    lines = [ln for ln in stripped.splitlines() if ln.strip() and not ln.strip().startswith("```")]
    if len(lines) == 1:
        return _parse_line(lines[0])
    first_error: ActionError | None = None
    for line in reversed(lines):
        if _LINE.match(line):
            try:
                return _parse_line(line)
            except ActionError as exc:  # a command-looking line with bad arguments: report it
                first_error = first_error or exc
    if first_error is not None:
        raise first_error
    raise ActionError(
        f"no command found in the reply ({len(lines)} lines); put one command on its own line: {GRAMMAR}"
    )


def _tool_id(args: dict[str, Any], name: str) -> int:
    for key in ("id", "element", "element_id"):
        if key in args:
            raw = args[key]
            if isinstance(raw, bool):
                break
            if isinstance(raw, int):
                return raw
            if isinstance(raw, str) and re.fullmatch(rf"\s*{_ID}\s*", raw):
                return int(re.sub(r"\D", "", raw))
            raise ActionError(f"{name}: 'id' must be an element number, got {raw!r}")
    raise ActionError(f"{name} needs an 'id' argument (the element number), got arguments {sorted(args)}")


def _tool_str(args: dict[str, Any], name: str, keys: tuple[str, ...]) -> str:
    for key in keys:
        if key in args:
            if not isinstance(args[key], str):
                raise ActionError(f"{name}: '{key}' must be a string, got {type(args[key]).__name__}")
            if len(args[key]) > MAX_TEXT:
                raise ActionError(f"{name}: '{key}' has {len(args[key])} characters; at most {MAX_TEXT}")
            return args[key]
    raise ActionError(f"{name} needs a '{keys[0]}' argument, got arguments {sorted(args)}")


def parse_tool_call(call: dict[str, Any]) -> Action:
    """Parse a tool call dict (``{"name", "arguments"}`` or OpenAI's ``{"function": {...}}``)."""
    if "function" in call and isinstance(call["function"], dict):
        call = call["function"]
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise ActionError(f"tool call has no 'name'; got keys {sorted(call)}")
    name = name.strip().lower()
    args: Any = call.get("arguments", {})
    if args is None or args == "":
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            raise ActionError(
                f"tool call {name}: arguments are not valid JSON ({exc.msg} at "
                f"position {exc.pos}): {args[:80]!r}"
            ) from None
    if not isinstance(args, dict):
        raise ActionError(f"tool call {name}: arguments must be an object, got {type(args).__name__}")
    if name == "click":
        return Action("click", element=_tool_id(args, name))
    if name == "type":
        return Action("type", element=_tool_id(args, name), text=_tool_str(args, name, ("text", "value")))
    if name == "select":
        return Action(
            "select", element=_tool_id(args, name), text=_tool_str(args, name, ("option", "value", "text"))
        )
    if name == "scroll":
        direction = str(args.get("direction", "")).strip().lower()
        if direction not in ("up", "down"):
            raise ActionError(f"scroll needs direction 'up' or 'down', got {args.get('direction')!r}")
        return Action("scroll", direction=direction)  # type: ignore[arg-type]
    if name in ("back", "done"):
        return Action(name)  # type: ignore[arg-type]
    raise ActionError(f"unknown tool {name!r}; the tools are click, type, select, scroll, back, done")


@dataclass(frozen=True)
class Unwrapped:
    """An agent's output reduced to one thing to parse, plus the tool calls it answered with."""

    action: str | dict[str, Any]
    tool_call_ids: tuple[str, ...] = ()  # ids of every native tool call, in order
    tool_names: tuple[str, ...] = ()

    @property
    def native(self) -> bool:
        """True when the agent used the API's tool calls (answers must be ``tool`` messages)."""
        return bool(self.tool_call_ids)


def unwrap(action: Any) -> Unwrapped:
    """Accept an assistant message dict (``content`` / ``tool_calls``) as well as text or one call.

    A message with tool calls acts with the first call (one action per step); a message without
    them acts with its text content.
    """
    if isinstance(action, dict) and ("tool_calls" in action or "role" in action):
        calls = action.get("tool_calls") or []
        if not isinstance(calls, list):
            calls = [calls]
        if calls:
            ids = tuple(
                str(c.get("id") or f"call_{i}") if isinstance(c, dict) else f"call_{i}"
                for i, c in enumerate(calls)
            )
            names = tuple(
                str(((c.get("function") or c) if isinstance(c, dict) else {}).get("name") or "?")
                for c in calls
            )
            first = calls[0] if isinstance(calls[0], dict) else {"name": str(calls[0])}
            return Unwrapped(first, ids, names)
        return Unwrapped(str(action.get("content") or ""))
    return Unwrapped(action)


def parse_action(action: str | dict[str, Any]) -> Action:
    """Parse what an agent emitted — text, a tool call, or an assistant message — into an :class:`Action`."""
    action = unwrap(action).action
    if isinstance(action, dict):
        return parse_tool_call(action)
    if isinstance(action, str):
        # a call written as text (`<tool_call>{...}</tool_call>`, or only its JSON): the tool_call
        # environment's reading of it, so one reply means the same action in both
        _, calls, _ = parse_tool_calls(action)
        if calls:
            if "parse_error" in calls[0]:
                raise ActionError(calls[0]["parse_error"])
            return parse_tool_call(calls[0])
    return parse_text(action)


def _tool(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_ID_PROP = {"id": {"type": "integer", "description": "the element number shown in [brackets]"}}

TOOLS: list[dict[str, Any]] = [
    _tool("click", "Click a link, button, checkbox or radio button.", _ID_PROP, ["id"]),
    _tool(
        "type",
        "Replace the text of a text box with the given text.",
        {**_ID_PROP, "text": {"type": "string"}},
        ["id", "text"],
    ),
    _tool(
        "select",
        "Choose an option of a drop-down by its visible text.",
        {**_ID_PROP, "option": {"type": "string"}},
        ["id", "option"],
    ),
    _tool(
        "scroll", "Scroll the page.", {"direction": {"type": "string", "enum": ["up", "down"]}}, ["direction"]
    ),
    _tool("back", "Go back to the previous page.", {}, []),
    _tool("done", "Declare the task finished; ends the episode.", {}, []),
]
