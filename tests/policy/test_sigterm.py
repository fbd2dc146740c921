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
