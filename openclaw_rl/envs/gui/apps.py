"""The small web apps the ``gui`` environment serves itself on loopback.

Why our own apps: a GUI task needs a site whose *server-side state* a checker can read (an order
was placed with these items, the todo list holds exactly these entries) — reading the DOM would
let an agent "succeed" by making a page look right. The apps are plain server-rendered HTML with
POST forms and Post/Redirect/Get, served by the standard library's threading HTTP server on
``127.0.0.1`` and a free port, in a background thread the environment starts and stops. No
JavaScript is needed to use them, so every state change goes through the server.

Apps (each reachable from the nav bar on every page):

* ``/contact`` and ``/register`` — forms with text fields, a select, radios, checkboxes and
  server-side validation errors shown as ``role="alert"``;
* ``/todos`` — a todo list (add, complete / undo, delete);
* ``/settings`` — a settings page (display name, language, theme, notification switches);
* ``/products`` — a searchable, filterable, sortable product table with a wishlist;
* ``/shop`` → ``/cart`` → ``/checkout/shipping`` → ``/checkout/payment`` → ``/checkout/review`` →
  ``/orders/N`` — a multi-page checkout;
* ``/_faults`` — pages that misbehave on purpose (a request that never answers, a script that
  freezes the page, links leaving the site), used by the fault tests and for debugging.

The whole state lives in one :class:`AppState`, replaced at every episode reset.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------


@dataclass
class Submission:
    """A message sent through the contact form."""

    name: str
    email: str
    topic: str
    message: str
    copy_to_self: bool


@dataclass
class Account:
    """An account created on the registration page."""

    username: str
    password: str
    plan: str
    terms_accepted: bool


@dataclass
class Todo:
    """One entry of the todo list."""

    id: int
    title: str
    done: bool = False


@dataclass
class Settings:
    """The settings page's stored values; ``saves`` counts successful saves."""

    display_name: str = "Ada"
    language: str = "English"
    theme: str = "Light"
    email_notifications: bool = True
    sms_notifications: bool = False
    saves: int = 0


@dataclass(frozen=True)
class Product:
    """A row of the product table (also sold in the shop when ``in_shop``)."""

    id: int
    name: str
    category: str
    price: float
    in_stock: bool


@dataclass
class Order:
    """A placed order: item name -> quantity, plus shipping and payment details."""

    id: int
    items: dict[str, int]
    full_name: str
    street: str
    city: str
    shipping: str
    payment: str
    card_last4: str
    total: float


@dataclass
class AppState:
    """Everything the apps store. Checkers read this, never the page."""

    submissions: list[Submission] = field(default_factory=list)
    accounts: list[Account] = field(default_factory=list)
    todos: list[Todo] = field(default_factory=list)
    next_todo_id: int = 1
    settings: Settings = field(default_factory=Settings)
    wishlist: list[int] = field(default_factory=list)
    searches: list[dict[str, str]] = field(default_factory=list)
    cart: dict[int, int] = field(default_factory=dict)
    checkout: dict[str, str] = field(default_factory=dict)
    orders: list[Order] = field(default_factory=list)

    def add_todo(self, title: str, done: bool = False) -> Todo:
        """Append a todo with the next id."""
        todo = Todo(self.next_todo_id, title, done)
        self.next_todo_id += 1
        self.todos.append(todo)
        return todo


