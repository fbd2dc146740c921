"""Engine replicas benchmark: the same sessions served in-process, by 1 Ray replica, and by 2.

A Ray head is started for the run (``ray start --head`` on loopback, its own process group, stopped
at the end). The workload is ``--sessions`` concurrent multi-turn sessions over loopback HTTP
(bench/serve.py's), the same for each set-up; set-ups run interleaved ``--repeat`` times:

* ``in-process`` — the default engine inside the policy service, ``--threads`` torch threads;
* ``1 replica``  — decoding in one ``EngineReplica`` actor (1 CPU, so 1 torch thread) through the
  router: the cost of the Ray hop (tokens streamed back through Ray's streaming generators);
* ``2 replicas`` — two actors, sessions spread over them by the router.

Printed: each set-up's best aggregate tokens/s and the ratios ``1 replica / in-process`` (the hop's
cost) and ``2 replicas / 1 replica`` (what a second engine adds; at most 2× on 2 cores, less here
because the policy service, the HTTP clients and the Ray processes share the same two cores).

    .venv/bin/python bench/replicas.py
    .venv/bin/python bench/replicas.py --sessions 8 --turns 2 --max-tokens 32 --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import level  # the shared session workload

from openclaw_rl.config import build_config
from openclaw_rl.policy.replicas import ReplicatedEngine
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.policy.transformers_engine import TransformersEngine
from openclaw_rl.runtime.ports import free_port
from openclaw_rl.runtime.ray_cluster import check_ray_address


def start_head(num_cpus: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--block",
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while check_ray_address(address, timeout_s=1) is not None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the ray head did not start")
        time.sleep(0.5)
    return proc, address


def run_setup(name: str, cfg, n_replicas: int, args) -> dict[str, float]:
    local = cfg.model_copy(deep=True)
    if n_replicas == 0:
        engine = TransformersEngine(local)
    else:
        local.policy_service.num_engines = n_replicas
        engine = ReplicatedEngine(local)
    svc = PolicyService(local, engine=engine)
    url = svc.start()
    try:
        asyncio.run(level(url, 2, 1, 4))  # warm-up (and, for replicas, the first Ray calls)
        r = asyncio.run(level(url, args.sessions, args.turns, args.max_tokens))
    finally:
        svc.stop()
    r["setup"] = name
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the in-process engine")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head, address = start_head(num_cpus=2)
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = build_config(
                {
                    "global": {"log_dir": str(Path(tmp) / "logs"), "ray_address": address},
                    "policy_service": {
                        "model": args.model,
                        "host": "127.0.0.1",
                        "port": 0,
                        "engine_num_cpus": 1,
                        "max_concurrent": 64,
                    },
                    "env_service": {"mode": "cloud", "num_envs": 1},
                },
                environ={},
            )
            for _ in range(args.repeat):
                for name, n in (("in-process", 0), ("1 replica", 1), ("2 replicas", 2)):
                    results.append(run_setup(name, cfg, n, args))
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:  # `ray start --block` can ignore SIGTERM while tearing down
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
    print(
        f"\nmodel={args.model} sessions={args.sessions} turns/session={args.turns} "
        f"max_tokens={args.max_tokens} in-process threads={args.threads}"
    )
    print(f"{'setup':>12} {'requests':>8} {'mean lat s':>10} {'p99 lat s':>10} {'tokens':>7} {'tokens/s':>9}")
    for r in results:
        print(
            f"{r['setup']:>12} {r['requests']:>8} {r['mean_latency_s']:>10.2f} {r['p99_latency_s']:>10.2f} "
            f"{r['tokens']:>7} {r['tokens_per_s']:>9.1f}"
        )
    best = {
        s: max(r["tokens_per_s"] for r in results if r["setup"] == s)
        for s in ("in-process", "1 replica", "2 replicas")
    }
    print(f"\n1 replica / in-process (cost of the Ray hop): {best['1 replica'] / best['in-process']:.2f}x")
    print(f"2 replicas / 1 replica (a second engine):     {best['2 replicas'] / best['1 replica']:.2f}x")


if __name__ == "__main__":
    main()
