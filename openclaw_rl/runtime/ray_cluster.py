"""Joining a Ray cluster: the address check, the connection, the live nodes.

Used by the launcher's cluster mode and by the policy service's engine replicas. ``ray`` is an
optional extra (``pip install 'openclaw-rl[ray]'``), imported only when a function here is called,
so everything else works without it. See docs/scaling.md.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openclaw_rl.config import RAY_MISSING

#: How long a check of ``ray_address`` may take (the dry run's whole budget is 25 s).
ADDRESS_TIMEOUT_S = 10.0
NAMESPACE = "openclaw_rl"


def ray_module() -> Any:
    """``import ray``, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(RAY_MISSING) from None
    return ray


def _resolve_auto() -> str | None:
    """``auto``: $RAY_ADDRESS, else the address ``ray start`` recorded for this machine."""
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return env
    recorded = Path("/tmp/ray/ray_current_cluster")
    if recorded.is_file():
        text = recorded.read_text(encoding="utf-8").strip()
        return text or None
    return None


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``ray://host:port`` → (host, port); ValueError saying what is wrong."""
    raw = address.strip()
    target = raw if "://" in raw else f"ray://{raw}"
    parts = urlsplit(target)
    if parts.scheme not in ("ray", "http", "https") or not parts.hostname:
        raise ValueError(
            f"[global] ray_address = {address!r} is not host:port (or ray://host:port or 'auto')"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise ValueError(
            f"[global] ray_address = {address!r} has no valid port (the head's --port, e.g. 6379)"
        )
    return parts.hostname, port


def check_ray_address(address: str | None, timeout_s: float = ADDRESS_TIMEOUT_S) -> str | None:
    """None when a Ray head answers at ``address`` within ``timeout_s``; otherwise why not.

    A TCP connect to the head's GCS port and the start of a gRPC (HTTP/2) handshake: enough to tell
    "nothing there" or "some other server" from "a cluster", and it never waits longer than about
    ``timeout_s`` per step (ray.init itself can retry for a minute or more).
    """
    if not address:
        return '[global] ray_address is not set (the head\'s host:port, or "auto")'
    resolved = _resolve_auto() if address == "auto" else address
    if resolved is None:  # only "auto" can resolve to nothing
        return (
            '[global] ray_address = "auto": no Ray cluster recorded on this machine '
            "(no $RAY_ADDRESS, no /tmp/ray/ray_current_cluster); start one with `ray start --head`"
        )
    try:
        host, port = parse_address(resolved)
    except ValueError as exc:
        return str(exc)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(_H2_PREFACE)
            first = conn.recv(9)
    except OSError as exc:
        return (
            f"[global] ray_address = {address!r}: no Ray head reachable at {host}:{port} within "
            f"{timeout_s:.0f}s ({exc.strerror or type(exc).__name__})"
        )
    if len(first) < 4 or first[3] != _H2_SETTINGS:
        return (
            f"[global] ray_address = {address!r}: something answers at {host}:{port}, but not a Ray "
            "head (no gRPC answer): give the head's GCS port (`ray start --head --port`, 6379 by default)"
        )
    return None


#: A Ray head's GCS speaks gRPC: to HTTP/2's client preface (and an empty SETTINGS frame) a gRPC
#: server answers with a SETTINGS frame of its own. A bare TCP connect cannot tell the head from any
#: other listener (a web server, a proxy that accepts every connection).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 0x04  # the frame type byte, the fourth of a frame's nine-byte header


def connect(address: str | None, timeout_s: float = ADDRESS_TIMEOUT_S) -> Any:
    """Join the cluster at ``address`` as a driver (fails within ``timeout_s`` if it is unreachable)."""
    ray = ray_module()
    problem = check_ray_address(address, timeout_s)
    if problem:
        raise ConnectionError(problem)
    if not ray.is_initialized():
        assert address is not None
        ray.init(
            address=address if address != "auto" else _resolve_auto(),
            namespace=NAMESPACE,
            log_to_driver=False,
            include_dashboard=False,
            configure_logging=False,
        )
    return ray


def live_nodes() -> list[str]:
    """Node ids of the cluster's alive nodes."""
    ray = ray_module()
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
