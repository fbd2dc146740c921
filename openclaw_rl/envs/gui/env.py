"""``GuiEnv``: an agent operates small web apps in a real headless Chromium.

An episode: ``reset`` seeds the apps' server-side state for one task and opens its start page in a
fresh browser context; the first observation is the task plus the page as text. Each ``step``
applies one command (``click 3``, ``type 5 "ada@example.com"`` ...) and returns the *next state*:
what the action did, what changed on the page, and the page as it is now. ``done`` ends the
episode and runs the task's checker on the apps' server state (never on the DOM); the step limit
truncates it. ``reward`` is 1.0 when the checker passes at the end of the episode, else 0.0 — an
outcome for evaluation; training signal comes from the judge reading the observations.

Faults never escape to the caller. A malformed command, an id that is not on the page, a page
that does not answer (the request hangs, or a script freezes the tab), a click that leaves the
site, a dialog or a new tab: each becomes an observation starting with ``Error:`` (or ``Event:``)
that says what happened and what state the page is in now. A crashed browser ends the episode
(``truncated``) with an error observation; the next ``reset`` relaunches Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openclaw_rl.envs.base import Env, Observation, StepResult, check_turns, register
from openclaw_rl.envs.gui.actions import GRAMMAR, TOOLS, Action, ActionError, Unwrapped, parse_action, unwrap
from openclaw_rl.envs.gui.apps import AppServer
from openclaw_rl.envs.gui.browser import (
    DEFAULT_CHROMIUM,
    BrowserError,
    BrowserHost,
    ChromiumNotFound,
    check_chromium,
    is_loopback_url,
)
from openclaw_rl.envs.gui.observe import (
    SNAPSHOT_JS,
    IdRegistry,
    Snapshot,
    build_snapshot,
    diff,
    render_page,
)
from openclaw_rl.envs.gui.tasks import TASK_BY_ID, TASKS, GuiTask, get_task

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You operate a web browser to complete a task. Each message shows the page as a list of elements; "
    "the ones you can use have an id in [brackets]. Reply with exactly one command per turn, on its own "
    f"line: {GRAMMAR}. `type` replaces the text of a text box; submit forms by clicking their button. "
    "When the task is complete, reply `done`."
)

TEXT_ROLES = frozenset({"textbox", "searchbox", "spinbutton"})
#: A :data:`StepResult` whose observation is text: the GUI always answers with the page as lines.
TextStepResult = tuple[str, float, bool, bool, dict[str, Any]]
_instances = itertools.count(1)


class _ActError(Exception):
    """An action that cannot be carried out on this page (the page itself is fine)."""


@dataclass
class _Outcome:
    """What one browser-side step produced."""

    snap: Snapshot | None
    error: str | None = None
    events: tuple[str, ...] = ()
    fatal: bool = False
    screenshot: str | None = None
    screenshot_error: str | None = None
    changes: tuple[str, ...] = ()


def _first_line(exc: BaseException) -> str:
    """Playwright errors carry a long call log; the first line is the useful part."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