PRODUCTS: tuple[Product, ...] = tuple(
    Product(i + 1, name, cat, price, stock)
    for i, (name, cat, price, stock) in enumerate(
        [
            ("Blue Mug", "Kitchen", 12.0, True),
            ("Chef Knife", "Kitchen", 45.0, True),
            ("Cutting Board", "Kitchen", 22.5, False),
            ("Espresso Cups", "Kitchen", 18.0, True),
            ("Tea Sampler", "Kitchen", 16.0, True),
            ("Cast Iron Pan", "Kitchen", 39.0, False),
            ("Garden Hose", "Garden", 29.0, True),
            ("Pruning Shears", "Garden", 19.5, True),
            ("Seed Starter Kit", "Garden", 14.0, False),
            ("Watering Can", "Garden", 17.0, True),
            ("Garden Gloves", "Garden", 9.5, False),
            ("Compost Bin", "Garden", 55.0, True),
            ("Bird Feeder", "Garden", 24.0, True),
            ("Desk Lamp", "Lighting", 30.0, True),
            ("Reading Lamp", "Lighting", 27.0, True),
            ("LED Strip", "Lighting", 21.0, False),
            ("Floor Lamp", "Lighting", 89.0, True),
            ("Night Light", "Lighting", 11.0, True),
            ("Lantern", "Lighting", 33.0, False),
            ("String Lights", "Lighting", 15.0, True),
            ("Notebook", "Office", 5.0, True),
            ("Pen", "Office", 2.0, True),
            ("Stapler", "Office", 13.0, False),
            ("Desk Organizer", "Office", 26.0, True),
            ("Monitor Stand", "Office", 48.0, True),
            ("Sticky Notes", "Office", 4.0, True),
            ("Paper Shredder", "Office", 79.0, False),
            ("Whiteboard", "Office", 35.0, True),
        ]
    )
)
PRODUCT_BY_ID: dict[int, Product] = {p.id: p for p in PRODUCTS}
CATEGORIES = ("Kitchen", "Garden", "Lighting", "Office")
SHOP_ITEMS = ("Blue Mug", "Notebook", "Pen", "Desk Lamp", "Tea Sampler")
LANGUAGES = ("English", "Deutsch", "Français", "Español")
THEMES = ("Light", "Dark", "System")
TOPICS = ("General", "Billing", "Technical")
SHIPPING = {"Standard": 4.0, "Express": 12.0}
SORTS = {"name": "Name", "price_asc": "Price: low to high", "price_desc": "Price: high to low"}


def product_by_name(name: str) -> Product:
    """Look a product up by its exact name (raises KeyError listing none — names are fixed)."""
    for p in PRODUCTS:
        if p.name == name:
            return p
    raise KeyError(f"no product named {name!r}")


