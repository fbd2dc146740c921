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

from dataclasses import dataclass

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
