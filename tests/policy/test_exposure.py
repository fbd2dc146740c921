"""Safe to expose: admin routes never open, weights only from the run's export folder, and no
public address without a client key unless the config says an open endpoint is intended."""

from __future__ import annotations

import stat
import subprocess
import sys

import httpx
import pytest

from openclaw_rl.config import ConfigError, build_config
from openclaw_rl.policy.server import OpenEndpointError, PolicyService
from openclaw_rl.runtime.rundir import RunDir

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

USER = [{"role": "user", "content": "hi"}]


def test_admin_routes_need_the_run_secret_even_on_an_open_server(start_service, tiny_model_dir):
    svc, url = start_service(tiny_model_dir, "open")  # no api_key: the model routes are open
    assert (
        httpx.post(
            f"{url}/v1/chat/completions", json={"messages": USER, "max_tokens": 1}, timeout=60
        ).status_code
        == 200
    )
    for route, body in (
        ("/v1/admin/pause", {"paused": True}),
        ("/v1/admin/load_weights", {"path": "/", "version": 1}),
        ("/v1/admin/close_session", {"session_id": "x"}),
    ):
        r = httpx.post(url + route, json=body, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key", (route, r.text)
    assert not svc.serving.paused
    admin = {"Authorization": f"Bearer {RunDir.of(svc.cfg).admin_key()}"}
    r = httpx.post(f"{url}/v1/admin/pause", json={"paused": False}, headers=admin, timeout=30)
    assert r.status_code == 200 and r.json() == {"ok": True, "paused": False}


def test_each_run_gets_a_new_private_admin_secret(tmp_path):
    run = RunDir(tmp_path / "run")
    first = run.new_admin_key()
    assert run.admin_key() == first and len(first) >= 32
    assert stat.S_IMODE(run.admin_key_file.stat().st_mode) == 0o600  # readable by the owner only
    assert run.new_admin_key() != first


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-host.example"])
def test_a_public_host_without_a_client_key_is_refused(host):
    with pytest.raises(ConfigError) as exc:
        build_config({"policy_service": {"host": host}}, environ={})
    text = str(exc.value)
    assert f"[policy_service] host = {host!r}" in text and "allow_open_endpoint" in text
    # with a key, or with the open endpoint declared, it loads
    assert (
        build_config({"policy_service": {"host": host, "api_key": "k"}}, environ={}).policy_service.host
        == host
    )
    assert build_config({"policy_service": {"host": host, "allow_open_endpoint": True}}, environ={})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_loopback_needs_no_key(host):
    assert build_config({"policy_service": {"host": host}}, environ={}).policy_service.host == host


def test_serve_host_override_is_checked_too(tmp_path, tiny_model_dir):
    """`openclaw-rl serve --host 0.0.0.0` bypasses the file's validation; the server refuses anyway."""
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path)},
            "policy_service": {"model": str(tiny_model_dir)},
            "env_service": {"enabled": False},
        },
        environ={},
    )
    cfg.policy_service.host = "0.0.0.0"
    with pytest.raises(OpenEndpointError, match="allow_open_endpoint"):
        PolicyService(cfg).start()
    conf = tmp_path / "c.toml"
    conf.write_text(f'[global]\nlog_dir = "{tmp_path}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openclaw_rl.cli",
            "serve",
            "--config",
            str(conf),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "allow_open_endpoint" in proc.stderr and "Traceback" not in proc.stderr
