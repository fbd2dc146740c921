"""Loopback port helper shared by the FSDP rendezvous, the tests and the benchmarks."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it; a race is possible but rare,
    which is acceptable for a rendezvous or a test server started right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
