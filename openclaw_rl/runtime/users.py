"""Users: names, keys, and the records ``openclaw-rl users`` prints (docs/users.md).

A user key is ``ocu-<key id>-<secret>``: the key id (8 hex digits, stored as is) finds the user's
row without scanning; the secret (43 URL-safe characters, 256 random bits) is stored only as a
salted BLAKE2b digest and compared with :func:`hmac.compare_digest`. The key is shown once, when the
user is added; nothing in the run can print it again. A random 256-bit secret needs no slow hash:
there is no dictionary to guess from.

Every part of the system names users by :data:`DEFAULT_USER` when a request says nothing about who
sent it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from openclaw_rl.config import USER_NAME
from openclaw_rl.types import DEFAULT_USER

__all__ = ["DEFAULT_USER", "IssuedKey", "UserError", "UserStats", "check_user_name", "issue_key"]
KEY_PREFIX = "ocu-"
_KEY = re.compile(r"^ocu-([0-9a-f]{8})-([A-Za-z0-9_-]{43})$")


class UserError(ValueError):
    """A user operation refused: bad name, unknown user, name taken. The message says which."""


def check_user_name(name: str, where: str = "user") -> str:
    """``name`` if it is a valid user name, else :class:`UserError` naming ``where`` and the rule."""
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        shown = repr(name[:70]) if isinstance(name, str) else type(name).__name__
        raise UserError(
            f"{where}: {shown} is not a user name: 1-128 ASCII letters (a-z, A-Z), digits or '.', '_', "
            "'@', '+', '-', starting with a letter or digit"
        )
    return name


def name_for_user_field(value: str) -> str:
    """The user an OpenAI ``user`` field names. OpenAI's field is opaque (``idp|example-user``,
    ``user:42``): a value that is a user name is that user; any other is one of its own, named by
    its allowed characters (the rest as ``_``) and the first 8 hex digits of its SHA-256, so two
    different values never share a user and the same value is always the same one."""
    if USER_NAME.fullmatch(value):
        return value
    head = re.sub(r"[^A-Za-z0-9._@+-]", "_", value).lstrip("._@+-")[:100] or "user"
    return f"{head}-{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def adapter_meta(user: str) -> str:
    """The store meta key holding the version of ``user``'s served adapter (``users list`` reads it)."""
    return f"adapter_version:{user}"


@dataclass(frozen=True)
class IssuedKey:
    """A new user key: ``text`` goes to the user once; the store keeps ``key_id``, ``salt``, ``digest``."""

    text: str
    key_id: str
    salt: str
    digest: str


def _digest(salt: str, secret: str) -> str:
    return hashlib.blake2b(secret.encode(), key=bytes.fromhex(salt), digest_size=32).hexdigest()


def issue_key() -> IssuedKey:
    """A fresh random key for a user."""
    key_id, secret, salt = secrets.token_hex(4), secrets.token_urlsafe(32), secrets.token_hex(16)
    return IssuedKey(f"{KEY_PREFIX}{key_id}-{secret}", key_id, salt, _digest(salt, secret))


def split_key(text: str) -> tuple[str, str] | None:
    """(key id, secret) of something shaped like a user key, else None."""
    m = _KEY.match(text.strip())
    return (m.group(1), m.group(2)) if m else None


def key_matches(secret: str, salt: str, digest: str) -> bool:
    """Whether ``secret`` is the one the stored ``digest`` was made from (constant time)."""
    return hmac.compare_digest(_digest(salt, secret).encode(), digest.encode())


@dataclass(frozen=True)
class UserStats:
    """One line of ``openclaw-rl users list``."""

    name: str
    has_key: bool  # added with `users add` (False: only named by a gateway, or the default user)
    turns: int  # main turns served to them
    judged: int
    samples: int
    updates: int  # trainer updates that trained at least one of their samples
    adapter_version: str  # "shared vN" in shared mode (everyone's policy), else their adapter's
    positive_rate: float | None  # share of +1 among their last 50 judged turns
    feedback_up: int
    feedback_down: int


@dataclass(frozen=True)
class Feedback:
    """An explicit rating of one response (``POST /v1/feedback``)."""

    response_id: str
    user: str
    rating: int  # +1 or -1
    comment: str | None
    created_at: float


@dataclass(frozen=True)
class FeedbackOutcome:
    """What a feedback did to its turn: it is judged again from the rating; when none of its samples
    was trained yet, the new verdict is what trains (else it is recorded and counted, and the turn
    trains no second time)."""

    session_id: str
    turn_index: int
    will_train: bool  # no sample of the turn was trained yet: the new verdict trains it
    replaced_next_state: bool  # the turn had a next state (a reply, a tool output) before
