"""Cluster mode on a real two-node Ray cluster on loopback (one CPU each): address checks, config
validation, environment workers spread over the nodes, and a node killed mid-episode whose episode
is retried on the other node with none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from openclaw_rl.config import ConfigError, build_config
from openclaw_rl.runtime.ports import free_port
from openclaw_rl.runtime.ray_cluster import check_ray_address, parse_address
from openclaw_rl.runtime.rundir import RunDir

from ..envs._server import ChatServer

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

RAY_BIN = Path(sys.executable).with_name("ray")


def _cfg(tmp_path: Path, address: str, data: Path, port: int = 30000):
    return build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs"), "ray_address": address},
            "policy_service": {"port": port, "host": "127.0.0.1", "model": "m", "request_timeout_sec": 30},
            "env_service": {
                "mode": "cloud",
                "num_envs": 2,
                "interaction_types": ["chat"],
                "max_turns": 2,
                "data_path": str(data),
            },
        },
        environ={},
    )


def test_cloud_needs_ray_address(tmp_path):
    with pytest.raises(ConfigError) as exc:
        build_config({"env_service": {"mode": "cloud"}}, environ={})
    assert "[global] ray_address" in str(exc.value)


def test_cloud_without_the_ray_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(ConfigError) as exc:
        build_config(
            {"global": {"ray_address": "127.0.0.1:6379"}, "env_service": {"mode": "cloud"}}, environ={}
        )
    assert "pip install 'openclaw-rl[ray]'" in str(exc.value)


def test_unreachable_address_fails_fast():
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    problem = check_ray_address(f"127.0.0.1:{port}", timeout_s=5)
    assert problem and f"127.0.0.1:{port}" in problem and time.monotonic() - t0 < 30
    assert "no valid port" in (check_ray_address("127.0.0.1") or "")
    assert parse_address("ray://10.0.0.1:10001") == ("10.0.0.1", 10001)


def test_a_listener_that_is_no_ray_head_is_named_so():
    """A TCP connect passed for any listener: the dry run called a web server (or a proxy that
    accepts every connection) a reachable cluster, and the run then hung in ray.init."""
    import http.server
    import socket
    import threading

    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        problem = check_ray_address(f"127.0.0.1:{web.server_address[1]}", timeout_s=5)
    finally:
        web.shutdown()
    assert problem and "not a Ray head" in problem and "6379" in problem, problem
    with socket.socket() as silent:  # accepts (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        t0 = time.monotonic()
        problem = check_ray_address(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=2)
    assert problem and time.monotonic() - t0 < 15, problem


def test_configs_shipped_to_actors_carry_absolute_paths(tmp_path, monkeypatch, tiny_model_dir, gsm8k_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "g.json").write_text(gsm8k_path.read_text())
    cfg = build_config(
        {
            "global": {"log_dir": "logs/run"},
            "policy_service": {"model": os.path.relpath(tiny_model_dir, tmp_path)},
            "env_service": {"data_path": "data/g.json"},
        },
        environ={},
    )
    out = cfg.with_absolute_paths()
    assert out.global_.log_dir == str(tmp_path / "logs" / "run")  # one store for every actor
    assert out.env_service.data_path == str(tmp_path / "data" / "g.json")
    assert out.policy_service.model == str(Path(tiny_model_dir).resolve())
    assert out.prm_service.model == cfg.prm_service.model  # a model *name* is not a path: unchanged
    assert cfg.global_.log_dir == "logs/run"  # the caller's config is left alone


# ------------------------------------------------------------------------- the real cluster


def _start(argv: list[str]) -> subprocess.Popen:
    # Own process group: teardown stops exactly these processes (and what they started), by id.
    return subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 20) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head node and a second node on loopback, one CPU each; yields (address, worker_proc)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'openclaw-rl[ray]')")
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--object-store-memory=78643200", "--disable-usage-stats", "--block"]
    env_cfg = '{"health_check_period_ms": 1000, "health_check_failure_threshold": 3}'
    head = _start(
        [
            str(RAY_BIN),
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            f"--system-config={env_cfg}",
            *common,
        ]
    )
    worker = None
    try:
        deadline = time.monotonic() + 90
        while check_ray_address(address, timeout_s=1) is not None:
            assert head.poll() is None, "ray head exited during start-up"
            assert time.monotonic() < deadline, "ray head did not come up in 90 s"
            time.sleep(0.5)
        worker = _start(
            [str(RAY_BIN), "start", f"--address={address}", "--node-ip-address=127.0.0.1", *common]
        )
        from openclaw_rl.runtime.ray_cluster import connect, live_nodes

        connect(address)
        while len(live_nodes()) < 2:
            assert worker.poll() is None, "second ray node exited during start-up"
            assert time.monotonic() < deadline, "second ray node did not join in 90 s"
            time.sleep(0.5)
        yield address, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for proc in (worker, head):
            if proc is not None:
                _kill_group(proc)


def test_dry_run_fails_fast_on_an_unreachable_cluster(tmp_path, gsm8k_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'openclaw-rl[ray]')")
    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "c.toml"
    path.write_text(
        f'[global]\nray_address = "127.0.0.1:{free_port()}"\n[policy_service]\nnum_engines = 2\n'
        f'[env_service]\nmode = "cloud"\nnum_envs = 1\ndata_path = "{gsm8k_path}"\n'
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_rl.launcher", "--config", str(path), "--dry-run"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    assert "[dry-run] env_service: FAILED" in proc.stdout and "no Ray head reachable" in proc.stdout
    assert "2 engine replicas on the cluster" in proc.stdout
    t0 = time.monotonic()  # and at start: nothing is launched, a one-line error instead of a hang
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_rl.launcher", "--config", str(path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - t0 < 30
    assert (
        proc.returncode == 2
        and "error: env_service:" in proc.stderr
        and "no Ray head reachable" in proc.stderr
    )
    assert "Traceback" not in proc.stdout + proc.stderr


def test_end_to_end_training_on_the_cluster(ray_cluster, tmp_path, tiny_model_dir, gsm8k_path, capsys):
    """Everything on the cluster: the policy service with 2 engine replicas, 2 judge actors, the trainer
    and 2 env workers; two PPO updates, each turn judged once."""
    from openclaw_rl.config import load_config
    from openclaw_rl.launcher.cluster import run_cluster
    from openclaw_rl.runtime.store import Store

    address, _ = ray_cluster
    port = free_port()
    path = tmp_path / "cluster.toml"
    path.write_text(f"""
