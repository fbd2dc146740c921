"""Who is talking: a request's credentials and what they let it say about its user (docs/users.md).

* a **user key** (``ocu-...``, from ``openclaw-rl users add``) makes the request that user's,
  whatever its body says; a key that matches no user, or anything else sent as a key that begins
  ``ocu-`` (a user key cut short or mistyped), is refused (401), never served as someone else;
* a **trusted gateway** — a request authenticated with the service's own ``api_key``, or, when
  there is none, one from loopback — names its users: the header ``[users] header`` if configured
  and sent, else the body's OpenAI ``user`` field;
* anything else is :data:`~openclaw_rl.types.DEFAULT_USER`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from openclaw_rl.config import is_loopback as config_is_loopback
from openclaw_rl.policy.protocol import APIError
from openclaw_rl.runtime.users import UserError, check_user_name
from openclaw_rl.types import DEFAULT_USER


@dataclass(frozen=True)
class Caller:
    """What a request's credentials established."""

    key_user: str | None  # the user whose own key authenticated the request
    trusted: bool  # may name its users (the service's api_key, or loopback when there is none)

    def user(self, named: str | None, where: str = "user") -> str:
        """The request's user, given the name it carries (body field or header) or None."""
        if self.key_user is not None:
            return self.key_user
        if not self.trusted or named is None:
            return DEFAULT_USER
        try:
            return check_user_name(named, where)
        except UserError as exc:
            raise APIError(400, str(exc), param=where) from None


def is_loopback(host: str | None) -> bool:
    """Whether a peer address is this machine's (``127.0.0.0/8``, ``::1``)."""
    return bool(host) and config_is_loopback(host or "")


def _host_name(value: str) -> str:
    """The host of an ``Origin`` (``http://localhost:5173``) or a ``Host`` header (``[::1]:30000``)."""
    try:
        return urlsplit(value if "://" in value else f"//{value}").hostname or ""
    except ValueError:  # a malformed port or bracket: no host this machine answers to
        return ""


def browser_problem(headers: Mapping[str, str], bound_to_loopback: bool) -> str | None:
    """Why a request to a service with no key must be refused as a web page's, or None.

    With no key, whoever reaches the port is served; on loopback that is meant to be this machine's
    programs. A page open in a local browser reaches it too: its form or ``fetch`` POSTs a JSON text
    as ``text/plain`` with no preflight (cross-site request forgery), or its own domain resolves to
    127.0.0.1 (DNS rebinding), and its text would be recorded and trained on. Programs (SDKs, curl,
    OpenClaw) send no ``Origin``; a browser always does on such a POST. A rebinding page cannot
    choose its ``Host``: it is the page's domain, not this machine's name."""
    origin = headers.get("origin")
    if origin is not None and not config_is_loopback(_host_name(origin)):  # "null" has no host either
        return (
            f"a request from a web page (Origin: {origin[:80]}): this service has no api_key, so only "
            "programs on this machine may use it"
        )
    host = headers.get("host")
    if bound_to_loopback and host and not config_is_loopback(_host_name(host)):
        return (
            f"Host {host[:80]!r} is not this machine's loopback name: a page whose domain resolves to "
            "127.0.0.1 (DNS rebinding); use localhost or 127.0.0.1 (a reverse proxy in front: have it "
            "send Host: localhost, or set [policy_service] api_key)"
        )
    return None
