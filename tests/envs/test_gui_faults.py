"""gui faults: bad actions, hanging and frozen pages, leaving the site, tabs, dialogs, a killed browser.

Each fault must come back as an observation with a clear message (never an exception), and the
environment must keep working: the next action succeeds, or ``reset()`` starts a good episode.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from openclaw_rl.envs.gui import BrowserError, GuiEnv, parse_action
from openclaw_rl.envs.gui.actions import ActionError
from openclaw_rl.envs.gui.oracle import Driver, solve_todo_add

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def env(host):
    e = GuiEnv(browser=host, max_steps=30, action_timeout_s=1.5)
    yield e
    e.close()


@pytest.fixture
def d(env) -> Driver:
    return Driver(env)


def faults(d: Driver) -> None:
    d.reset("todo_add", start_path="/_faults")
    assert "Page: Fault playground" in d.obs


def assert_alive(d: Driver) -> None:
    """After a fault the same episode still works: go to the todos and solve the task."""
    d.click("link", "Todos")
    solve_todo_add(d)
    reward, info = d.done()
    assert reward == 1.0, info["check"]


@pytest.mark.parametrize(
    "action, message",
    [
        ("click 999", "there is no element [999] on this page"),
        ("blah blah", "could not parse the action: not a command: 'blah blah'"),
        ("", "the action is empty"),
        ("click", "click needs an element id"),
        ("type 3", "type needs text after the id"),
        ("scroll sideways", "scroll needs a direction, up or down"),
        ({"name": "click", "arguments": "{not json"}, "arguments are not valid JSON"),
        ({"name": "fly", "arguments": {}}, "unknown tool 'fly'"),
        ({"arguments": {"id": 1}}, "tool call has no 'name'"),
    ],
)
def test_bad_actions_become_error_observations(d: Driver, action, message):
    d.reset("todo_add")
    page_before = d.obs.split("\n\n", 1)[1]
    _, term, trunc, info = d.step(action, ok=False)
    assert not term and not trunc
    assert message in info["error"], info["error"]
    assert d.obs.splitlines()[1].startswith("Error: ")
    assert page_before in d.obs  # the agent still sees the page it can act on
    d.type("New todo", "Buy milk")  # and the episode goes on
    assert 'value="Buy milk"' in d.obs


def test_wrong_element_kinds(d: Driver):
    d.reset("settings_dark")
    save, theme = d.id("button", "Save settings"), d.id("combobox", "Theme")
    d.step(f'type {save} "hello"', ok=False)
    assert f'cannot type into [{save}] button "Save settings"' in d.info["error"]
    d.step(f'type {theme} "Dark"', ok=False)
    assert "use select for a drop-down" in d.info["error"]
    d.step(f'select {theme} "Purple"', ok=False)
    assert "has no option 'Purple'; options: ['Light', 'Dark', 'System']" in d.info["error"]
    d.step(f'select {theme} "dark"')  # case-insensitive match of the visible text
    assert 'value="Dark"' in d.obs


def test_id_from_an_earlier_page(d: Driver):
    d.reset("todo_add")
    add = d.id("button", "Add")
    d.click("link", "Settings")
    d.step(f"click {add}", ok=False)
    assert d.info["error"].startswith(
        f'there is no element [{add}] on this page (it was [{add}] button "Add"'
    )


def test_hanging_request_times_out(d: Driver):
    faults(d)
    t0 = time.monotonic()
    _, term, trunc, info = d.step(f"click {d.id('link', 'Slow report')}", ok=False)
    assert time.monotonic() - t0 < 15
    assert not term and not trunc
    assert "/_faults/hang did not answer within 1.5s" in info["error"]
    assert "Page: Fault playground" in d.obs
    assert_alive(d)


def test_frozen_page_is_replaced(d: Driver):
    faults(d)
    _, term, trunc, info = d.step(f"click {d.id('button', 'Freeze page')}", ok=False)
    assert not term and not trunc
    assert "the page stopped responding" in info["error"] and "opened again in a new one" in info["error"]
    assert "Page: Fault playground" in d.obs
    assert_alive(d)


@pytest.mark.parametrize(
    "link, why",
    [
        ("External docs", "to http://example.com/: it is outside the local network the browser may use"),
        ("Other local port", "to http://127.0.0.1:9/: it is not part of the app"),
    ],
)
def test_leaving_the_site_is_blocked_and_undone(d: Driver, link, why):
    faults(d)
    d.step(f"click {d.id('link', link)}", ok=False)
    assert f"the action navigated away from the app {why}" in d.info["error"]
    assert "The browser was returned to" in d.info["error"]
    assert "Page: Fault playground" in d.obs and d.info["url"].endswith("/_faults")
    assert_alive(d)


@pytest.mark.parametrize("delay_ms", [0, 20, 60, 150])
def test_leaving_after_the_click_returned_is_caught_too(d: Driver, delay_ms: int):
    """A script that leaves a moment after the click (the click has returned, the page is being
    read) is a navigation like any other: reported and undone, by this step or the next, never
    taken for a broken page."""
    faults(d)
    d.env.host.run(_set_delay(d.env, delay_ms), timeout=10)
    _, term, trunc, info = d.step(f"click {d.id('button', 'Leave shortly')}", ok=False)
    errors = [info["error"] or ""]
    if "navigated away" not in errors[0]:
        time.sleep(0.5)  # it landed after this step's read: the next look must catch it
        _, term, trunc, info = d.step("scroll down", ok=False)
        errors.append(info["error"] or "")
    assert not term and not trunc
    assert any("the action navigated away from the app to http://example.com/" in e for e in errors), errors
    assert not any("could not be read" in e for e in errors), errors
    assert "Page: Fault playground" in d.obs and d.info["url"].endswith("/_faults")
    assert_alive(d)


async def _set_delay(env: GuiEnv, ms: int) -> None:
    await env._page.evaluate("ms => { document.querySelector('[data-ms]').dataset.ms = ms }", ms)


def test_new_tab_opens_in_the_current_tab(d: Driver):
    faults(d)
    d.click("link", "Todos in a new tab")
    assert any("opened a new tab" in e for e in d.info["events"])
    assert "Page: Todo list" in d.obs
    assert len(d.env.host.run(_pages(d.env), timeout=10)) == 1


async def _pages(env: GuiEnv) -> list:
    return list(env._ctx.pages)


def test_dialog_is_reported_and_accepted(d: Driver):
    faults(d)
    d.click("button", "Show dialog")
    assert d.info["events"] == ['a dialog (alert) said "Hello from a dialog"; it was accepted']
    assert 'Event: a dialog (alert) said "Hello from a dialog"' in d.obs
    d.click("button", "Change title")
    assert 'Title changed: "Fault playground" -> "Changed title"' in d.obs


def test_crashed_tab_is_reopened(d: Driver):
    d.reset("todo_add")
    renderers = [
        p["id"] for p in d.env.host.run(d.env.host.processes(), timeout=10) if p["type"] == "renderer"
    ]
    assert renderers
    for pid in renderers:  # kill the page's renderer: the tab crashes, the browser lives on
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    _, term, trunc, info = d.step(f"click {d.id('button', 'Add')}", ok=False)
    assert not term and not trunc
    assert "the page crashed" in info["error"] and "opened again in a new one" in info["error"]
    assert "Page: Todo list" in d.obs
    solve_todo_add(d)
    assert d.done()[0] == 1.0


def test_steps_outside_an_episode(host):
    env = GuiEnv(browser=host)
    try:
        obs, reward, term, trunc, info = env.step("click 1")
        assert trunc and "call reset() first" in obs and info["error"]
        env.reset(options={"task": "todo_add"})
        _, _, term, _, _ = env.step("done")
        assert term
        obs, _, _, trunc, _ = env.step("click 1")
        assert trunc and "the episode is over" in obs
    finally:
        env.close()
    env.close()  # twice is fine


def test_bad_constructor_and_reset_arguments(host):
    with pytest.raises(KeyError, match="unknown gui task 'nope'; known:"):
        GuiEnv(browser=host, tasks=["nope"])
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        GuiEnv(browser=host, max_steps=0)
    env = GuiEnv(browser=host)
    try:
        with pytest.raises(ValueError, match="unknown reset options"):
            env.reset(options={"taks": "todo_add"})
        with pytest.raises(ValueError, match="start_path must be a path"):
            env.reset(options={"task": "todo_add", "start_path": "http://example.com/"})
    finally:
        env.close()


def test_missing_chromium_says_how_to_fix():
    """Found when the environment is built, so the environment service can skip the type."""
    from openclaw_rl.envs import EnvUnavailable

    with pytest.raises(BrowserError, match="Chromium not found at '/nonexistent/chromium'") as info:
        GuiEnv(chromium_path="/nonexistent/chromium")
    assert isinstance(info.value, EnvUnavailable)


def test_killed_browser_ends_episode_and_reset_relaunches():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not installed")
    env = GuiEnv(max_steps=10, action_timeout_s=2.0)  # its own browser: this test kills it
    try:
        d = Driver(env)
        d.reset("todo_add")
        pid = env.host.pid
        assert pid and env.host.launches == 1
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while env.host.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        _, term, trunc, info = d.step(f"click {d.id('button', 'Add')}", ok=False)
        assert trunc and not term
        assert "the browser crashed or was closed" in info["error"]
        assert "reset() starts a new one" in d.obs
        assert info["success"] is False
        d.reset("todo_add")  # relaunches Chromium
        assert env.host.launches == 2 and env.host.pid != pid
        solve_todo_add(d)
        assert d.done()[0] == 1.0
    finally:
        env.close()


def test_parser_accepts_documented_forms():
    assert parse_action("click 3") == parse_action("CLICK [3]") == parse_action("click #3")
    a = parse_action('type 5 "say \\"hi\\""')
    assert (a.kind, a.element, a.text) == ("type", 5, 'say "hi"')
    assert parse_action("type [5] hello world").text == "hello world"
    assert parse_action("select 2 'Price: low to high'").text == "Price: low to high"
    assert parse_action("Action: scroll DOWN").direction == "down"
    assert parse_action("I think we are finished.\ndone").kind == "done"
    assert parse_action({"name": "select", "arguments": {"id": "[4]", "option": "Dark"}}).element == 4
    assert parse_action({"type": "function", "function": {"name": "back", "arguments": ""}}).kind == "back"
    # a call the model wrote as text means what it means to the tool_call environment
    assert parse_action('{"name": "click", "arguments": {"id": 4}}').element == 4
    assert parse_action('<tool_call>{"name": "click", "arguments": {"id": 10}}</tool_call>').element == 10
    with pytest.raises(ActionError, match="tool call is not valid JSON"):
        parse_action("<tool_call>{click 3</tool_call>")
    with pytest.raises(ActionError, match="click takes only an element id"):
        parse_action("click 3 4")
    with pytest.raises(ActionError, match="at most 2000"):
        parse_action("type 1 " + "x" * 2001)
    with pytest.raises(ActionError, match="'id' must be an element number"):
        parse_action({"name": "click", "arguments": {"id": "Add"}})