[global]
log_dir = "{tmp_path / "logs"}"
ray_address = "{address}"
[policy_service]
model = "{tiny_model_dir}"
port = {port}
max_tokens_default = 12
weight_sync_interval = 1
num_engines = 2
engine_num_cpus = 0.25
[env_service]
mode = "cloud"
num_envs = 2
interaction_types = ["chat"]
personas = ["student"]
max_turns = 2
data_path = "{gsm8k_path}"
[prm_service]
backend = "minilm"
model = "{tiny_model_dir}"
num_workers = 2
[training]
lr = 1e-3
batch_size = 2
mini_batch_size = 2
checkpoint_interval = 1
max_steps = 2
num_cpus = 0.25
""")
    cfg = load_config(path)
    rc = run_cluster(cfg, str(path), install_signals=False)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[cluster] training finished" in out and "'step': 2" in out
    assert "[cluster] episodes=" in out and "retried=0" in out
    assert "[prm_service] judge actors=2" in out
    store = Store(cfg.log_dir / "store.sqlite")
    try:
        counters = store.counters()
        served_version = store.get_meta("policy_version")
    finally:
        store.close()
    assert counters.samples_trained >= 4, counters  # two updates of batch_size 2, committed
    assert served_version == 2  # both updates were swapped into the two replicas
    assert (cfg.log_dir / "checkpoints" / "latest").is_file()


def test_engine_replicas_keep_sessions_and_survive_a_dead_replica(ray_cluster, tmp_path, tiny_model_dir):
    """Two engine replicas (one per node) behind one endpoint: sessions stick to a replica, new ones
    spread, a swap reaches both, and a killed replica's session fails over and comes back resynced."""
    import httpx
    import ray

    from openclaw_rl.policy.replicas import ReplicatedEngine
    from openclaw_rl.policy.server import PolicyService
    from openclaw_rl.runtime.store import Store
    from tests.helpers import save_tiny_model

    address, _ = ray_cluster
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs"), "ray_address": address},
            "policy_service": {
                "model": str(tiny_model_dir),
                "port": 0,
                "max_tokens_default": 6,
                "num_engines": 2,
                "engine_num_cpus": 0.5,
                "request_timeout_sec": 60,
                "max_model_len": 8192,
            },
            "env_service": {"mode": "cloud", "num_envs": 1},
        },
        environ={},
    )
    svc = PolicyService(cfg)
    assert isinstance(svc.engine, ReplicatedEngine)
    url = svc.start()
    engine = svc.engine
    try:
        assert len(set(engine.nodes)) == 2, engine.nodes  # SPREAD: one replica per node

        def turn(sid: str, text: str) -> dict:
            r = httpx.post(
                f"{url}/v1/chat/completions",
                headers={"X-Session-Id": sid},
                timeout=60,
                json={"messages": [{"role": "user", "content": text}], "temperature": 0},
            )
            assert r.status_code == 200, r.text
            return r.json()

        sessions = [f"s{i}" for i in range(6)]
        for round_ in range(2):
            threads = [
                threading.Thread(target=turn, args=(sid, f"turn {round_} of {sid}")) for sid in sessions
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
        served = ray.get([r.served_sessions.remote() for r in engine.replicas], timeout=30)
        assert all(served), served  # load spread over both replicas
        assert set(served[0]).isdisjoint(served[1])  # each session on exactly one replica
        assert set(served[0]) | set(served[1]) == set(sessions)
        assert all(n == 2 for per in served for n in per.values())  # both turns of a session, same replica
        health = httpx.get(f"{url}/healthz", timeout=10).json()
        assert health["engines"] == 2 and health["failovers"] == 0

        # a client that hangs up on a long reply: the replica decoding it stops (it is not recorded)
        long = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 6000, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=long, timeout=60) as r:
            assert r.status_code == 200
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            for _ in range(6):  # some tokens in: a replica is decoding it
                next(events)
        deadline = time.monotonic() + 120  # generous: it only bounds a failing test
        while True:
            states = ray.get([x.ready.remote() for x in engine.replicas], timeout=30)
            if not any(x["decoding"] for x in states):
                break
            assert time.monotonic() < deadline, "a replica is still decoding the reply nobody reads"
            time.sleep(0.2)
        assert sum(x["cancelled"] for x in states) == 1  # dropped mid-reply, not run to its end

        run = RunDir.of(cfg)
        weights = save_tiny_model(run.policies / "v000001", seed=1)  # the run's export folder
        r = httpx.post(
            f"{url}/v1/admin/load_weights",
            json={"path": str(weights), "version": 1},
            headers={"Authorization": f"Bearer {run.admin_key()}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        versions = [
            i["policy_version"] for i in ray.get([x.ready.remote() for x in engine.replicas], timeout=30)
        ]
        assert versions == [1, 1]

        # Kill the replica that holds s0 (Ray restarts it with the base weights): s0's next turn is
        # served by the other replica without an error; the restarted one is given version 1 again.
        victim = engine.affinity["s0"]
        ray.kill(engine.replicas[victim], no_restart=False)
        turn("s0", "after the crash")
        assert engine.failovers == 1 and engine.affinity["s0"] != victim
        deadline = time.monotonic() + 120
        while victim in engine.down:
            assert time.monotonic() < deadline, "the killed replica did not come back"
            time.sleep(0.5)
        back = ray.get(engine.replicas[victim].ready.remote(), timeout=30)
        assert back["policy_version"] == 1 and back["requests"] == 0  # a fresh actor, resynced
    finally:
        svc.stop()
    store = Store(cfg.log_dir / "store.sqlite")
    try:
        turns = [t for sid in sessions for t in store.session_turns(sid)]
    finally:
        store.close()
    assert len(turns) == 13 and all(t.response_ids and t.prompt_ids for t in turns)  # recorded once each
    assert max(t.policy_version for t in turns if t.session_id == "s0") == 1


def _slow_reply(body):
    time.sleep(0.6)  # episodes last a few seconds: long enough to kill a node under one
    return "Let me work it out. The answer is 42."


def test_workers_spread_and_a_dead_node_loses_no_episode(ray_cluster, tmp_path, gsm8k_path):
    # Last in this module: it kills the second node of the shared cluster.
    import ray

    from openclaw_rl.launcher.cluster import ClusterEnvRunner

    address, worker_node = ray_cluster
    head_id = ray.get_runtime_context().get_node_id()  # the driver is attached to the head node
    # Actors of the earlier tests in this module are released asynchronously; SPREAD is a soft
    # preference, so wait for both nodes' CPUs to be free before placing one worker on each.
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, f"cluster CPUs not released: {ray.available_resources()}"
        time.sleep(0.5)
    assert check_ray_address(address) is None
    with ChatServer(_slow_reply) as srv:
        cfg = _cfg(tmp_path, address, gsm8k_path, srv.port)
        runner = ClusterEnvRunner(cfg, srv.base_url, cpus_per_worker=0.5)
        placed = runner.placement()
        assert len(set(placed)) == 2, placed  # one worker per node
        remote_worker = next(i for i, n in enumerate(placed) if n != head_id)

        in_flight = threading.Event()
        killed = threading.Event()

        def on_dispatch(w, spec):
            if w == remote_worker and not killed.is_set():
                in_flight.set()

        result = {}
        t = threading.Thread(
            target=lambda: result.setdefault("r", runner.run(max_episodes=4, on_dispatch=on_dispatch))
        )
        t.start()
        assert in_flight.wait(60), "no episode was dealt to the second node"
        time.sleep(1.0)  # its first request is in flight now
        _kill_group(worker_node, signal.SIGKILL)
        killed.set()
        t.join(timeout=150)
        assert not t.is_alive(), "the run did not finish after the node died"
        report = result["r"]
        runner.close()
    print(report.line())
    assert report.retried >= 1
    assert sorted(e["episode"] for e in report.episodes) == [0, 1, 2, 3]  # every episode, exactly once
    assert all(e["error"] is None and e["turns"] >= 1 for e in report.episodes)
    # the retried episode finished on the surviving (head) node
    assert any(e["node"] == head_id for e in report.episodes)
    assert f"retried={report.retried}" in report.line()
    sessions = {r["headers"]["x-session-id"] for r in srv.requests}
    finished = {e["session_id"] for e in report.episodes}
    # a retried episode runs under a fresh session; the dead attempt's session was closed
    assert set(report.abandoned_sessions).isdisjoint(finished)
    assert srv.closed == report.abandoned_sessions
    assert len(sessions) >= 4
