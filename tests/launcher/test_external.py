"""``policy_service.launch = true``: the engine command lines, the not-installed error, and the
subprocess lifecycle (start, readiness over real HTTP, early exit, stop) with a stand-in server."""

from __future__ import annotations

import sys
import time

import pytest

from openclaw_rl.config import build_config
from openclaw_rl.launcher.external import (
    EngineError,
    ExternalEngine,
    engine_address,
    engine_command,
    launch_problem,
)
from openclaw_rl.runtime.ports import free_port

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model


def _cfg(tmp_path, backend="vllm", **pol):
    return build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {
                "backend": backend,
                "model": "org/model-4b",
                "launch": True,
                "port": 30000,
                **pol,
            },
        },
        environ={},
    )


def test_missing_package_is_a_clear_error(tmp_path):
    for backend in ("sglang", "vllm"):
        cfg = _cfg(tmp_path, backend)
        problem = launch_problem(cfg)
        if problem is None:
            pytest.skip(f"{backend} is installed here")
        assert f"the {backend} package is not installed" in problem and "engine_url" in problem
        with pytest.raises(EngineError, match="not installed"):
            ExternalEngine(cfg)
    assert "backend = 'transformers'" in (launch_problem(_cfg(tmp_path, "transformers")) or "")


def test_command_lines_carry_what_weight_sync_needs(tmp_path):
    cmd, env = engine_command(_cfg(tmp_path, "vllm", engine_url="http://10.0.0.5:8001"))
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in cmd and cmd[cmd.index("--port") + 1] == "8001"
    assert cmd[cmd.index("--host") + 1] == "10.0.0.5"
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    cmd, env = engine_command(_cfg(tmp_path, "sglang"))
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[cmd.index("--model-path") + 1] == "org/model-4b"
    assert engine_address(_cfg(tmp_path, "sglang")) == ("127.0.0.1", 30001)


# A real HTTP server standing in for the engine: answers /v1/models only after a short "load".
STAND_IN = """
import http.server, json, sys, time
time.sleep(0.5)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/v1/models"
        self.send_response(200 if ok else 404); self.end_headers()
        self.wfile.write(json.dumps({"data": [{"id": "m"}]}).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_lifecycle_against_a_stand_in_server(tmp_path):
    port = free_port()
    cfg = _cfg(tmp_path, "vllm", engine_url=f"http://127.0.0.1:{port}")
    engine = ExternalEngine(cfg, command=[sys.executable, "-c", STAND_IN, str(port)])
    engine.start()
    try:
        engine.wait_ready(timeout=30)
        assert engine.alive()
    finally:
        engine.stop(timeout=10)
    assert not engine.alive()

    dead = ExternalEngine(cfg, command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    dead.start()
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="exited with code 3"):
        dead.wait_ready(timeout=30)
    assert time.monotonic() - t0 < 15
