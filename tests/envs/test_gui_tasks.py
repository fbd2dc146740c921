"""gui tasks in a real headless Chromium: every task solved by its oracle and failed by a wrong run.

One Chromium is shared by the whole module (a module-scoped BrowserHost); each test resets the
environment, which seeds fresh server-side app state and opens a fresh browser context.
"""

from __future__ import annotations

import json
import re

import pytest

from openclaw_rl.envs import make, registered
from openclaw_rl.envs.gui import TASK_BY_ID, TASKS, GuiEnv
from openclaw_rl.envs.gui.oracle import ORACLES, Driver
from openclaw_rl.envs.gui.tasks import lighting_under_30

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def env(host):
    e = make("gui", browser=host, max_steps=40, action_timeout_s=4.0)
    yield e
    e.close()


@pytest.fixture
def d(env) -> Driver:
    return Driver(env)


# -- wrong runs: plausible mistakes the checkers must catch ----------------------------------


def wrong_contact(d: Driver) -> None:
    d.type("Name", "Ada Lovelace")
    d.type("Email", "ada@example")  # invalid: the server refuses it, nothing is sent
    d.select("Topic", "Billing")
    d.type("Message", "Please resend my March invoice.")
    d.click("button", "Send message")
    assert 'alert "Enter a valid email address."' in d.obs


def wrong_register(d: Driver) -> None:  # forgets to pick the Pro plan
    d.type("Username", "grace")
    d.type("Password", "Compiler#1952")
    d.type("Confirm password", "Compiler#1952")
    d.click("checkbox", "I accept the terms")
    d.click("button", "Create account")


def wrong_todo_add(d: Driver) -> None:  # adds it twice
    for _ in range(2):
        d.type("New todo", "Buy milk")
        d.click("button", "Add")


def wrong_todo_complete(d: Driver) -> None:
    d.click("button", "Complete Call mom")


def wrong_todo_delete(d: Driver) -> None:
    d.click("button", "Delete Pay rent")


def wrong_todo_clear_done(d: Driver) -> None:  # un-completes instead of deleting
    d.click("button", "Undo Water plants")
    d.click("button", "Delete Return library books")


def wrong_settings_dark(d: Driver) -> None:  # never saves
    d.select("Theme", "Dark")


def wrong_settings_language(d: Driver) -> None:  # forgets SMS
    d.select("Language", "Deutsch")
    d.click("checkbox", "Email notifications")
    d.click("button", "Save settings")


def wrong_settings_name(d: Driver) -> None:
    d.type("Display name", "Captain Bob")
    d.click("button", "Save settings")


def wrong_cheapest_garden(d: Driver) -> None:  # cheapest, but out of stock
    d.select("Category", "Garden")
    d.click("button", "Apply")
    d.click("button", "Add Garden Gloves to wishlist")


def wrong_lighting(d: Driver) -> None:  # takes the $30 lamp too
    d.select("Category", "Lighting")
    d.click("checkbox", "In stock only")
    d.click("button", "Apply")
    for name in [*lighting_under_30(), "Desk Lamp"]:
        d.click("button", f"Add {name} to wishlist")


def wrong_office_filter(d: Driver) -> None:  # forgets "in stock only"
    d.select("Category", "Office")
    d.select("Sort by", "Price: high to low")
    d.click("button", "Apply")


def wrong_checkout_mug(d: Driver) -> None:  # short card number: the order is never placed
    d.click("button", "Add Blue Mug to cart")
    d.click("link", "Cart")
    d.click("link", "Proceed to checkout")
    d.type("Full name", "Ada Lovelace")
    d.type("Street address", "12 Analytical St")
    d.type("City", "London")
    d.click("button", "Continue to payment")
    d.type("Card number (leave empty for invoice)", "4242")
    d.click("button", "Review order")
    assert 'alert "Card number must have 16 digits."' in d.obs


