"""Does training stall serving? Latency of a chat client with training idle vs training + swaps.

Both phases run in one invocation against the same policy service process (the embedded model by
default), so the machine's drift affects them alike:

* idle     — the client alone;
* training — the trainer loop runs as its own process on pre-recorded samples, publishing a new
             policy version every ``--sync`` updates (default 2, a swap every few seconds), each
             swapped into the server while the client keeps sending requests.

Prints mean / p99 latency, errors for each phase, the p99 ratio (target ≤ 1.5 on 2 cores) and the
error count (target 0). Each process is limited to one torch thread so serving and training get a
core each, as a deployment on 2 cores would configure them.

    .venv/bin/python bench/nonblocking.py [--requests 40] [--concurrency 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import load_config  # noqa: E402
from openclaw_rl.runtime.models import load_tokenizer  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402
from openclaw_rl.types import Sample  # noqa: E402

PROMPTS = [
    "What is 12 times 7?",
    "Name three colours.",
    "Write one sentence about the sea.",
    "How many days are in a week?",
    "Say hello in French.",
]


def write_config(directory: Path, model: str, port: int, sync: int) -> Path:
    path = directory / "bench.toml"
    path.write_text(f"""
[global]
log_dir = "{directory / "logs"}"
[policy_service]
model = "{model}"
port = {port}
max_concurrent = 8
weight_sync_interval = {sync}
max_tokens_default = 32
[env_service]
num_envs = 0
[prm_service]
backend = "minilm"
[training]
lora = true
lr = 1e-4
batch_size = 2
mini_batch_size = 2
checkpoint_interval = 1000
""")
    return path


def fill_samples(cfg, n: int) -> None:
    """Realistic-length samples so the trainer stays busy for the whole training phase."""
    tok = load_tokenizer(cfg.policy_service.model)
    store = Store(cfg.log_dir / "store.sqlite")
    samples = []
    for i in range(n):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            add_generation_prompt=True,
            tokenize=True,
        )
        if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
            prompt = list(prompt["input_ids"])
        response = tok.encode(" Sure, here is a short answer to that question." * 4)
        samples.append(
            Sample(
                sample_id=f"bench{i}",
                session_id=f"b{i}",
                turn_index=0,
                prompt_ids=list(prompt),
                response_ids=response,
                rollout_logprobs=[-1.0] * len(response),
                loss_mask=[1] * len(response),
                reward=1.0 if i % 2 else -1.0,
            )
        )
    store.add_samples(samples)
    store.close()


def one_request(url: str, i: int) -> tuple[float, str | None]:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": 32,
        "temperature": 0.7,
    }
    start = time.perf_counter()
    try:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json=body,
            timeout=120,
            headers={"X-Session-Id": f"bench-{i}", "X-Session-Done": "true"},
        )
        err = None if r.status_code == 200 else f"HTTP {r.status_code}"
    except httpx.HTTPError as exc:
        err = type(exc).__name__
    return time.perf_counter() - start, err


def client_phase(url: str, requests: int, concurrency: int) -> tuple[list[float], list[str]]:
    with cf.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one_request(url, i), range(requests)))
    return [lat for lat, _ in results], [e for _, e in results if e]


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--sync", type=int, default=2, help="weight_sync_interval (updates per swap)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ocl-nonblocking-"))
    port = free_port()
    conf = write_config(work, args.model, port, args.sync)
    cfg = load_config(conf)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "openclaw_rl.cli", "serve", "--config", str(conf)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trainer = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        client_phase(url, 4, args.concurrency)  # warm-up, not measured
        idle_lat, idle_err = client_phase(url, args.requests, args.concurrency)

        fill_samples(cfg, 400)
        trainer = subprocess.Popen(
            [sys.executable, "-m", "openclaw_rl.trainer.loop", "--config", str(conf), "--policy-url", url],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        store = Store(cfg.log_dir / "store.sqlite")
        while store.counters().trainer_step == 0 and not (cfg.log_dir / "metrics.jsonl").exists():
            if trainer.poll() is not None:
                raise SystemExit(f"trainer exited early:\n{trainer.stdout.read()}")
            time.sleep(0.2)
        v0 = httpx.get(f"{url}/healthz", timeout=5).json()
        train_lat, train_err = client_phase(url, args.requests, args.concurrency)
        v1 = httpx.get(f"{url}/healthz", timeout=5).json()
        steps = len((cfg.log_dir / "metrics.jsonl").read_text().splitlines())
    finally:
        for proc in (trainer, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(work, ignore_errors=True)

    def row(name: str, lat: list[float], err: list[str]) -> str:
        return (
            f"{name:<9} requests={len(lat):>3}  mean={statistics.mean(lat) * 1000:7.0f} ms  "
            f"p99={p99(lat) * 1000:7.0f} ms  errors={len(err)}"
        )

    print(row("idle", idle_lat, idle_err))
    print(row("training", train_lat, train_err))
    print(
        f"policy version during training phase: {v0.get('policy_version')} -> {v1.get('policy_version')} "
        f"({steps} updates so far)"
    )
    ratio = p99(train_lat) / p99(idle_lat)
    errors = len(idle_err) + len(train_err)
    print(f"p99 ratio training/idle = {ratio:.2f} (target <= 1.5)   errors = {errors} (target 0)")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
