"""Scripted solutions of every ``gui`` task, written as an agent would act: by reading observations.

:class:`Driver` finds element ids by parsing the rendered observation text (``[12] button
"Add"``), never by peeking into the environment, so running the oracles proves both that each
task is solvable through the command language and that the observations carry what an agent
needs. The tests use them; so can a person checking a deployment::

    python -m openclaw_rl.envs.gui.oracle            # solves every task, prints one line each
    python -m openclaw_rl.envs.gui.oracle --screenshots shots/
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from openclaw_rl.envs.gui.tasks import cheapest_in_stock


class Driver:
    """Wraps a :class:`~openclaw_rl.envs.gui.env.GuiEnv`; each call is one step."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.obs = ""
        self.info: dict[str, Any] = {}
        self.steps = 0

    def reset(self, task: str, **options: Any) -> str:
        """Start an episode of ``task``; returns the first observation."""
        self.obs, self.info = self.env.reset(options={"task": task, **options})
        self.steps = 0
        return self.obs

    def step(self, action: str | dict[str, Any], ok: bool = True) -> tuple[float, bool, bool, dict[str, Any]]:
        """One step; with ``ok`` an error observation raises AssertionError (oracles never err)."""
        self.obs, reward, term, trunc, self.info = self.env.step(action)
        self.steps += 1
        if ok and self.info["error"] is not None:
            raise AssertionError(f"step {action!r} failed:\n{self.obs}")
        return reward, term, trunc, self.info

    def find(self, role: str, name: str) -> int | None:
        """Id of ``role "name"`` in the current observation text, or None."""
        m = re.search(
            rf"^\[(\d+)\] {re.escape(role)} {re.escape(json.dumps(name, ensure_ascii=False))}", self.obs, re.M
        )
        return int(m.group(1)) if m else None

    def id(self, role: str, name: str) -> int:
        """The element's id from the observation, scrolling down (like an agent) when needed."""
        for _ in range(4):
            found = self.find(role, name)
            if found is not None:
                return found
            self.step("scroll down", ok=False)
        raise AssertionError(f"{role} {name!r} not in the observation:\n{self.obs}")

    def click(self, role: str, name: str) -> None:
        """Click the control with this role and name."""
        self.step(f"click {self.id(role, name)}")

    def type(self, name: str, text: str, role: str = "textbox") -> None:
        """Type into the text box with this name."""
        self.step(f"type {self.id(role, name)} {json.dumps(text)}")

    def select(self, name: str, option: str) -> None:
        """Choose an option of the drop-down with this name."""
        self.step(f"select {self.id('combobox', name)} {json.dumps(option)}")

    def rows(self) -> list[list[str]]:
        """Data rows of the table in the current observation (header rows excluded)."""
        rows = [json.loads(m.group(1)).split(" | ") for m in re.finditer(r'^row (".*")$', self.obs, re.M)]
        return [r for r in rows if r and r[0] not in ("Name", "Item")]

    def done(self) -> tuple[float, dict[str, Any]]:
        """Send ``done``; returns (reward, info)."""
        reward, _term, _trunc, info = self.step("done")
        return reward, info


def _price(cell: str) -> float:
    return float(cell.strip().lstrip("$"))


# -- one oracle per task ---------------------------------------------------------------------


def solve_contact_billing(d: Driver) -> None:
    d.type("Name", "Ada Lovelace")
    d.type("Email", "ada@example.com")
    d.select("Topic", "Billing")
    d.type("Message", "Please resend my March invoice.")
    d.click("button", "Send message")


def solve_register_pro(d: Driver) -> None:
    d.type("Username", "grace")
    d.type("Password", "Compiler#1952")
    d.type("Confirm password", "Compiler#1952")
    d.click("radio", "Pro")
    d.click("checkbox", "I accept the terms")
    d.click("button", "Create account")


def solve_todo_add(d: Driver) -> None:
    d.type("New todo", "Buy milk")
    d.click("button", "Add")


def solve_todo_complete(d: Driver) -> None:
    d.click("button", "Complete Pay rent")


def solve_todo_delete(d: Driver) -> None:
    d.click("button", "Delete Call mom")


def solve_todo_clear_done(d: Driver) -> None:
    # Completed todos are shown as text "<title> (completed)".
    done = [
        json.loads(m.group(1))[: -len(" (completed)")]
        for m in re.finditer(r'^text (".* \(completed\)")$', d.obs, re.M)
    ]
    assert done, f"no completed todos in the observation:\n{d.obs}"
    for title in done:
        d.click("button", f"Delete {title}")