# --------------------------------------------------------------------------------------------
# HTML helpers
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:DejaVu Sans,Arial,sans-serif;margin:0;background:#f4f5f7;color:#222}
nav{background:#2d3e50;padding:10px 16px}nav a{color:#fff;margin-right:14px;text-decoration:none}
main{max-width:860px;margin:18px auto;background:#fff;padding:18px 24px;border-radius:6px;
box-shadow:0 1px 3px rgba(0,0,0,.15)}
label{display:block;margin:8px 0 2px;font-weight:bold}
label.inline{display:inline;font-weight:normal;margin-right:12px}
input[type=text],input[type=password],input[type=search],textarea,select{padding:5px;
width:320px;max-width:100%;border:1px solid #aab;border-radius:3px}
button{margin:8px 4px 0 0;padding:5px 12px;border:0;border-radius:3px;background:#3b7dd8;color:#fff}
button.secondary{background:#889}
table{border-collapse:collapse;width:100%;margin-top:12px}td,th{border-bottom:1px solid #ddd;
padding:4px 6px;text-align:left}
.alert{background:#fde2e1;color:#8a1c1c;padding:6px 10px;border-radius:3px}
.status{background:#e1f5e4;color:#1c6b2c;padding:6px 10px;border-radius:3px}
.done{text-decoration:line-through;color:#888}
ul.todos li{margin:6px 0}
"""

_NAV = [
    ("/", "Home"),
    ("/contact", "Contact"),
    ("/register", "Register"),
    ("/todos", "Todos"),
    ("/settings", "Settings"),
    ("/products", "Products"),
    ("/shop", "Shop"),
    ("/cart", "Cart"),
]


def esc(text: object) -> str:
    """HTML-escape any value (quotes included, so it is safe inside attributes)."""
    return html.escape(str(text), quote=True)


def page(title: str, body: str) -> str:
    """Wrap a body in the common layout with the navigation bar."""
    nav = "".join(f'<a href="{href}">{esc(label)}</a>' for href, label in _NAV)
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
        f"<style>{_CSS}</style></head><body><nav>{nav}</nav><main>{body}</main></body></html>"
    )


def _options(values: tuple[str, ...] | list[str], selected: str) -> str:
    return "".join(f"<option{' selected' if v == selected else ''}>{esc(v)}</option>" for v in values)


def _alert(errors: list[str]) -> str:
    if not errors:
        return ""
    return "".join(f"<p class=alert role=alert>{esc(e)}</p>" for e in errors)


def _status(message: str | None) -> str:
    return f"<p class=status role=status>{esc(message)}</p>" if message else ""


def _field(form: dict[str, str], key: str) -> str:
    return form.get(key, "").strip()


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class _Response(Exception):
    """Raised by a view to answer with a redirect or an error status instead of a page."""

    def __init__(self, status: int, location: str | None = None, text: str = "") -> None:
        super().__init__(text or str(status))
        self.status = status
        self.location = location
        self.text = text


def _redirect(location: str) -> _Response:
    return _Response(HTTPStatus.SEE_OTHER, location=location)


class AppServer:
    """Serves the apps on ``127.0.0.1:<free port>`` from a background thread.

    ``start()`` returns the base URL; ``reset(state)`` swaps in a fresh :class:`AppState` for a new
    episode; ``stop()`` shuts the server down and releases any request still hanging in a fault
    page. All views run under one lock so a checker never sees half an update.
    """

    def __init__(self, host: str = "127.0.0.1", hang_limit_s: float = 120.0) -> None:
        self.host = host
        self.state = AppState()
        self.lock = threading.RLock()
        self.requests: list[str] = []  # "METHOD path" of every request, for tests and debugging
        self._hang_limit_s = hang_limit_s
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._httpd is None:
            raise RuntimeError("AppServer is not running; call start() first")
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    @property
    def running(self) -> bool:
        """True while the server thread serves requests."""
        return self._httpd is not None and self._thread is not None and self._thread.is_alive()

    def start(self) -> str:
        """Bind a free loopback port, serve in a daemon thread, return the base URL."""
        if self.running:
            return self.base_url
        server = self

        class Handler(_Handler):
            app = server

        self._stopping.clear()
        httpd = ThreadingHTTPServer((self.host, 0), Handler)
        httpd.daemon_threads = True  # a hanging fault request must not keep the process alive
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"gui-apps-{httpd.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving; safe to call twice."""
        self._stopping.set()  # wakes requests parked in /_faults/hang
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def reset(self, state: AppState) -> None:
        """Install the state of a new episode."""
        with self.lock:
            self.state = state
            self.requests.clear()

    # -- routing --------------------------------------------------------------------------
    def handle(self, method: str, target: str, form: dict[str, str]) -> str:
        """Dispatch one request to a view; returns HTML or raises :class:`_Response`."""
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        if path == "/_faults/hang":
            # Deliberately never answers (until the server stops or the limit passes): the
            # environment must turn this into a timeout observation, not hang itself.
            self._stopping.wait(self._hang_limit_s)
            raise _Response(HTTPStatus.SERVICE_UNAVAILABLE, text="gave up hanging")
        with self.lock:
            self.requests.append(f"{method} {parts.path}")
            s = self.state
            segs = [p for p in path.split("/") if p]
            if path == "/":
                return _home()
            if path == "/contact":
                return _contact(s, method, form)
            if path == "/contact/thanks":
                return page(
                    "Message sent",
                    "<h1>Message sent</h1><p role=status class=status>Thank you, we will reply soon.</p>",
                )
            if path == "/register":
                return _register(s, method, form)
            if path == "/register/welcome":
                name = s.accounts[-1].username if s.accounts else "?"
                return page(
                    "Welcome",
                    f"<h1>Welcome, {esc(name)}!</h1><p role=status class=status>"
                    "Your account was created.</p>",
                )
            if path == "/todos":
                return _todos(s, method, form, query)
            if len(segs) == 3 and segs[0] == "todos" and method == "POST":
                return _todo_action(s, segs[1], segs[2])
            if path == "/settings":
                return _settings(s, method, form, query)
            if path == "/products":
                return _products(s, query)
            if path == "/wishlist":
                return _wishlist(s, method, form)
            if path == "/shop":
                return _shop(s, method, form, query)
            if path == "/cart":
                return _cart(s, method, form, query)
            if path == "/checkout/shipping":
                return _shipping(s, method, form)
            if path == "/checkout/payment":
                return _payment(s, method, form)
            if path == "/checkout/review":
                return _review(s, method)
            if len(segs) == 2 and segs[0] == "orders":
                return _order(s, segs[1])
            if path == "/_faults":
                return _faults()
        raise _Response(HTTPStatus.NOT_FOUND, text=f"no page at {parts.path}")


class _Handler(BaseHTTPRequestHandler):
    app: AppServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        """Silence the per-request stderr line (the server keeps its own request list)."""

    def _answer(self, method: str, form: dict[str, str]) -> None:
        status: int  # HTTPStatus.OK, or the plain code a view raised
        location: str | None
        try:
            body = self.app.handle(method, self.path, form)
            status, location = HTTPStatus.OK, None
        except _Response as r:
            status, location = r.status, r.location
            body = (
                page(
                    f"{int(r.status)} {HTTPStatus(r.status).phrase}",
                    f"<h1>{int(r.status)} {esc(HTTPStatus(r.status).phrase)}</h1>"
                    f"<p role=alert class=alert>{esc(r.text)}</p>",
                )
                if not location
                else ""
            )
        data = body.encode("utf-8")
        try:
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")  # back must re-fetch current state
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser gave up on this request (e.g. a page closed mid-load): nothing to do

    def do_GET(self) -> None:  # stdlib naming
        self._answer("GET", {})

    def do_POST(self) -> None:  # stdlib naming
        length = int(self.headers.get("Content-Length") or 0)
        if length > 1_000_000:
            self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "form too large")
            return
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        form = {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
        self._answer("POST", form)


# --------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------


def _home() -> str:
    links = "".join(f'<li><a href="{h}">{esc(t)}</a></li>' for h, t in _NAV[1:])
    return page("Demo apps", f"<h1>Demo apps</h1><p>Pick an app.</p><ul>{links}</ul>")


def _contact(s: AppState, method: str, form: dict[str, str]) -> str:
    errors: list[str] = []
    if method == "POST":
        name, email, message = _field(form, "name"), _field(form, "email"), _field(form, "message")
        topic = _field(form, "topic")
        if not name:
            errors.append("Name is required.")
        if "@" not in email or "." not in email.split("@")[-1]:
            errors.append("Enter a valid email address.")
        if topic not in TOPICS:
            errors.append("Choose a topic.")
        if not message:
            errors.append("Message is required.")
        if not errors:
            s.submissions.append(Submission(name, email, topic, message, form.get("copy") == "on"))
            raise _redirect("/contact/thanks")
    body = f"""<h1>Contact support</h1>{_alert(errors)}
<form method=post action="/contact" novalidate>
<label for=name>Name</label><input type=text id=name name=name value="{esc(form.get("name", ""))}">
<label for=email>Email</label><input type=text id=email name=email value="{esc(form.get("email", ""))}">
<label for=topic>Topic</label><select id=topic name=topic>{_options(TOPICS, form.get("topic", "General"))}</select>
<label for=message>Message</label><textarea id=message name=message rows=4>{esc(form.get("message", ""))}</textarea>
<p><input type=checkbox id=copy name=copy{" checked" if form.get("copy") == "on" else ""}>
<label class=inline for=copy>Send me a copy</label></p>
<button type=submit>Send message</button></form>"""
    return page("Contact support", body)


def _register(s: AppState, method: str, form: dict[str, str]) -> str:
    errors: list[str] = []
    if method == "POST":
        user, pw, pw2 = _field(form, "username"), form.get("password", ""), form.get("confirm", "")
        plan = form.get("plan", "")
        if not user:
            errors.append("Username is required.")
        elif any(a.username == user for a in s.accounts):
            errors.append(f"Username {user} is already taken.")
        if len(pw) < 8:
            errors.append("Password must have at least 8 characters.")
        elif pw != pw2:
            errors.append("Passwords do not match.")
        if plan not in ("Free", "Pro"):
            errors.append("Choose a plan.")
        if form.get("terms") != "on":
            errors.append("You must accept the terms.")
        if not errors:
            s.accounts.append(Account(user, pw, plan, True))
            raise _redirect("/register/welcome")
    plan = form.get("plan", "Free")
    radios = "".join(
        f"<input type=radio id=plan-{p.lower()} name=plan value={p}{' checked' if plan == p else ''}>"
        f"<label class=inline for=plan-{p.lower()}>{p}</label>"
        for p in ("Free", "Pro")
    )
    body = f"""<h1>Create an account</h1>{_alert(errors)}
<form method=post action="/register" novalidate>
<label for=username>Username</label><input type=text id=username name=username value="{esc(form.get("username", ""))}">
<label for=password>Password</label><input type=password id=password name=password>
<label for=confirm>Confirm password</label><input type=password id=confirm name=confirm>
<fieldset><legend>Plan</legend>{radios}</fieldset>
<p><input type=checkbox id=terms name=terms><label class=inline for=terms>I accept the terms</label></p>
<button type=submit>Create account</button></form>"""
    return page("Create an account", body)


def _todos(s: AppState, method: str, form: dict[str, str], query: dict[str, str]) -> str:
    errors: list[str] = []
    if method == "POST":
        title = _field(form, "title")
        if not title:
            errors.append("Type a todo first.")
        elif len(title) > 200:
            errors.append("A todo has at most 200 characters.")
        else:
            s.add_todo(title)
            raise _redirect("/todos?added=1")
    items = []
    for t in s.todos:
        toggle = "Undo" if t.done else "Complete"
        items.append(
            f"<li><span>{f'<s>{esc(t.title)}</s> (completed)' if t.done else esc(t.title)}</span> "
            f'<form method=post action="/todos/{t.id}/toggle" style=display:inline>'
            f'<button aria-label="{toggle} {esc(t.title)}">{toggle}</button></form>'
            f'<form method=post action="/todos/{t.id}/delete" style=display:inline>'
            f'<button class=secondary aria-label="Delete {esc(t.title)}">Delete</button></form></li>'
        )
    left = sum(not t.done for t in s.todos)
    body = f"""<h1>Todo list</h1>{_alert(errors)}{_status("Todo added." if query.get("added") else None)}
<form method=post action="/todos" novalidate><label for=title>New todo</label>
<input type=text id=title name=title><button type=submit>Add</button></form>
<ul class=todos>{"".join(items) or "<li>Nothing to do.</li>"}</ul>
<p>{left} of {len(s.todos)} open</p>"""
    return page("Todo list", body)


def _todo_action(s: AppState, raw_id: str, action: str) -> str:
    todo = next((t for t in s.todos if str(t.id) == raw_id), None)
    if todo is None:
        raise _Response(HTTPStatus.NOT_FOUND, text=f"no todo with id {raw_id}")
    if action == "toggle":
        todo.done = not todo.done
    elif action == "delete":
        s.todos.remove(todo)
    else:
        raise _Response(HTTPStatus.NOT_FOUND, text=f"unknown todo action {action}")
    raise _redirect("/todos")


def _settings(s: AppState, method: str, form: dict[str, str], query: dict[str, str]) -> str:
    errors: list[str] = []
    st = s.settings
    if method == "POST":
        name = _field(form, "display_name")
        if not name:
            errors.append("Display name cannot be empty.")
        if form.get("language") not in LANGUAGES:
            errors.append("Choose a language.")
        if form.get("theme") not in THEMES:
            errors.append("Choose a theme.")
        if not errors:
            st.display_name, st.language, st.theme = name, form["language"], form["theme"]
            st.email_notifications = form.get("email_notifications") == "on"
            st.sms_notifications = form.get("sms_notifications") == "on"
            st.saves += 1
            raise _redirect("/settings?saved=1")

    def check(key: str, value: bool, label: str) -> str:
        return (
            f"<p><input type=checkbox id={key} name={key}{' checked' if value else ''}>"
            f"<label class=inline for={key}>{label}</label></p>"
        )

    body = f"""<h1>Settings</h1>{_alert(errors)}{_status("Settings saved." if query.get("saved") else None)}
<form method=post action="/settings" novalidate>
<label for=display_name>Display name</label><input type=text id=display_name name=display_name value="{esc(st.display_name)}">
<label for=language>Language</label><select id=language name=language>{_options(LANGUAGES, st.language)}</select>
<label for=theme>Theme</label><select id=theme name=theme>{_options(THEMES, st.theme)}</select>
{check("email_notifications", st.email_notifications, "Email notifications")}
{check("sms_notifications", st.sms_notifications, "SMS notifications")}
<button type=submit>Save settings</button></form>"""
    return page("Settings", body)


def filter_products(q: str, category: str, in_stock: bool, sort: str) -> list[Product]:
    """The product table's rows for a query (also used by checkers to compute answers)."""
    rows = [
        p
        for p in PRODUCTS
        if q.lower() in p.name.lower()
        and (category in ("", "All") or p.category == category)
        and (p.in_stock or not in_stock)
    ]
    if sort == "price_asc":
        rows.sort(key=lambda p: (p.price, p.name))
    elif sort == "price_desc":
        rows.sort(key=lambda p: (-p.price, p.name))
    else:
        rows.sort(key=lambda p: p.name)
    return rows


def _products(s: AppState, query: dict[str, str]) -> str:
    q = query.get("q", "").strip()
    category = query.get("category", "All")
    in_stock = query.get("instock") == "on"
    sort = query.get("sort", "name")
    if sort not in SORTS:
        sort = "name"
    if query:  # a submitted search (not the first visit) is remembered server-side
        s.searches.append({"q": q, "category": category, "instock": "on" if in_stock else "", "sort": sort})
    rows = filter_products(q, category, in_stock, sort)
    back = "/products" + (f"?{urlencode(query)}" if query else "")
    trs = "".join(
        f"<tr><td>{esc(p.name)}</td><td>{p.category}</td><td>${p.price:.2f}</td>"
        f"<td>{'In stock' if p.in_stock else 'Out of stock'}</td><td>"
        + (
            "<span>On wishlist</span>"
            if p.id in s.wishlist
            else f'<form method=post action="/wishlist" style=display:inline><input type=hidden name=add value={p.id}>'
            f'<input type=hidden name=back value="{esc(back)}">'
            f'<button aria-label="Add {esc(p.name)} to wishlist">Wishlist</button></form>'
        )
        + "</td></tr>"
        for p in rows
    )
    sort_opts = "".join(
        f"<option value={k}{' selected' if k == sort else ''}>{v}</option>" for k, v in SORTS.items()
    )
    body = f"""<h1>Products</h1>
<p><a href="/wishlist">Wishlist ({len(s.wishlist)})</a></p>
<form method=get action="/products" role=search>
<label for=q>Search products</label><input type=search id=q name=q value="{esc(q)}">
<label for=category>Category</label><select id=category name=category>{_options(("All", *CATEGORIES), category)}</select>
<label for=sort>Sort by</label><select id=sort name=sort>{sort_opts}</select>
<p><input type=checkbox id=instock name=instock{" checked" if in_stock else ""}><label class=inline for=instock>In stock only</label></p>
<button type=submit>Apply</button></form>
<p>{len(rows)} products</p>
<table><thead><tr><th>Name</th><th>Category</th><th>Price</th><th>Stock</th><th></th></tr></thead>
<tbody>{trs}</tbody></table>"""
    return page("Products", body)


def _wishlist(s: AppState, method: str, form: dict[str, str]) -> str:
    if method == "POST":
        back = form.get("back", "/products")
        if not back.startswith("/"):  # only local redirects
            back = "/products"
        if "add" in form:
            pid = int(form["add"]) if form["add"].isdigit() else -1
            if pid not in PRODUCT_BY_ID:
                raise _Response(HTTPStatus.BAD_REQUEST, text=f"unknown product {form['add']!r}")
            if pid not in s.wishlist:
                s.wishlist.append(pid)
            raise _redirect(back)
        if "remove" in form and form["remove"].isdigit() and int(form["remove"]) in s.wishlist:
            s.wishlist.remove(int(form["remove"]))
        raise _redirect("/wishlist")
    items = "".join(
        f'<li>{esc(PRODUCT_BY_ID[i].name)} <form method=post action="/wishlist" style=display:inline>'
        f"<input type=hidden name=remove value={i}><button class=secondary "
        f'aria-label="Remove {esc(PRODUCT_BY_ID[i].name)} from wishlist">Remove</button></form></li>'
        for i in s.wishlist
    )
    return page(
        "Wishlist",
        f"<h1>Wishlist</h1><ul>{items or '<li>Your wishlist is empty.</li>'}</ul>"
        '<p><a href="/products">Back to products</a></p>',
    )


def _cart_lines(s: AppState) -> tuple[list[tuple[Product, int]], float]:
    lines = [(PRODUCT_BY_ID[pid], qty) for pid, qty in s.cart.items() if qty > 0]
    return lines, sum(p.price * q for p, q in lines)


def _shop(s: AppState, method: str, form: dict[str, str], query: dict[str, str]) -> str:
    if method == "POST":
        pid = int(form.get("add", "0")) if form.get("add", "").isdigit() else 0
        if pid not in PRODUCT_BY_ID or PRODUCT_BY_ID[pid].name not in SHOP_ITEMS:
            raise _Response(HTTPStatus.BAD_REQUEST, text=f"unknown shop item {form.get('add')!r}")
        s.cart[pid] = min(s.cart.get(pid, 0) + 1, 9)
        raise _redirect(f"/shop?added={pid}")
    added = query.get("added", "")
    note = (
        f"{PRODUCT_BY_ID[int(added)].name} added to cart."
        if added.isdigit() and int(added) in PRODUCT_BY_ID
        else None
    )
    cards = "".join(
        f"<tr><td>{esc(p.name)}</td><td>${p.price:.2f}</td><td>"
        f'<form method=post action="/shop" style=display:inline><input type=hidden name=add value={p.id}>'
        f'<button aria-label="Add {esc(p.name)} to cart">Add to cart</button></form></td></tr>'
        for p in (product_by_name(n) for n in SHOP_ITEMS)
    )
    count = sum(s.cart.values())
    body = f"""<h1>Shop</h1>{_status(note)}
<p><a href="/cart">View cart ({count} items)</a></p>
<table><thead><tr><th>Item</th><th>Price</th><th></th></tr></thead><tbody>{cards}</tbody></table>"""
    return page("Shop", body)


def _cart(s: AppState, method: str, form: dict[str, str], query: dict[str, str]) -> str:
    if method == "POST":
        if "remove" in form and form["remove"].isdigit():
            s.cart.pop(int(form["remove"]), None)
        else:
            for pid in list(s.cart):
                raw = form.get(f"qty_{pid}", "")
                if raw.isdigit() and 0 <= int(raw) <= 9:
                    s.cart[pid] = int(raw)
            s.cart = {k: v for k, v in s.cart.items() if v > 0}
        raise _redirect("/cart?updated=1")
    lines, total = _cart_lines(s)
    rows = "".join(
        f"<tr><td>{esc(p.name)}</td><td>${p.price:.2f}</td><td>"
        f"<label class=inline for=qty_{p.id}>Quantity of {esc(p.name)}</label>"
        f"<select id=qty_{p.id} name=qty_{p.id} form=cartform>{_options([str(i) for i in range(10)], str(q))}</select>"
        f'</td><td><button form=rm{p.id} class=secondary aria-label="Remove {esc(p.name)} from cart">Remove</button>'
        f"</td></tr>"
        for p, q in lines
    )
    removers = "".join(
        f'<form id=rm{p.id} method=post action="/cart"><input type=hidden name=remove value={p.id}></form>'
        for p, _ in lines
    )
    if not lines:
        content = '<p>Your cart is empty.</p><p><a href="/shop">Go to the shop</a></p>'
    else:
        content = (
            f'<form id=cartform method=post action="/cart"></form>{removers}'
            f"<table><thead><tr><th>Item</th><th>Price</th><th>Quantity</th><th></th></tr></thead>"
            f"<tbody>{rows}</tbody></table><p>Subtotal: ${total:.2f}</p>"
            f"<button form=cartform type=submit>Update cart</button>"
            f'<p><a href="/checkout/shipping">Proceed to checkout</a></p>'
        )
    body = f"<h1>Your cart</h1>{_status('Cart updated.' if query.get('updated') else None)}{content}"
    return page("Your cart", body)


def _shipping(s: AppState, method: str, form: dict[str, str]) -> str:
    if not s.cart:
        raise _redirect("/cart")
    errors: list[str] = []
    values = dict(s.checkout)
    if method == "POST":
        values.update({k: _field(form, k) for k in ("full_name", "street", "city", "shipping")})
        for key, label in (("full_name", "Full name"), ("street", "Street address"), ("city", "City")):
            if not values[key]:
                errors.append(f"{label} is required.")
        if values["shipping"] not in SHIPPING:
            errors.append("Choose a shipping method.")
        if not errors:
            s.checkout.update(values)
            raise _redirect("/checkout/payment")
    ship_opts = _options([f"{k}" for k in SHIPPING], values.get("shipping", "Standard"))
    body = f"""<h1>Checkout: shipping</h1><p>Step 1 of 3</p>{_alert(errors)}
<form method=post action="/checkout/shipping" novalidate>
<label for=full_name>Full name</label><input type=text id=full_name name=full_name value="{esc(values.get("full_name", ""))}">
<label for=street>Street address</label><input type=text id=street name=street value="{esc(values.get("street", ""))}">
<label for=city>City</label><input type=text id=city name=city value="{esc(values.get("city", ""))}">
<label for=shipping>Shipping method</label><select id=shipping name=shipping>{ship_opts}</select>
<p>Standard $4.00 (5 days), Express $12.00 (next day)</p>
<button type=submit>Continue to payment</button></form><p><a href="/cart">Back to cart</a></p>"""
    return page("Checkout: shipping", body)


def _payment(s: AppState, method: str, form: dict[str, str]) -> str:
    if not s.cart:
        raise _redirect("/cart")
    if "shipping" not in s.checkout:
        raise _redirect("/checkout/shipping")
    errors: list[str] = []
    pay = s.checkout.get("payment", "Card")
    if method == "POST":
        pay = form.get("payment", "")
        card = "".join(ch for ch in form.get("card", "") if not ch.isspace())
        if pay not in ("Card", "Invoice"):
            errors.append("Choose a payment method.")
        elif pay == "Card" and not (len(card) == 16 and card.isdigit()):
            errors.append("Card number must have 16 digits.")
        if not errors:
            s.checkout["payment"] = pay
            s.checkout["card_last4"] = card[-4:] if pay == "Card" else ""
            raise _redirect("/checkout/review")
    radios = "".join(
        f"<input type=radio id=pay-{p.lower()} name=payment value={p}{' checked' if pay == p else ''}>"
        f"<label class=inline for=pay-{p.lower()}>{p}</label>"
        for p in ("Card", "Invoice")
    )
    body = f"""<h1>Checkout: payment</h1><p>Step 2 of 3</p>{_alert(errors)}
<form method=post action="/checkout/payment" novalidate>
<fieldset><legend>Payment method</legend>{radios}</fieldset>
<label for=card>Card number (leave empty for invoice)</label><input type=text id=card name=card>
<button type=submit>Review order</button></form><p><a href="/checkout/shipping">Back to shipping</a></p>"""
    return page("Checkout: payment", body)


def _review(s: AppState, method: str) -> str:
    if not s.cart:
        raise _redirect("/cart")
    if "payment" not in s.checkout:
        raise _redirect("/checkout/payment")
    lines, subtotal = _cart_lines(s)
    c = s.checkout
    total = subtotal + SHIPPING[c["shipping"]]
    if method == "POST":
        order = Order(
            len(s.orders) + 1,
            {p.name: q for p, q in lines},
            c["full_name"],
            c["street"],
            c["city"],
            c["shipping"],
            c["payment"],
            c.get("card_last4", ""),
            round(total, 2),
        )
        s.orders.append(order)
        s.cart.clear()
        s.checkout.clear()
        raise _redirect(f"/orders/{order.id}")
    items = "".join(f"<li>{q} × {esc(p.name)} (${p.price * q:.2f})</li>" for p, q in lines)
    paid = f"Card ending {c['card_last4']}" if c["payment"] == "Card" else "Invoice"
    body = f"""<h1>Checkout: review</h1><p>Step 3 of 3</p><ul>{items}</ul>
<p>Ship to: {esc(c["full_name"])}, {esc(c["street"])}, {esc(c["city"])} ({esc(c["shipping"])})</p>
<p>Payment: {esc(paid)}</p><p>Total: ${total:.2f}</p>
<form method=post action="/checkout/review"><button type=submit>Place order</button></form>
<p><a href="/checkout/payment">Back to payment</a></p>"""
    return page("Checkout: review", body)


def _order(s: AppState, raw_id: str) -> str:
    order = next((o for o in s.orders if str(o.id) == raw_id), None)
    if order is None:
        raise _Response(HTTPStatus.NOT_FOUND, text=f"no order {raw_id}")
    items = ", ".join(f"{q} × {esc(n)}" for n, q in order.items.items())
    return page(
        f"Order {order.id}",
        f"<h1>Thank you!</h1><p role=status class=status>Order #{order.id} "
        f"placed: {items}. Total ${order.total:.2f}.</p>",
    )


def _faults() -> str:
    body = """<h1>Fault playground</h1>
<p><a href="/_faults/hang">Slow report</a></p>
<p><button onclick="while (true) {}">Freeze page</button></p>
<p><a href="http://example.com/">External docs</a></p>
<p><a href="http://127.0.0.1:9/">Other local port</a></p>
<p><button onclick="setTimeout(() => { location.href = 'http://example.com/' }, Number(this.dataset.ms))"
  data-ms="0">Leave shortly</button></p>
<p><a href="/todos" target="_blank">Todos in a new tab</a></p>
<p><button onclick="alert('Hello from a dialog')">Show dialog</button></p>
<p><button onclick="document.title = 'Changed title'; this.textContent = 'Clicked'">Change title</button></p>"""
    return page("Fault playground", body)
