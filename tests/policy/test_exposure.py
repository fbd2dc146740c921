"""Safe to expose: admin routes never open, weights only from the run's export folder, and a public
address without a configured key requires a generated client key, unless the config says an open
endpoint is intended."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import time

import httpx
import pytest

from openclaw_rl.config import build_config, generates_client_key
from openclaw_rl.runtime.ports import free_port
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
    # weights that cannot be read are the caller's error (400 naming the path), not the service's
    broken = RunDir.of(svc.cfg).policies / "v000007"
    broken.mkdir(parents=True)
    (broken / "adapter_config.json").write_text("not json")
    too_long = str(RunDir.of(svc.cfg).policies / ("x" * 5000))
    not_an_object = RunDir.of(svc.cfg).policies / "v000008"
    not_an_object.mkdir()
    (not_an_object / "adapter_config.json").write_text("[1, 2]")
    cut = RunDir.of(svc.cfg).policies / "v000009"
    cut.mkdir()
    (cut / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}')
    (cut / "adapter_model.safetensors").write_bytes(b"\x07" * 100)
    with httpx.Client(headers=admin, timeout=60) as c:  # one connection: it survives each refusal
        for path in (str(broken), too_long, str(not_an_object), str(cut)):
            r = c.post(f"{url}/v1/admin/load_weights", json={"path": path, "version": 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == "path", r.text
        assert c.post(f"{url}/v1/admin/pause", json={"paused": False}).status_code == 200


def test_a_keyless_service_refuses_web_pages_and_rebinding_hosts_and_records_nothing(
    start_service, tiny_model_dir
):
    """With no key, a page open in a local browser could POST its text (text/plain, no preflight)
    or reach 127.0.0.1 through its own domain (DNS rebinding): both are refused, and nothing of
    theirs is recorded; programs (no Origin, a loopback Host) are served as before."""
    svc, url = start_service(tiny_model_dir, "keyless")
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "session_id": "victim"}'
    plain = {"Content-Type": "text/plain"}
    for headers in (
        {**plain, "Origin": "http://evil.example"},
        {**plain, "Origin": "null"},  # a sandboxed frame or a file:// page
        {**plain, "Host": "rebind.evil.example:30000"},
    ):
        r = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "browser_request_refused", r.text
        r = httpx.post(
            f"{url}/v1/feedback", json={"response_id": "x", "rating": 1}, headers=headers, timeout=60
        )
        assert r.status_code == 403, r.text
    assert svc.store.counters().turns == 0
    local = {"Origin": "http://localhost:5173"}  # a page served from this machine
    for headers in ({}, local, {"Host": f"localhost:{url.rsplit(':', 1)[1]}"}):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": USER, "max_tokens": 1},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text


def test_each_run_gets_a_new_private_admin_secret(tmp_path):
    run = RunDir(tmp_path / "run")
    first = run.new_admin_key()
    assert run.admin_key() == first and len(first) >= 32
    assert stat.S_IMODE(run.admin_key_file.stat().st_mode) == 0o600  # readable by the owner only
    assert run.new_admin_key() != first


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-host.example"])
def test_a_public_host_without_a_client_key_gets_a_generated_one(host, tmp_path):
    cfg = build_config({"global": {"log_dir": str(tmp_path)}, "policy_service": {"host": host}}, environ={})
    assert generates_client_key(cfg.policy_service)
    run = RunDir.of(cfg)
    key = run.client_key(cfg.policy_service)
    assert key and len(key) >= 32 and run.client_key_file.read_text() == key
    assert stat.S_IMODE(run.client_key_file.stat().st_mode) == 0o600
    assert run.client_key(cfg.policy_service) == key  # made once: configured clients keep working
    # a key of the user's own, or a declared open endpoint, keep their meaning
    keyed = build_config({"policy_service": {"host": host, "api_key": "k"}}, environ={}).policy_service
    assert not generates_client_key(keyed) and RunDir(tmp_path / "k").client_key(keyed) == "k"
    opened = build_config({"policy_service": {"host": host, "allow_open_endpoint": True}}, environ={})
    assert RunDir(tmp_path / "o").client_key(opened.policy_service) is None


def test_racing_processes_agree_on_one_client_key(tmp_path):
    script = (
        "import sys\n"
        "from openclaw_rl.config import build_config\n"
        "from openclaw_rl.runtime.rundir import RunDir\n"
        "cfg = build_config({'global': {'log_dir': sys.argv[1]}, 'policy_service': {'host': '0.0.0.0'}}, environ={})\n"
        "print(RunDir.of(cfg).client_key(cfg.policy_service))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and keys == {(tmp_path / "client.key").read_text()}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_loopback_needs_no_key(host):
    assert build_config({"policy_service": {"host": host}}, environ={}).policy_service.host == host


def test_a_public_bind_requires_the_generated_key(tmp_path, tiny_model_dir):
    """`openclaw-rl serve --host 0.0.0.0` with no api_key: it starts, writes <log_dir>/client.key
    (0600), says where it is without printing it, and refuses requests without it; admin routes stay
    on their own secret."""
    port = free_port()
    conf = tmp_path / "c.toml"
    conf.write_text(f'[global]\nlog_dir = "{tmp_path}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n')
    proc = subprocess.Popen(
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
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        key_file = tmp_path / "client.key"
        key = key_file.read_text()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        body = {"messages": USER, "max_tokens": 1}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert key not in r.text
        wrong = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer x"}, timeout=60
        )
        assert wrong.status_code == 401
        ok = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        assert ok.status_code == 200, ok.text
        # the client key opens no admin route; the run's admin secret does
        admin = httpx.post(
            f"{url}/v1/admin/pause",
            json={"paused": False},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert admin.status_code == 401 and admin.json()["error"]["code"] == "invalid_admin_key"
        run = RunDir(tmp_path)
        admin = httpx.post(
            f"{url}/v1/admin/pause",
            json={"paused": False},
            headers={"Authorization": f"Bearer {run.admin_key()}"},
            timeout=30,
        )
        assert admin.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    assert str(key_file) in out and "generated key" in out
    assert key not in out  # the path is printed, the key never
    assert key not in (tmp_path / "store.sqlite").read_bytes().decode("latin-1")


def test_the_runs_own_clients_send_the_generated_key(tmp_path):
    """The environment workers and the evaluator reach a public, keyless service with its client key."""
    import threading

    from openclaw_rl.envs.loop import PolicyClient

    cfg = build_config(
        {"global": {"log_dir": str(tmp_path)}, "policy_service": {"host": "0.0.0.0"}}, environ={}
    )
    client = PolicyClient.from_config(cfg, "http://127.0.0.1:1", threading.Event())
    key = (tmp_path / "client.key").read_text()
    assert client.http.headers["Authorization"] == f"Bearer {key}"
