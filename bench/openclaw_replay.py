"""Time to first token on real OpenClaw traffic: the policy service with its prefix cache on vs off.

Replays three consecutive agent turns of a recorded OpenClaw 2026.9.6 session
(``tests/fixtures/openclaw/traffic.jsonl``, session "compact", steps 9–11: prompts of about 5,200 to
5,800 tokens, the slim agent's system prompt and tools plus a growing history) through a real server
on loopback over HTTP with streaming, and measures the time from sending each request to its first
streamed token. The two services (cache off, cache on) take turns request by request, so the
machine's drift hits both alike. The recorded assistant replies are the recorder's, not the model's,
so each turn reuses its prompt's cached prefix up to the previous user message and prefills the
rest: a lower bound on what a live session gets (there the previous answer is cached too).

    .venv/bin/python bench/openclaw_replay.py        # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import build_config  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402

TRAFFIC = ROOT / "tests" / "fixtures" / "openclaw" / "traffic.jsonl"
STEPS = (9, 10, 11)


def ttft(url: str, body: dict) -> tuple[float, int]:
    """Seconds to the first content chunk, and the prompt tokens the server reported."""
    t0 = time.perf_counter()
    first = None
    prompt_tokens = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    return (first if first is not None else time.perf_counter() - t0), prompt_tokens


def main() -> int:
    argparse.ArgumentParser(
        description="Time to first token on recorded OpenClaw traffic, prefix cache on vs off (about 5 "
        "minutes on 2 cores; takes no options)."
    ).parse_args()
    rows = [json.loads(line) for line in TRAFFIC.read_text().splitlines() if line.strip()]
    turns = [
        r["body"]
        for r in rows
        if r["session"] == "compact" and r["label"] == "agent_turn" and r["step"] in STEPS
    ]
    services = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, mb in (("off", 0), ("on", 512)):
            cfg = build_config(
                {
                    "global": {"log_dir": f"{tmp}/{name}"},
                    "policy_service": {"port": 0, "prefix_cache_mb": mb, "max_model_len": 8192},
                    "env_service": {"enabled": False},
                },
                environ={},
            )
            services[name] = PolicyService(cfg)
        urls = {name: svc.start() for name, svc in services.items()}
        try:
            print(f"{'turn':>4} {'prompt':>7} {'ttft off s':>10} {'ttft on s':>10} {'speed-up':>8}")
            later_off = later_on = 0.0
            for i, body in enumerate(turns, 1):
                body = {
                    **body,
                    "max_completion_tokens": 4,
                    "temperature": 0.0,
                    "stream_options": {"include_usage": True},
                }
                off, n = ttft(urls["off"], body)
                on, _ = ttft(urls["on"], body)
                if i > 1:
                    later_off, later_on = later_off + off, later_on + on
                print(f"{i:>4} {n:>7} {off:>10.2f} {on:>10.2f} {off / on:>7.1f}x", flush=True)
            print(f"turns 2-3 time to first token, off / on: {later_off / later_on:.1f}x")
            stats = httpx.get(f"{urls['on']}/healthz", timeout=10).json()
            print(
                f"cache: {stats['prefix_cache_bytes'] / 2**20:.1f} MB in {stats['prefix_cache_entries']} blocks, "
                f"hit tokens {stats['prefix_cache_hit_tokens']}, prefilled {stats['prefix_cache_prefill_tokens']}"
            )
        finally:
            for svc in services.values():
                svc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
