"""The ``gui`` tasks: an instruction, a starting page, a seeded app state and a checker.

A checker reads the app's *server-side* :class:`~openclaw_rl.envs.gui.apps.AppState` and returns
``(passed, reason)``; the reason says what is wrong in words a person debugging an episode (or a
judge) can use. Checkers are strict about side effects where a sloppy agent would cause them
(completing the wrong todo, adding extra wishlist items, ordering extra items), because "did the
thing and also broke something else" is a failure a user would notice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from openclaw_rl.envs.gui.apps import (
    PRODUCT_BY_ID,
    Account,
    AppState,
    Settings,
    filter_products,
    product_by_name,
)

Check = tuple[bool, str]


@dataclass(frozen=True)
class GuiTask:
    """One task: ``make_state`` seeds the apps, ``check`` judges the final server state."""

    id: str
    app: str
    start_path: str
    instruction: str
    make_state: Callable[[], AppState]
    check: Callable[[AppState], Check]


def _ok() -> Check:
    return True, "the app's state matches the task"


def _fail(reason: str) -> Check:
    return False, reason


# -- seeds ----------------------------------------------------------------------------------

_SEED_TODOS = (
    ("Pay rent", False),
    ("Call mom", False),
    ("Water plants", True),
    ("Renew passport", False),
    ("Return library books", True),
)


def _todo_state() -> AppState:
    s = AppState()
    for title, done in _SEED_TODOS:
        s.add_todo(title, done)
    return s


def _empty_state() -> AppState:
    return AppState()


def _register_state() -> AppState:
    s = AppState()
    s.accounts.append(Account("ada", "analytical", "Free", True))
    return s


# -- checkers -------------------------------------------------------------------------------


def _check_contact(s: AppState) -> Check:
    if len(s.submissions) != 1:
        return _fail(f"expected exactly 1 contact message, found {len(s.submissions)}")
    m = s.submissions[0]
    want = ("Ada Lovelace", "ada@example.com", "Billing", "Please resend my March invoice.")
    got = (m.name, m.email, m.topic, m.message)
    if got != want:
        return _fail(f"message sent with (name, email, topic, text) = {got}, expected {want}")
    if m.copy_to_self:
        return _fail("'Send me a copy' was ticked but the task did not ask for a copy")
    return _ok()


def _check_register(s: AppState) -> Check:
    new = s.accounts[1:]
    if len(new) != 1:
        return _fail(f"expected exactly 1 new account, found {len(new)}")
    a = new[0]
    if (a.username, a.password, a.plan) != ("grace", "Compiler#1952", "Pro"):
        return _fail(
            f"account created as username={a.username!r}, plan={a.plan!r} "
            f"(password {'matches' if a.password == 'Compiler#1952' else 'differs'}); "
            "expected grace on the Pro plan"
        )
    return _ok()


def _todo_titles(s: AppState) -> dict[str, bool]:
    return {t.title: t.done for t in s.todos}


def _expect_todos(s: AppState, want: dict[str, bool]) -> Check:
    got = _todo_titles(s)
    if len(s.todos) != len(got):
        return _fail("the todo list holds duplicate entries")
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        return _fail(f"todo list differs: missing {missing}, unexpected {extra}, wrong done-state {wrong}")
    return _ok()


def _seed_todos() -> dict[str, bool]:
    return dict(_SEED_TODOS)


def _check_todo_add(s: AppState) -> Check:
    return _expect_todos(s, {**_seed_todos(), "Buy milk": False})


def _check_todo_complete(s: AppState) -> Check:
    return _expect_todos(s, {**_seed_todos(), "Pay rent": True})


def _check_todo_delete(s: AppState) -> Check:
    want = _seed_todos()
    del want["Call mom"]
    return _expect_todos(s, want)


def _check_todo_clear_done(s: AppState) -> Check:
    return _expect_todos(s, {k: v for k, v in _seed_todos().items() if not v})


def _expect_settings(s: AppState, **changes: object) -> Check:
    want = Settings(**{**Settings().__dict__, **changes})
    got = s.settings
    if got.saves == 0:
        return _fail("the settings were never saved")
    diffs = [
        f"{k}={getattr(got, k)!r} (expected {getattr(want, k)!r})"
        for k in ("display_name", "language", "theme", "email_notifications", "sms_notifications")
        if getattr(got, k) != getattr(want, k)
    ]
    return _fail("saved settings differ: " + ", ".join(diffs)) if diffs else _ok()


def _check_settings_theme(s: AppState) -> Check:
    return _expect_settings(s, theme="Dark")


def _check_settings_language(s: AppState) -> Check:
    return _expect_settings(s, language="Deutsch", email_notifications=False, sms_notifications=True)


def _check_settings_name(s: AppState) -> Check:
    return _expect_settings(s, display_name="Captain Ada")


def _expect_wishlist(s: AppState, names: list[str]) -> Check:
    want = sorted(product_by_name(n).id for n in names)
    if sorted(s.wishlist) != want:
        got_names = sorted(PRODUCT_BY_ID[i].name for i in s.wishlist)
        return _fail(f"wishlist holds {got_names}, expected {sorted(names)}")
    return _ok()


def cheapest_in_stock(category: str) -> str:
    """Name of the cheapest in-stock product of a category (the answer of a task)."""
    return filter_products("", category, True, "price_asc")[0].name


def lighting_under_30() -> list[str]:
    """Names of the in-stock Lighting products priced under $30 (the answer of a task)."""
    return [p.name for p in filter_products("", "Lighting", True, "name") if p.price < 30]


def _check_cheapest_garden(s: AppState) -> Check:
    return _expect_wishlist(s, [cheapest_in_stock("Garden")])


def _check_lighting_under_30(s: AppState) -> Check:
    return _expect_wishlist(s, lighting_under_30())


def _check_office_filter(s: AppState) -> Check:
    if not s.searches:
        return _fail("no search or filter was ever applied")
    last = s.searches[-1]
    want = {"q": "", "category": "Office", "instock": "on", "sort": "price_desc"}
    if last != want:
        return _fail(f"the last applied filter is {last}, expected {want}")
    return _ok()


def _expect_order(s: AppState, items: dict[str, int], shipping: str, payment: str, last4: str) -> Check:
    if len(s.orders) != 1:
        return _fail(f"expected exactly 1 placed order, found {len(s.orders)}")
    o = s.orders[0]
    problems = []
    if o.items != items:
        problems.append(f"items {o.items} (expected {items})")
    if (o.full_name, o.street, o.city) != ("Ada Lovelace", "12 Analytical St", "London"):
        problems.append(f"address {o.full_name!r}, {o.street!r}, {o.city!r}")
    if o.shipping != shipping:
        problems.append(f"shipping {o.shipping} (expected {shipping})")
    if o.payment != payment or o.card_last4 != last4:
        problems.append(f"payment {o.payment} {o.card_last4} (expected {payment} {last4})")
    return _fail("the order differs: " + "; ".join(problems)) if problems else _ok()


def _check_checkout_mug(s: AppState) -> Check:
    return _expect_order(s, {"Blue Mug": 1}, "Standard", "Card", "4242")


def _check_checkout_multi(s: AppState) -> Check:
    return _expect_order(s, {"Notebook": 3, "Pen": 1}, "Express", "Invoice", "")


_ADDRESS = "ship to Ada Lovelace, 12 Analytical St, London"

TASKS: tuple[GuiTask, ...] = (
    GuiTask(
        "contact_billing",
        "contact",
        "/contact",
        "Send a message to support from Ada Lovelace (email ada@example.com) with topic Billing "
        "and the message text: Please resend my March invoice.  Do not ask for a copy.",
        _empty_state,
        _check_contact,
    ),
    GuiTask(
        "register_pro",
        "register",
        "/register",
        "Create an account with username grace and password Compiler#1952 on the Pro plan.",
        _register_state,
        _check_register,
    ),
    GuiTask(
        "todo_add", "todos", "/todos", "Add a todo 'Buy milk' to the todo list.", _todo_state, _check_todo_add
    ),
    GuiTask(
        "todo_complete",
        "todos",
        "/todos",
        "Mark the todo 'Pay rent' as completed.",
        _todo_state,
        _check_todo_complete,
    ),
    GuiTask(
        "todo_delete",
        "todos",
        "/todos",
        "Delete the todo 'Call mom'. Leave the others alone.",
        _todo_state,
        _check_todo_delete,
    ),
    GuiTask(
        "todo_clear_done",
        "todos",
        "/todos",
        "Delete every todo that is already completed, and nothing else.",
        _todo_state,
        _check_todo_clear_done,
    ),
    GuiTask(
        "settings_dark",
        "settings",
        "/settings",
        "Switch the theme to Dark and save the settings.",
        _empty_state,
        _check_settings_theme,
    ),
    GuiTask(
        "settings_language",
        "settings",
        "/settings",
        "Change the language to Deutsch, turn email notifications off and SMS notifications on, then save.",
        _empty_state,
        _check_settings_language,
    ),
    GuiTask(
        "settings_name",
        "settings",
        "/settings",
        "Change the display name to Captain Ada and save.",
        _empty_state,
        _check_settings_name,
    ),
    GuiTask(
        "products_cheapest_garden",
        "products",
        "/products",
        "Add the cheapest Garden product that is in stock to the wishlist (only that one).",
        _empty_state,
        _check_cheapest_garden,
    ),
    GuiTask(
        "products_lighting_under_30",
        "products",
        "/products",
        "Add every in-stock Lighting product that costs less than $30 to the wishlist, and no other product.",
        _empty_state,
        _check_lighting_under_30,
    ),
    GuiTask(
        "products_office_filter",
        "products",
        "/products",
        "Filter the product table to show only Office products that are in stock, sorted by "
        "price from high to low, with no search text.",
        _empty_state,
        _check_office_filter,
    ),
    GuiTask(
        "checkout_mug",
        "shop",
        "/shop",
        f"Buy one Blue Mug: {_ADDRESS} with Standard shipping and pay by card with number "
        "4242 4242 4242 4242.",
        _empty_state,
        _check_checkout_mug,
    ),
    GuiTask(
        "checkout_multi",
        "shop",
        "/shop",
        f"Order 3 Notebooks and 1 Pen: {_ADDRESS} with Express shipping, paying by Invoice.",
        _empty_state,
        _check_checkout_multi,
    ),
)

TASK_BY_ID: dict[str, GuiTask] = {t.id: t for t in TASKS}


def get_task(task_id: str) -> GuiTask:
    """Look a task up by id; unknown ids list the known ones."""
    try:
        return TASK_BY_ID[task_id]
    except KeyError:
        raise KeyError(f"unknown gui task {task_id!r}; known: {sorted(TASK_BY_ID)}") from None