@register("gui")
class GuiEnv(Env):
    """Web tasks in headless Chromium; see the module docstring and docs/gui.md.

    Args:
        seed: seeds the task choice of ``reset()`` calls that pass no seed.
        tasks: task ids to draw from (default: all of :data:`~openclaw_rl.envs.gui.tasks.TASKS`).
        max_steps: steps before the episode is truncated.
        screenshot_dir: when set, a PNG of the page is saved there after reset and every step.
        browser: a shared :class:`BrowserHost`; by default the environment starts its own.
        chromium_path: the Chromium binary (for the environment's own host).
        action_timeout_s: how long one action may wait for the page before it is an error.
        max_lines: element lines per observation; longer pages show a window that scrolls.
        offer_tools: put the OpenAI tool definitions of the commands in ``reset()``'s
            ``info["tools"]`` (about 400 prompt tokens); text commands work either way.
        max_turns: alias of ``max_steps`` (the name the environment service uses).
        split: accepted for the environment service; gui tasks have no held-out split.
    """

    name = "gui"

    def __init__(
        self,
        seed: int | None = None,
        tasks: list[str] | tuple[str, ...] | None = None,
        max_steps: int = 20,
        screenshot_dir: str | Path | None = None,
        browser: BrowserHost | None = None,
        chromium_path: str = DEFAULT_CHROMIUM,
        action_timeout_s: float = 5.0,
        max_lines: int = 40,
        offer_tools: bool = False,
        max_turns: int | None = None,
        split: str | None = None,
    ) -> None:
        # max_turns / split: what the environment service passes every environment type.
        # max_turns is the episode's step budget under its generic name; gui tasks have no
        # train / eval split (each task is small and fixed), so split only gets validated.
        if max_turns is not None:
            max_steps = max_turns
        if split not in (None, "train", "eval", "all"):
            raise ValueError(f"split must be train, eval or all, got {split!r}")
        check_turns("max_turns" if max_turns is not None else "max_steps", max_steps)
        if action_timeout_s <= 0:
            raise ValueError(f"action_timeout_s must be > 0, got {action_timeout_s}")
        if max_lines < 5:
            raise ValueError(f"max_lines must be >= 5, got {max_lines}")
        ids = list(tasks) if tasks is not None else [t.id for t in TASKS]
        if not ids:
            raise ValueError("tasks is empty; pass None for all tasks")
        self.tasks: list[GuiTask] = [get_task(t) for t in ids]
        self.max_steps = max_steps
        self.action_timeout_s = float(action_timeout_s)
        self.max_lines = max_lines
        self.offer_tools = offer_tools
        self.screenshot_dir = Path(screenshot_dir) if screenshot_dir is not None else None
        if self.screenshot_dir is not None:
            self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        self._rng = random.Random(seed)
        self._own_host = browser is None
        if browser is None:
            check_chromium(chromium_path)  # now, not at the first reset: the service skips the type
        self.host = browser if browser is not None else BrowserHost(executable_path=chromium_path)
        self.server = AppServer()
        self._uid = f"gui{next(_instances)}"
        self._episode = 0
        self._task: GuiTask | None = None
        self._ctx: Any = None
        self._page: Any = None
        self._snap: Snapshot | None = None
        self._registry = IdRegistry()
        self._steps = 0
        self._over = True
        self._last_good_url = ""
        self._events: list[str] = []
        self._pending_nav: str | None = None
        self._failed_nav: tuple[str, str] | None = None
        self._nav_failed_now = False  # a main-frame navigation failed during the current step
        self._closed = False
        self._opening_page = False
        self._popups: list[Any] = []

    # -- public helpers -------------------------------------------------------------------
    @property
    def task(self) -> GuiTask | None:
        """The current episode's task."""
        return self._task

    @property
    def snapshot(self) -> Snapshot | None:
        """The page as last observed."""
        return self._snap

    def find(self, role: str, name: str) -> int | None:
        """Id of a control on the current page by role and name (case-insensitive), or None."""
        return self._snap.find(role, name) if self._snap is not None else None

    def check(self) -> tuple[bool, str]:
        """Run the current task's checker on the server state now."""
        if self._task is None:
            return False, "no episode: call reset() first"
        with self.server.lock:
            return self._task.check(self.server.state)

    # -- timeouts -------------------------------------------------------------------------
    @property
    def _step_budget_s(self) -> float:
        # action + load wait + recovery (stop / reopen) + snapshot + screenshot, each bounded.
        return self.action_timeout_s * 4 + 15

    # -- reset ----------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode. ``options``: ``task`` (a task id) and ``start_path`` (override the
        page the browser opens, e.g. ``/_faults``). Relaunches Chromium if it died."""
        if self._closed:
            raise RuntimeError("this GuiEnv was closed; create a new one")
        options = dict(options or {})
        unknown = set(options) - {"task", "start_path"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; known: ['start_path', 'task']")
        rng = random.Random(seed) if seed is not None else self._rng
        if options.get("task") is not None:
            task_id = str(options["task"])
            if task_id not in TASK_BY_ID:
                raise KeyError(f"unknown gui task {task_id!r}; known: {sorted(TASK_BY_ID)}")
            task = TASK_BY_ID[task_id]
        else:
            task = self.tasks[rng.randrange(len(self.tasks))]
        start_path = str(options.get("start_path") or task.start_path)
        if not start_path.startswith("/"):
            raise ValueError(
                f"start_path must be a path on the app server starting with '/', got {start_path!r}"
            )

        base = self.server.start()
        self.server.reset(task.make_state())
        self._task, self._steps, self._over = task, 0, False
        self._episode += 1
        self._registry = IdRegistry()
        self._snap = None
        url = base + start_path
        try:
            outcome = self.host.run(self._open(url), timeout=self._step_budget_s + 30)
        except ChromiumNotFound:
            self._over = True
            raise
        except Exception as first:  # a dead or wedged browser, a failed load: relaunch once
            wedged = isinstance(first, TimeoutError) or not self.host.connected
            log.warning(
                "gui reset failed (%s: %s); %s",
                type(first).__name__,
                first,
                "relaunching the browser" if wedged else "retrying",
            )
            try:
                if wedged:  # a shared browser is only torn down when it is dead or not answering
                    self.host.run(self.host.drop_browser(), timeout=30)
                outcome = self.host.run(self._open(url), timeout=self._step_budget_s + 60)
            except Exception as second:
                self._over = True
                raise BrowserError(
                    f"could not open {url} in Chromium after a relaunch: {type(second).__name__}: {second}"
                ) from second
        lines = [
            f"Task: {task.instruction}",
            f"Commands: {GRAMMAR}. Send `done` when the task is finished.",
            f"You have {self.max_steps} steps.",
            "",
        ]
        if outcome.error:
            lines[3:3] = [f"Error: {outcome.error}"]
        obs = "\n".join(lines) + "\n" + (render_page(outcome.snap, self.max_lines) if outcome.snap else "")
        info = self._info(outcome, None)
        info["messages"] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs}]
        if self.offer_tools:
            info["tools"] = TOOLS
        return obs, info

    async def _open(self, url: str) -> _Outcome:
        await self._close_context()
        self._events.clear()
        self._pending_nav = self._failed_nav = None
        self._ctx = await self.host.new_context()
        self._ctx.on("page", self._on_new_page)
        self._page = await self._new_page()
        error = None
        try:
            await self._page.goto(url, wait_until="load", timeout=self.action_timeout_s * 2000)
        except Exception as exc:  # e.g. the start page hangs: report it, the episode still starts
            error = f"the start page {url} did not load: {_first_line(exc)}"
        self._last_good_url = url
        snap = await self._snapshot()
        return await self._finish(_Outcome(snap, error=error))

    async def _new_page(self) -> Any:
        self._opening_page = True  # the context's "page" event fires for our own tab too
        try:
            page = await self._ctx.new_page()
        finally:
            self._opening_page = False
        page.set_default_timeout(self.action_timeout_s * 1000)
        page.on("dialog", self._on_dialog)
        page.on("request", self._on_request)
        page.on("requestfinished", self._on_request_done)
        page.on("requestfailed", self._on_request_failed)
        page.on("crash", lambda _p: self._events.append("the page crashed"))
        return page

    async def _close_context(self) -> None:
        ctx, self._ctx, self._page = self._ctx, None, None
        if ctx is not None:
            try:
                await asyncio.wait_for(ctx.close(), 10)
            except Exception as exc:  # the browser may be dead; the context goes with it
                log.debug("closing gui browser context failed: %s", exc)

    # -- page events (run on the browser thread) ------------------------------------------
    async def _on_dialog(self, dialog: Any) -> None:
        self._events.append(
            f"a dialog ({dialog.type}) said {json.dumps(dialog.message[:200])}; it was accepted"
        )
        try:
            await dialog.accept()
        except Exception as exc:  # the page may be gone already
            log.debug("accepting dialog failed: %s", exc)

    def _on_new_page(self, page: Any) -> None:
        # Handled after the action (see _follow_popups); an event handler must not raise.
        if not self._opening_page and page is not self._page:
            self._popups.append(page)

    async def _follow_popups(self) -> None:
        """Tabs are not supported: close any new tab, and open an in-app target in the current tab."""
        popups, self._popups = self._popups, []
        for popup in popups:
            if popup.url == "about:blank":  # its navigation may not have started yet
                try:
                    await popup.wait_for_load_state("commit", timeout=2000)
                except Exception as exc:  # a tab that stays blank is reported as such
                    log.debug("popup did not navigate: %s", exc)
            target = popup.url
            try:
                await asyncio.wait_for(popup.close(), 5)
            except Exception as exc:  # already closed by the page itself
                log.debug("closing popup failed: %s", exc)
            if self._same_site(target):
                await self._page.goto(target, wait_until="load", timeout=self.action_timeout_s * 1000)
                self._events.append(
                    f"the action opened a new tab at {target}; only one tab is supported, "
                    "so that page was opened in the current tab instead"
                )
            else:
                self._events.append(
                    f"the action tried to open a new tab at {target}, which is outside "
                    "the app; the tab was closed"
                )

    def _same_site(self, url: str) -> bool:
        here, base = urlsplit(url), urlsplit(self.server.base_url)
        return (here.scheme, here.netloc) == (base.scheme, base.netloc)

    # Event handlers run inside Playwright's dispatcher, where an exception would surface in
    # unrelated calls: each one only records plain values.
    def _on_request(self, request: Any) -> None:
        try:
            if (
                self._page is not None
                and request.is_navigation_request()
                and request.frame == self._page.main_frame
            ):
                self._pending_nav = request.url
        except Exception as exc:  # a request of a page being torn down
            log.debug("request event: %s", exc)

    def _on_request_done(self, request: Any) -> None:
        if request.url == self._pending_nav:
            self._pending_nav = None

    def _on_request_failed(self, request: Any) -> None:
        try:
            if request.url == self._pending_nav:
                self._pending_nav = None
            if request.is_navigation_request():
                self._failed_nav = (request.url, str(request.failure or "failed"))
                self._nav_failed_now = True
        except Exception as exc:  # a request of a page being torn down
            log.debug("requestfailed event: %s", exc)

    # -- step -----------------------------------------------------------------------------
    def step(self, action: str | dict[str, Any]) -> StepResult:
        """Apply one command; never raises for bad actions or browser faults.

        ``action`` is text, one tool call dict, or a whole assistant message (``content`` /
        ``tool_calls``); ``info["messages"]`` holds the observation as the chat message(s) to
        append — ``tool`` messages answering each tool call, or one ``user`` message.
        """
        wrapped = unwrap(action)
        obs, reward, terminated, truncated, info = self._step(wrapped)
        info["messages"] = self._messages(obs, wrapped)
        info["next_state_role"] = "tool" if wrapped.native else "environment"
        return obs, reward, terminated, truncated, info

    def _messages(self, obs: str, wrapped: Unwrapped) -> list[dict[str, Any]]:
        if not wrapped.native:
            return [{"role": "user", "content": obs}]
        msgs = [
            {
                "role": "tool",
                "tool_call_id": wrapped.tool_call_ids[0],
                "name": wrapped.tool_names[0],
                "content": obs,
            }
        ]
        for call_id, name in zip(wrapped.tool_call_ids[1:], wrapped.tool_names[1:], strict=True):
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": name,
                    "content": "Not run: one action per step; only the first tool call was applied.",
                }
            )
        return msgs

    def _step(self, wrapped: Unwrapped) -> TextStepResult:
        if self._task is None or self._closed:
            return self._ended_result("there is no episode: call reset() first")
        if self._over:
            return self._ended_result("the episode is over: call reset() to start a new one")
        self._steps += 1
        extra = len(wrapped.tool_call_ids) - 1
        ignored = (
            (
                f"the reply made {extra + 1} tool calls; one action per step, so only the first "
                f"({wrapped.tool_names[0]}) was applied",
            )
            if extra > 0
            else ()
        )
        try:
            act = parse_action(wrapped.action)
        except ActionError as exc:
            raw = wrapped.action
            shown = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
            outcome = self._screenshot_only(
                _Outcome(self._snap, error=f"could not parse the action: {exc}", events=ignored)
            )
            return self._result(outcome, header=f"Action: {shown.strip()[:120]!r}", act=None)
        if act.kind == "done":
            return self._result(
                self._screenshot_only(_Outcome(self._snap, events=ignored)),
                header="Action: done",
                act=act,
                done=True,
            )
        try:
            outcome = self.host.run(self._guarded(act), timeout=self._step_budget_s)
        except TimeoutError:
            outcome = self._abandon(f"the browser did not answer at all within {self._step_budget_s:.0f}s")
        except Exception as exc:  # the host itself failed (closed, crashed loop): end the episode
            outcome = self._abandon(f"{type(exc).__name__}: {exc}")
        if ignored:
            outcome.events = ignored + outcome.events
        return self._result(outcome, header=f"Action: {act.describe()}", act=act)

    def _screenshot_only(self, outcome: _Outcome) -> _Outcome:
        """Steps that do not touch the page still get their screenshot (one PNG per step)."""
        if self.screenshot_dir is None:
            return outcome
        try:
            return self.host.run(self._finish(outcome), timeout=self.action_timeout_s + 5)
        except Exception as exc:  # a screenshot is a debugging aid; never fail the step for it
            outcome.screenshot_error = f"{type(exc).__name__}: {exc}"
            return outcome

    def _abandon(self, why: str) -> _Outcome:
        """The browser is unusable for this episode; the next reset starts afresh."""
        log.warning("gui episode abandoned: %s", why)
        return _Outcome(
            self._snap,
            fatal=True,
            error=f"{why}. The browser is not usable for this episode; it ends here — "
            "reset() starts a new one (and relaunches the browser if needed).",
        )

    async def _guarded(self, act: Action) -> _Outcome:
        """Perform the action with every fault turned into an outcome."""
        from playwright.async_api import Error as PlaywrightError

        self._events.clear()
        self._nav_failed_now = False
        # _failed_nav is kept: a navigation that failed after the last step's read is this
        # step's to report (_check_site names its address instead of the error page's)
        before = self._snap
        error: str | None = None
        try:
            error = await asyncio.wait_for(self._perform(act), timeout=self.action_timeout_s * 2)
        except _ActError as exc:
            error = str(exc)
        except TimeoutError as exc:
            error = await self._recover_timeout(act, exc)
        except PlaywrightError as exc:
            if not self.host.connected:
                return _Outcome(
                    before,
                    fatal=True,
                    error=(
                        f"the browser crashed or was closed ({_first_line(exc)}). The episode cannot "
                        "continue — reset() starts a new one and relaunches the browser."
                    ),
                )
            if "Timeout" in type(exc).__name__:
                error = await self._recover_timeout(act, exc)
            elif self._page is None or self._page.is_closed() or "crash" in str(exc).lower():
                error = await self._reopen(f"the page crashed ({_first_line(exc)})")
            else:
                error = f"{act.describe()} failed: {_first_line(exc)}"
        if not self.host.connected:
            return _Outcome(
                before,
                fatal=True,
                error="the browser crashed or was closed during the "
                "action. The episode cannot continue — reset() starts a new one.",
            )
        try:
            away, snap = await self._settled_read()
            if away:
                error = f"{error}; {away}" if error else away
            # A new tab's event arrives a moment after the click returns — by now (a round trip
            # to the page later) it has; follow it and read the page again.
            if self._popups:
                await self._follow_popups()
                snap = await asyncio.wait_for(self._snapshot(), timeout=self.action_timeout_s * 2)
        except Exception as exc:
            if not self.host.connected:
                return _Outcome(
                    before,
                    fatal=True,
                    error="the browser crashed or was closed. The "
                    "episode cannot continue — reset() starts a new one.",
                )
            reopened = await self._reopen(f"the page could not be read ({_first_line(exc)})")
            error = f"{error}; {reopened}" if error else reopened
            snap = await asyncio.wait_for(self._snapshot(), timeout=self.action_timeout_s * 2)
        return await self._finish(
            _Outcome(snap, error=error, events=tuple(self._events), changes=tuple(diff(before, snap)))
        )

    async def _perform(self, act: Action) -> str | None:
        """Carry the action out; returns a non-fatal error message or None."""
        page, snap = self._page, self._snap
        ms = self.action_timeout_s * 1000
        if act.kind == "scroll":
            sign = 1 if act.direction == "down" else -1
            moved = await page.evaluate(
                "d => { const y = window.scrollY; window.scrollBy(0, d * Math.round(window.innerHeight * 0.8));"
                " return window.scrollY - y; }",
                sign,
            )
            if not moved:
                return f"the page is already at the {'bottom' if sign > 0 else 'top'}; nothing to scroll"
            return None
        if act.kind == "back":
            url = page.url
            resp = await page.go_back(wait_until="load", timeout=ms)
            if page.url == "about:blank":  # the blank tab the episode started from: undo
                await page.go_forward(wait_until="load", timeout=ms)
                return "there is no previous page to go back to"
            if resp is None and page.url == url:
                return "there is no previous page to go back to"
            return None
        assert snap is not None and act.element is not None
        found = snap.control(act.element)
        if found is None:
            was = self._registry.last_seen.get(act.element)
            where = f" (it was {was} on an earlier page)" if was else ""
            raise _ActError(
                f"there is no element [{act.element}] on this page{where}; use an id from "
                "the element list below"
            )
        idx, item = found
        loc = page.locator(f'[data-oc-idx="{idx}"]')
        if await loc.count() != 1:
            raise _ActError(
                f"element [{act.element}] changed since the page was read; look at the "
                "current element list and try again"
            )
        label = f"[{act.element}] {item.role} {json.dumps(item.name, ensure_ascii=False)}"
        if item.disabled:
            raise _ActError(f"{label} is disabled")
        if act.kind == "click":
            if item.new_tab:
                # The new tab's event can trail the click; wait for it so this step reports it.
                async with self._ctx.expect_page(timeout=ms):
                    await loc.click(timeout=ms)
            else:
                await loc.click(timeout=ms)
        elif act.kind == "type":
            if item.role not in TEXT_ROLES:
                raise _ActError(
                    f"cannot type into {label}: type works on text boxes; "
                    + (
                        "use select for a drop-down"
                        if item.options is not None
                        else "use click for buttons, links and check boxes"
                    )
                )
            await loc.fill(act.text or "", timeout=ms)
        elif act.kind == "select":
            if item.options is None:
                raise _ActError(f"cannot select in {label}: select works on drop-downs (combobox)")
            wanted = (act.text or "").strip()
            match = next((o for o in item.options if o == wanted), None) or next(
                (o for o in item.options if o.lower() == wanted.lower()), None
            )
            if match is None:
                raise _ActError(f"{label} has no option {wanted!r}; options: {list(item.options)}")
            await loc.select_option(label=match, timeout=ms)
        # Clicks that submit a form navigate; let the new page finish loading before reading it.
        await page.wait_for_load_state("load", timeout=ms)
        return None

    async def _recover_timeout(self, act: Action, exc: BaseException) -> str:
        """After a timeout: stop a hanging load, or replace a frozen tab; say which."""
        page = self._page
        pending = self._pending_nav
        limit = f"{self.action_timeout_s:g}s"
        if pending:
            # A navigation that never answers blocks page scripts until it is stopped; the
            # DevTools protocol can stop it from outside the page.
            try:
                cdp = await asyncio.wait_for(self._ctx.new_cdp_session(page), 2.0)
                await asyncio.wait_for(cdp.send("Page.stopLoading"), 2.0)
                await asyncio.wait_for(cdp.detach(), 2.0)
                await asyncio.wait_for(page.evaluate("1"), 2.0)
                self._pending_nav = None
                return (
                    f"{act.describe()} timed out: the page {pending} did not answer within {limit}; "
                    "loading was stopped and the previous page is still shown"
                )
            except Exception as stop_exc:  # could not stop it: fall back to a new tab below
                log.debug("stopping a hanging load failed: %s", stop_exc)
                return await self._reopen(
                    f"{act.describe()} timed out: the page {pending} did not answer within {limit}"
                )
        try:
            await asyncio.wait_for(page.evaluate("1"), 2.0)
            responsive = True
        except Exception:  # frozen renderer (script loop) or a dead page
            responsive = False
        if responsive:
            reason = _first_line(exc) if not isinstance(exc, TimeoutError) else "no response"
            return f"{act.describe()} did not complete within {limit} ({reason})"
        return await self._reopen(
            f"{act.describe()} timed out: the page stopped responding for more "
            f"than {limit} (a script on it seems stuck)"
        )

    async def _reopen(self, why: str) -> str:
        """Close the current tab and load the last good URL in a new one (app state is server-side)."""
        old = self._page
        if old is not None:
            try:
                await asyncio.wait_for(old.close(run_before_unload=False), 5)
            except Exception as exc:  # the renderer may be wedged; closing the target still frees it
                log.debug("closing a stuck page failed: %s", exc)
        self._page = await self._new_page()
        self._pending_nav = None
        await self._page.goto(self._last_good_url, wait_until="load", timeout=self.action_timeout_s * 1000)
        return f"{why}; the tab was closed and {self._last_good_url} was opened again in a new one"

    async def _settled_read(self) -> tuple[str | None, Snapshot]:
        """Check where the page is, then read it; again if a navigation started in between.

        A click on a link can return before its navigation begins, so the site check may see the
        old page and the read then hits a page being replaced ("Execution context was
        destroyed"). That is a navigation, not a broken page: wait for it to land and look again.
        """
        from playwright.async_api import Error as PlaywrightError

        await self._let_navigation_land()
        away: str | None = None
        for attempt in range(3):
            away = await self._check_site() or away  # a return home already made is still reported
            try:
                return away, await asyncio.wait_for(self._snapshot(), timeout=self.action_timeout_s * 2)
            except PlaywrightError as exc:
                if attempt == 2 or "context was destroyed" not in str(exc):
                    raise
                await self._page.wait_for_load_state("load", timeout=self.action_timeout_s * 1000)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _let_navigation_land(self) -> None:
        """A click on a link leaving the app returns before the browser has committed the error page
        of the blocked request. One round trip to the page lets the request's failure be seen; if
        the action's navigation failed and its error page is not shown yet, wait for it (briefly),
        so this step reports where the action led rather than the next one."""
        page = self._page
        start_url = page.url
        with contextlib.suppress(Exception):  # a page being replaced: the read below deals with it
            await asyncio.wait_for(page.evaluate("1"), 2.0)
        if not self._nav_failed_now or page.url != start_url:
            return
        with contextlib.suppress(Exception):  # it never commits (e.g. a download): nothing to wait for
            await page.wait_for_url(lambda url: url != start_url, timeout=1500)
            await page.wait_for_load_state("load", timeout=self.action_timeout_s * 1000)

    async def _check_site(self) -> str | None:
        """If the page left the app (another site, a blocked address), go back to the last app URL."""
        url = self._page.url
        base = urlsplit(self.server.base_url)
        here = urlsplit(url)
        if (here.scheme, here.netloc) == (base.scheme, base.netloc):
            self._last_good_url = url
            return None
        target = url
        if here.scheme == "chrome-error" and self._failed_nav is not None:
            target = self._failed_nav[0]
        self._failed_nav = None
        why = (
            "it is outside the local network the browser may use, so the request was blocked"
            if not is_loopback_url(target)
            else "it is not part of the app"
        )
        await self._page.goto(self._last_good_url, wait_until="load", timeout=self.action_timeout_s * 1000)
        return (
            f"the action navigated away from the app to {target}: {why}. "
            f"The browser was returned to {self._last_good_url}"
        )

    async def _snapshot(self) -> Snapshot:
        raw = await self._page.evaluate(SNAPSHOT_JS)
        return build_snapshot(raw, self._registry)

    async def _finish(self, outcome: _Outcome) -> _Outcome:
        """Store the new snapshot and take the screenshot, if asked for."""
        if outcome.snap is not None:
            self._snap = outcome.snap
        if self.screenshot_dir is not None and self._page is not None and not outcome.fatal:
            task_id = self._task.id if self._task else "none"
            path = (
                self.screenshot_dir / f"{self._uid}-ep{self._episode:03d}-{task_id}-step{self._steps:02d}.png"
            )
            try:
                await asyncio.wait_for(
                    self._page.screenshot(path=str(path), timeout=self.action_timeout_s * 1000),
                    self.action_timeout_s + 2,
                )
                outcome.screenshot = str(path)
            except Exception as exc:  # a screenshot is a debugging aid; never fail the step for it
                outcome.screenshot_error = _first_line(exc)
        return outcome

    # -- results --------------------------------------------------------------------------
    def _info(self, outcome: _Outcome, act: Action | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "next_state_role": "environment",
            "task": self._task.id if self._task else None,
            "task_id": self._task.id if self._task else None,
            "instruction": self._task.instruction if self._task else None,
            "step": self._steps,
            "action": act.describe() if act else None,
            "error": outcome.error,
            "events": list(outcome.events),
            "url": outcome.snap.url if outcome.snap else None,
            "screenshot": outcome.screenshot,
        }
        if outcome.screenshot_error:
            info["screenshot_error"] = outcome.screenshot_error
        return info

    def _result(
        self, outcome: _Outcome, header: str, act: Action | None, done: bool = False
    ) -> TextStepResult:
        lines = [f"Step {self._steps} of {self.max_steps}. {header}"]
        if outcome.error:
            lines.append(f"Error: {outcome.error}")
        lines.extend(f"Event: {e}" for e in outcome.events)
        terminated = done
        truncated = outcome.fatal or (not done and self._steps >= self.max_steps)
        info = self._info(outcome, act)
        reward = 0.0
        if terminated or truncated:
            self._over = True
            passed, reason = self.check()
            info["success"], info["check"] = passed, reason
            reward = 1.0 if passed else 0.0
            verdict = ("passed — " if passed else "FAILED — ") + reason + "."
            if done:
                lines.append("You declared the task done. Check: " + verdict)
            elif outcome.fatal:
                lines.append("The episode ended early. Check: " + verdict)
            else:
                lines.append(
                    f"The step limit ({self.max_steps}) is reached; the episode is over. Check: " + verdict
                )
        if done or outcome.fatal:
            return "\n".join(lines), reward, terminated, truncated, info
        if act is not None:  # an action ran: say what it changed (a parse error changed nothing)
            lines.append("Changes:" if outcome.changes else "No visible change on the page.")
            lines.extend(f"  {c}" for c in outcome.changes)
        snap = outcome.snap or self._snap
        if snap is not None:
            lines += ["", render_page(snap, self.max_lines)]
        return "\n".join(lines), reward, terminated, truncated, info

    def _ended_result(self, message: str) -> TextStepResult:
        info: dict[str, Any] = {
            "next_state_role": "environment",
            "task": self._task.id if self._task else None,
            "task_id": self._task.id if self._task else None,
            "step": self._steps,
            "action": None,
            "error": message,
            "events": [],
            "url": None,
            "screenshot": None,
        }
        return f"Error: {message}", 0.0, False, True, info

    # -- close ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the browser context, the app server and (if owned) the browser; safe twice."""
        if self._closed:
            return
        self._closed = True
        self._over = True
        try:
            if not self.host.closed:
                self.host.run(self._close_context(), timeout=20)
        except Exception as exc:  # cleanup must not raise; a dead browser has nothing to close
            log.debug("closing gui context failed: %s", exc)
        self.server.stop()
        if self._own_host:
            self.host.close()
