"""Keeping keys out of what other services say back: an error text can quote the key it was sent.

Every loop that quotes a remote service's error (the env workers, the chat persona's user model,
the API judge) passes it through :func:`without_key` before it reaches a log, a record or a reply.
"""

from __future__ import annotations

import re

#: What an API's error may quote of the credentials it was sent (OpenAI-style keys, a bearer token).
_CREDENTIAL = re.compile(r"(Bearer\s+|\b(?:sk|pk|rk)-)[A-Za-z0-9._*\-]+")


def without_key(text: str, key: str) -> str:
    """``text`` with ``key`` and anything shaped like a bearer token or an ``sk-`` key masked."""
    if key:
        text = text.replace(key, "[key]")
    return _CREDENTIAL.sub(lambda m: m.group(1) + "[key]", text)