def wrong_checkout_multi(d: Driver) -> None:  # never updates the quantity
    d.click("button", "Add Notebook to cart")
    d.click("button", "Add Pen to cart")
    d.click("link", "Cart")
    d.select("Quantity of Notebook", "3")  # selected but "Update cart" not pressed
    d.click("link", "Proceed to checkout")
    d.type("Full name", "Ada Lovelace")
    d.type("Street address", "12 Analytical St")
    d.type("City", "London")
    d.select("Shipping method", "Express")
    d.click("button", "Continue to payment")
    d.click("radio", "Invoice")
    d.click("button", "Review order")
    d.click("button", "Place order")


WRONG = {
    "contact_billing": wrong_contact,
    "register_pro": wrong_register,
    "todo_add": wrong_todo_add,
    "todo_complete": wrong_todo_complete,
    "todo_delete": wrong_todo_delete,
    "todo_clear_done": wrong_todo_clear_done,
    "settings_dark": wrong_settings_dark,
    "settings_language": wrong_settings_language,
    "settings_name": wrong_settings_name,
    "products_cheapest_garden": wrong_cheapest_garden,
    "products_lighting_under_30": wrong_lighting,
    "products_office_filter": wrong_office_filter,
    "checkout_mug": wrong_checkout_mug,
    "checkout_multi": wrong_checkout_multi,
}


def test_every_task_has_an_oracle_and_a_wrong_run():
    assert len(TASKS) >= 12
    assert set(ORACLES) == set(TASK_BY_ID) == set(WRONG)
    assert {t.app for t in TASKS} >= {"contact", "todos", "settings", "products", "shop"}


@pytest.mark.parametrize("task_id", [t.id for t in TASKS])
def test_oracle_solves_task(d: Driver, task_id: str):
    d.reset(task_id)
    assert d.env.check()[0] is False, "the task must not be solved before the agent acts"
    ORACLES[task_id](d)
    reward, info = d.done()
    assert info["success"] is True, info["check"]
    assert reward == 1.0
    assert "Check: passed" in d.obs


@pytest.mark.parametrize("task_id", [t.id for t in TASKS])
def test_wrong_sequence_fails_task(d: Driver, task_id: str):
    d.reset(task_id)
    WRONG[task_id](d)
    reward, info = d.done()
    assert info["success"] is False
    assert reward == 0.0
    assert "Check: FAILED" in d.obs and info["check"] in d.obs


# -- observation format ----------------------------------------------------------------------


def test_registered_and_first_observation(env: GuiEnv, d: Driver):
    assert "gui" in registered()
    assert isinstance(env, GuiEnv)
    obs = d.reset("todo_add")
    assert obs.startswith("Task: Add a todo 'Buy milk' to the todo list.")
    assert "Page: Todo list" in obs and re.search(r"^URL: http://127\.0\.0\.1:\d+/todos$", obs, re.M)
    assert re.search(r'^\[\d+\] textbox "New todo" value=""$', obs, re.M)
    assert re.search(r'^\[\d+\] button "Add"$', obs, re.M)
    assert 'heading "Todo list"' in obs and 'text "Pay rent"' in obs
    assert d.info["next_state_role"] == "environment" and d.info["task"] == "todo_add"
    system, user = d.info["messages"]
    assert system["role"] == "system" and "done" in system["content"]
    assert user == {"role": "user", "content": obs}
    assert "tools" not in d.info  # only with offer_tools=True


def test_changes_are_explicit(d: Driver):
    d.reset("todo_add")
    box = d.id("textbox", "New todo")
    d.step(f'type {box} "Buy milk"')
    assert "Changes:" in d.obs
    assert f'~ [{box}] textbox "New todo" value=""  ->  textbox "New todo" value="Buy milk"' in d.obs
    d.click("button", "Add")
    changes = d.obs.split("\n\nPage:")[0]
    assert "URL changed:" in changes and "/todos?added=1" in changes
    assert '+ text "Buy milk"' in changes
    assert '+ status "Todo added."' in changes
    assert '- text "3 of 5 open"' in changes and '+ text "4 of 6 open"' in changes


