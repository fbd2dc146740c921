"""Benchmark: one PPO update on the embedded SmolLM2-135M, chunked log-probs vs plain log-softmax.

For each training mode (LoRA, full) and each log-prob implementation (``chunked`` =
openclaw_rl.runtime.logprobs.batch_token_stats, ``plain`` = a full ``[B, L, vocab]`` float32
log_softmax), one fresh subprocess loads the model, builds a :class:`Trainer` and times exactly one
``train_update`` on ``--batch`` synthetic samples (random prompt/response ids, reward ±1, half of them
with teacher log-probs, so the combined loss with the k3 KL term runs). Fresh processes keep one
variant's allocations from inflating another's peak.

Memory: on CPU the peak of torch's CPU allocator during the update, read from the profiler's memory
events (``profile_memory=True``: bytes allocated since the update began, net of frees — activations,
logits, gradients). RSS was tried first and rejected: glibc keeps freed blocks and memory-mapped
weights page in on first touch, which made it track the allocator's history rather than the update.
The profiler's bookkeeping is inside the timed region for both implementations alike. On CUDA,
``torch.cuda.max_memory_allocated`` minus the allocation before the update. By default a small
warm-up update runs first (weights are memory-mapped and paged in on first use; AdamW creates its
state on its first step), so the figures are those of a steady-state update; ``--no-warmup``
measures the very first one instead.

    python bench/train.py                                   # batch 8, 256-token responses (slow on CPU)
    python bench/train.py --batch 2 --response-len 64 --prompt-len 32   # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _peak_cpu_allocated(trace_path: str) -> int:
    """Peak of torch's CPU allocator "Total Allocated" (bytes allocated since profiling began, net of
    frees) over the memory events of a profiler trace."""
    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    totals = [
        e["args"]["Total Allocated"]
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
    ]
    return max(totals, default=0)


def child(args: argparse.Namespace) -> dict:
    """Run one variant in this process and return its measurements."""
    import random

    import torch

    from openclaw_rl.config import build_config
    from openclaw_rl.runtime.logprobs import plain_token_stats
    from openclaw_rl.trainer.ppo import Trainer
    from openclaw_rl.types import Sample

    torch.set_num_threads(args.threads)
    log_dir = tempfile.mkdtemp(prefix="bench_train_")
    atexit.register(shutil.rmtree, log_dir, ignore_errors=True)  # checkpoints and the profiler trace
    cfg = build_config(
        {
            "global": {"log_dir": log_dir},
            "training": {
                "lora": args.mode == "lora",
                "batch_size": args.batch,
                "mini_batch_size": args.batch,
                "micro_batch_tokens": max(4096, args.batch * (args.prompt_len + args.response_len)),
                "lr": 1e-5,
                "kl_coef": 0.01,
                "logprob_chunk_size": args.chunk_size,
                "device": args.device,
                "checkpoint_interval": 1000,
            },
        },
        environ={},
    )
    trainer = Trainer(cfg, args.model)
    if args.impl == "plain":
        trainer.token_stats = plain_token_stats
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    rng = random.Random(0)
    samples = []
    for i in range(args.batch):
        resp = [rng.randrange(vocab) for _ in range(args.response_len)]
        samples.append(
            Sample(
                sample_id=str(i),
                session_id="bench",
                turn_index=i,
                prompt_ids=[rng.randrange(vocab) for _ in range(args.prompt_len)],
                response_ids=resp,
                rollout_logprobs=[-11.0] * len(resp),
                loss_mask=[1] * len(resp),
                reward=1.0 if i % 2 else -1.0,
                teacher_logprobs=[-10.5] * len(resp) if i % 2 == 0 else None,
            )
        )
    if args.warmup:
        # Touch every weight page (safetensors are memory-mapped), start thread pools and create the
        # optimizer state, so that the measured update is a steady-state one.
        trainer.train_update(
            [
                samples[0].model_copy(
                    update={
                        "prompt_ids": samples[0].prompt_ids[:8],
                        "response_ids": samples[0].response_ids[:8],
                        "rollout_logprobs": [-11.0] * 8,
                        "loss_mask": [1] * 8,
                        "teacher_logprobs": None,
                    }
                )
            ]
        )
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        metrics = trainer.train_update(samples)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
    else:
        from torch.profiler import ProfilerActivity, profile

        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            metrics = trainer.train_update(samples)
        elapsed = time.perf_counter() - t0
        trace = os.path.join(log_dir, "trace.json")
        prof.export_chrome_trace(trace)
        peak = _peak_cpu_allocated(trace)
    tokens = sum(s.num_tokens for s in samples)
    return {
        "mode": args.mode,
        "impl": args.impl,
        "seconds": elapsed,
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
        "peak_mem_mb": peak / 2**20,
        "loss": metrics["loss"],
        "kl": metrics["kl"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--impls", default="chunked,plain")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-size", type=int, default=256, help="[training] logprob_chunk_size (tokens)")
    ap.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure the very first update (includes page-in of weights, optimizer state)",
    )
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:  # child process
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    print(
        f"one PPO update, batch={args.batch}, prompt={args.prompt_len}, response={args.response_len} "
        f"tokens, chunk={args.chunk_size}, model={args.model}, device={args.device}, "
        f"threads={args.threads}; memory = "
        f"{'CUDA max_memory_allocated delta' if args.device.startswith('cuda') else 'peak torch CPU allocation (profiler)'}"
        f"{', after a warm-up update' if args.warmup else ', first update (no warm-up)'}"
    )
    results: dict[tuple[str, str], dict] = {}
    for mode in args.modes.split(","):
        for impl in args.impls.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--impl",
                impl,
                "--model",
                args.model,
                "--batch",
                str(args.batch),
                "--response-len",
                str(args.response_len),
                "--prompt-len",
                str(args.prompt_len),
                "--device",
                args.device,
                "--threads",
                str(args.threads),
                "--chunk-size",
                str(args.chunk_size),
            ] + ([] if args.warmup else ["--no-warmup"])
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"{mode}/{impl}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
                continue
            r = json.loads(line.removeprefix("RESULT "))
            results[(mode, impl)] = r
            print(
                f"{mode:>4} {impl:>7}: {r['seconds']:7.2f} s  {r['tokens_per_s']:8.1f} tok/s  "
                f"peak mem +{r['peak_mem_mb']:8.1f} MB  loss={r['loss']:+.4f} kl={r['kl']:.2e}",
                flush=True,
            )
    for mode in args.modes.split(","):
        c, p = results.get((mode, "chunked")), results.get((mode, "plain"))
        if c and p:
            print(
                f"{mode}: chunked vs plain  speed x{c['tokens_per_s'] / p['tokens_per_s']:.2f}  "
                f"peak memory x{c['peak_mem_mb'] / max(p['peak_mem_mb'], 1e-9):.2f} "
                f"({c['peak_mem_mb']:.0f} MB vs {p['peak_mem_mb']:.0f} MB)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
