"""Client side of the policy service's admin routes, for the other loops' processes (here, below them
all, so that the trainer and the launchers call the service without importing the policy package).

The trainer swaps weights and (in lock-step mode) pauses serving; the cluster runner closes the
sessions of episodes lost with a node. Each call is one POST authenticated with the run's admin
secret (:meth:`~openclaw_rl.runtime.rundir.RunDir.admin_key`, never the clients' ``api_key``) with a timeout that
returns an error message instead of raising: the caller keeps running and reports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.config import Config
from openclaw_rl.runtime.rundir import RunDir

# A swap loads a checkpoint into every engine replica; on a busy 2-core machine two replicas take
# tens of seconds. The trainer waits this long (plus a margin) for its last swap before it exits.
SWAP_TIMEOUT_S = 60.0

#: Store meta key: where the policy service serving this run was last reached (its URL), written
#: when it binds. A service started with ``serve --port`` is not where the config says, and the
#: verbs run beside it (``users delete``) must still find it.
SERVICE_URL_META = "service_url"


def service_url(cfg: Config, recorded: object) -> str:
    """Where the run's policy service is: the URL it recorded at start, else the config's."""
    return recorded if isinstance(recorded, str) and recorded else cfg.policy_service.local_url


def admin_post(cfg: Config, policy_url: str, route: str, body: dict[str, Any], timeout: float) -> str | None:
    """POST an admin route of the policy service at ``policy_url``; an error message, or None."""
    headers = {"Authorization": f"Bearer {RunDir.of(cfg).admin_key()}"}
    try:
        r = httpx.post(f"{policy_url.rstrip('/')}{route}", json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"policy service at {policy_url} unreachable: {type(exc).__name__}"
    if r.status_code >= 400:
        return f"policy service refused {route}: HTTP {r.status_code} {r.text[:200]}"
    return None


def serving_generating(policy_url: str, timeout: float = 2.0) -> int | None:
    """Requests the policy service at ``policy_url`` is computing now (its ``/healthz``
    ``generating``: decoding in the embedded engine, or forwarded to an engine and not answered yet),
    or None when it cannot tell. Requests held by a lock-step pause or queued are not counted: they
    use no CPU."""
    try:
        r = httpx.get(f"{policy_url.rstrip('/')}/healthz", timeout=timeout)
        value = r.json().get("generating") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return value if isinstance(value, int) else None


def request_swap(
    cfg: Config,
    policy_url: str,
    path: Path,
    version: int,
    timeout: float = SWAP_TIMEOUT_S,
    user: str | None = None,
) -> str | None:
    """Ask the policy service to load ``path`` as ``version`` (``user``: as that user's adapter)."""
    body: dict[str, Any] = {"path": str(path), "version": version}
    if user is not None:
        body["user"] = user
    return admin_post(cfg, policy_url, "/v1/admin/load_weights", body, timeout)


def request_pause(cfg: Config, policy_url: str, paused: bool, timeout: float = 30.0) -> str | None:
    """Hold (``True``) or release (``False``) new requests: lock-step training."""
    return admin_post(cfg, policy_url, "/v1/admin/pause", {"paused": paused}, timeout)


def close_session(cfg: Config, policy_url: str, session_id: str, timeout: float = 10.0) -> str | None:
    """End a session whose client went away (its open last turn is closed, not left waiting)."""
    return admin_post(cfg, policy_url, "/v1/admin/close_session", {"session_id": session_id}, timeout)


def forget_user(cfg: Config, policy_url: str, user: str, timeout: float = 10.0) -> str | None:
    """Tell a running policy service to drop a deleted user's adapter from memory."""
    return admin_post(cfg, policy_url, "/v1/admin/forget_user", {"user": user}, timeout)