def test_ids_are_stable_across_pages(d: Driver):
    d.reset("todo_add")
    todos_link = d.id("link", "Todos")
    settings_link = d.id("link", "Settings")
    d.click("link", "Settings")
    assert "Page: Settings" in d.obs
    assert d.id("link", "Todos") == todos_link and d.id("link", "Settings") == settings_link
    d.step(f"click {todos_link}")
    assert "Page: Todo list" in d.obs


def test_tool_call_actions(d: Driver):
    d.reset("settings_name")
    name_box = d.id("textbox", "Display name")
    d.step({"name": "type", "arguments": {"id": name_box, "text": "Captain Ada"}})
    save = d.id("button", "Save settings")
    d.step({"type": "function", "function": {"name": "click", "arguments": json.dumps({"id": save})}})
    assert 'status "Settings saved."' in d.obs
    reward, info = d.done()
    assert reward == 1.0, info["check"]


def test_assistant_message_with_tool_calls(d: Driver):
    d.reset("todo_delete")
    delete = d.id("button", "Delete Call mom")
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "click", "arguments": json.dumps({"id": delete})},
            },
            {"id": "call_b", "type": "function", "function": {"name": "done", "arguments": "{}"}},
        ],
    }
    d.step(message)
    assert d.info["next_state_role"] == "tool"
    first, second = d.info["messages"]
    assert first == {"role": "tool", "tool_call_id": "call_a", "name": "click", "content": d.obs}
    assert second["tool_call_id"] == "call_b" and second["content"].startswith("Not run: one action per step")
    assert "Event: the reply made 2 tool calls; one action per step, so only the first (click)" in d.obs
    assert '- text "Call mom"' in d.obs
    d.step({"role": "assistant", "content": "done"})  # a message without tool calls acts with its text
    assert d.info["success"] is True and d.info["messages"] == [{"role": "user", "content": d.obs}]


def test_model_style_reply_with_reasoning(d: Driver):
    d.reset("todo_complete")
    button = d.id("button", "Complete Pay rent")
    d.step(f"The task wants Pay rent completed. The button for it is [{button}].\n```\nclick [{button}]\n```")
    assert '"Pay rent (completed)"' in d.obs


def test_scroll_moves_the_window_on_long_pages(d: Driver):
    d.reset("products_office_filter")
    assert "scroll down for more" in d.obs
    first_window = d.obs.split("Elements")[1]
    d.step("scroll down")
    assert "Scrolled: y=0 ->" in d.obs
    assert d.obs.split("Elements")[1] != first_window
    for _ in range(10):  # reach the bottom; one more scroll is an error, not a crash
        _, _, _, info = d.step("scroll down", ok=False)
        if info["error"]:
            break
    assert "already at the bottom" in d.info["error"]
    d.step("scroll up")


def test_back_navigation(d: Driver):
    d.reset("todo_add")
    first = d.info["url"]
    d.click("link", "Settings")
    d.step("back")
    assert d.info["url"] == first and "Page: Todo list" in d.obs
    d.reset("todo_add")
    d.step("back", ok=False)
    assert d.info["error"] == "there is no previous page to go back to"


def test_screenshots_saved_per_step(host, tmp_path):
    env = GuiEnv(browser=host, screenshot_dir=tmp_path / "shots", max_steps=5)
    try:
        d = Driver(env)
        d.reset("todo_delete")
        d.click("button", "Delete Call mom")
        d.step("bogus", ok=False)
        d.done()
    finally:
        env.close()
    shots = sorted((tmp_path / "shots").glob("*.png"))
    assert [p.name.rsplit("-", 1)[1] for p in shots] == [
        "step00.png",
        "step01.png",
        "step02.png",
        "step03.png",
    ]
    for p in shots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_step_limit_truncates(host):
    env = GuiEnv(browser=host, max_steps=2, tasks=["todo_add"])
    try:
        env.reset(seed=1)
        _, _, term, trunc, _ = env.step("scroll down")
        assert not term and not trunc
        obs, reward, term, trunc, info = env.step("scroll up")
        assert trunc and not term and reward == 0.0 and info["success"] is False
        assert "The step limit (2) is reached" in obs
    finally:
        env.close()
