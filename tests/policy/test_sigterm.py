"""``openclaw-rl serve`` as a real process: SIGTERM lets an in-flight request finish and be recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openclaw_rl.runtime.ports import free_port
from openclaw_rl.runtime.store import Store

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

SCRIPT = """
import sys
from openclaw_rl.config import load_config
from openclaw_rl.policy.server import serve_command
sys.exit(serve_command(load_config(sys.argv[1]), None, int(sys.argv[2])))
"""


def test_sigterm_drains_and_records(tmp_path: Path, tiny_model_dir):
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n'
        'host = "127.0.0.1"\nweight_sync_interval = 10\n[env_service]\nenabled = false\n'
    )
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cfg), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "listening on" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "server exited before listening"
        assert line.strip() == f"[policy_service] listening on 127.0.0.1:{port}, max_concurrent=64"
        url = f"http://127.0.0.1:{port}"
        chunks = []
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            timeout=120,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 300,
                "temperature": 0,
                "stream": True,
                "session_id": "term",
            },
        ) as s:
            for data in s.iter_lines():
                if data.startswith("data: "):
                    chunks.append(data)
                    if len(chunks) == 3:
                        proc.send_signal(signal.SIGTERM)
        assert chunks[-1] == "data: [DONE]"
        final = json.loads(chunks[-2][6:])
        assert final["choices"][0]["finish_reason"] == "length"
        assert proc.wait(60) == 0
        out = proc.stdout.read()
        assert "stopped after 1 request(s)" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    (turn,) = Store(tmp_path / "logs" / "store.sqlite").session_turns("term")
    assert len(turn.response_ids) == 300


def test_serve_with_another_port_keeps_the_engine_where_the_config_says(tmp_path: Path):
    """A forwarding config (sglang, no engine_url) puts its engine at the config's port + 1, and says
    so; `serve --port P` moves this service, not an engine already running: the requests go where
    the warning said."""
    config_port, port = free_port(), free_port()
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[global]\nlog_dir = "{tmp_path / "logs"}"\n[policy_service]\nbackend = "sglang"\n'
        f'model = "your-policy-model"\nport = {config_port}\n[env_service]\nenabled = false\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "openclaw_rl.cli", "serve", "--config", str(cfg), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen, deadline = [], time.monotonic() + 120
        while not any("listening on" in s for s in seen) and time.monotonic() < deadline:
            seen.append(proc.stdout.readline())
            assert seen[-1] or proc.poll() is None, "".join(seen)
        engine = f"127.0.0.1:{config_port + 1}"
        assert any(f"assuming the engine at http://{engine}" in s for s in seen), seen
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 502 and engine in r.json()["error"]["message"], r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