def solve_settings_dark(d: Driver) -> None:
    d.select("Theme", "Dark")
    d.click("button", "Save settings")


def solve_settings_language(d: Driver) -> None:
    d.select("Language", "Deutsch")
    if 'checkbox "Email notifications" checked=true' in d.obs:
        d.click("checkbox", "Email notifications")
    if 'checkbox "SMS notifications" checked=false' in d.obs:
        d.click("checkbox", "SMS notifications")
    d.click("button", "Save settings")


def solve_settings_name(d: Driver) -> None:
    d.type("Display name", "Captain Ada")
    d.click("button", "Save settings")


def _filter(d: Driver, category: str, in_stock: bool, sort: str) -> None:
    d.select("Category", category)
    if in_stock != ('checkbox "In stock only" checked=true' in d.obs):
        d.click("checkbox", "In stock only")
    d.select("Sort by", sort)
    d.click("button", "Apply")


def solve_products_cheapest_garden(d: Driver) -> None:
    _filter(d, "Garden", True, "Price: low to high")
    name = d.rows()[0][0]
    assert name == cheapest_in_stock("Garden"), f"first row {name!r} is not the cheapest"
    d.click("button", f"Add {name} to wishlist")


def solve_products_lighting_under_30(d: Driver) -> None:
    _filter(d, "Lighting", True, "Price: low to high")
    for name, *_rest, price, _stock in [r[:4] for r in d.rows()]:
        if _price(price) < 30:
            d.click("button", f"Add {name} to wishlist")


def solve_products_office_filter(d: Driver) -> None:
    _filter(d, "Office", True, "Price: high to low")


def _ship(d: Driver, method: str) -> None:
    d.click("link", "Proceed to checkout")
    d.type("Full name", "Ada Lovelace")
    d.type("Street address", "12 Analytical St")
    d.type("City", "London")
    d.select("Shipping method", method)
    d.click("button", "Continue to payment")


def solve_checkout_mug(d: Driver) -> None:
    d.click("button", "Add Blue Mug to cart")
    d.click("link", "Cart")
    _ship(d, "Standard")
    d.click("radio", "Card")
    d.type("Card number (leave empty for invoice)", "4242 4242 4242 4242")
    d.click("button", "Review order")
    d.click("button", "Place order")


def solve_checkout_multi(d: Driver) -> None:
    d.click("button", "Add Notebook to cart")
    d.click("button", "Add Pen to cart")
    d.click("link", "Cart")
    d.select("Quantity of Notebook", "3")
    d.click("button", "Update cart")
    _ship(d, "Express")
    d.click("radio", "Invoice")
    d.click("button", "Review order")
    d.click("button", "Place order")


ORACLES: dict[str, Callable[[Driver], None]] = {
    "contact_billing": solve_contact_billing,
    "register_pro": solve_register_pro,
    "todo_add": solve_todo_add,
    "todo_complete": solve_todo_complete,
    "todo_delete": solve_todo_delete,
    "todo_clear_done": solve_todo_clear_done,
    "settings_dark": solve_settings_dark,
    "settings_language": solve_settings_language,
    "settings_name": solve_settings_name,
    "products_cheapest_garden": solve_products_cheapest_garden,
    "products_lighting_under_30": solve_products_lighting_under_30,
    "products_office_filter": solve_products_office_filter,
    "checkout_mug": solve_checkout_mug,
    "checkout_multi": solve_checkout_multi,
}


def main(argv: list[str] | None = None) -> int:
    """Run every oracle once; exit 1 if any task is not solved."""
    from openclaw_rl.envs.gui.browser import BrowserError
    from openclaw_rl.envs.gui.env import GuiEnv

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--screenshots", default=None, help="save a PNG per step into this directory")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium binary")
    args = ap.parse_args(argv)
    failures = 0
    env = GuiEnv(max_steps=40, screenshot_dir=args.screenshots, chromium_path=args.chromium)
    try:
        for task_id, solve in ORACLES.items():
            t0 = time.perf_counter()
            d = Driver(env)
            try:
                d.reset(task_id)
            except BrowserError as exc:  # no browser to drive: one line, not a traceback
                print(f"error: {exc}", file=sys.stderr)
                return 2
            try:
                solve(d)
                reward, info = d.done()
                verdict = f"{'ok  ' if reward == 1.0 else 'FAIL'} {info.get('check')}"
            except AssertionError as exc:
                reward, verdict = 0.0, f"FAIL {str(exc).splitlines()[0]}"
            failures += reward != 1.0
            print(f"{task_id:28s} steps={d.steps:2d} {time.perf_counter() - t0:5.1f}s {verdict}")
    finally:
        env.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
