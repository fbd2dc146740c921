"""Trainer memory on long sequences: kept activations against recomputed ones.

What it measures: one forward + backward of the LoRA policy (the embedded SmolLM2-135M-Instruct, the
trainer's own ``batch_token_stats``) on one sample of ``L`` prompt tokens + 64 response tokens,
with activation checkpointing off (the trainer's path below ``[training] recompute_above_tokens``)
and on (above it). Each case runs in a fresh process, so its peak RSS is its own; printed side by
side with the ratio, because absolute figures drift on a shared machine.

Usage::

    .venv/bin/python bench/train_memory.py [--lengths 1000,2000,4000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from openclaw_rl.config import EMBEDDED_MODEL, build_config
from openclaw_rl.trainer.ppo import Trainer
from openclaw_rl.runtime.logprobs import batch_token_stats
from openclaw_rl.types import Sample
limit = 0 if sys.argv[2] == "on" else 10**9  # the trainer's own switch decides, as in training
training = {{"lora": True, "recompute_above_tokens": limit}}
cfg = build_config({{"training": training, "global": {{"log_dir": sys.argv[3]}}}}, environ={{}})
trainer = Trainer(cfg, EMBEDDED_MODEL)
model = trainer.model
model.train()
length = int(sys.argv[1])
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
prompt = [1 + (7 * j) % 1000 for j in range(length)]
response = [5 + j % 100 for j in range(64)]
trainer._recompute_if_long([Sample(sample_id="b", session_id="b", turn_index=0, prompt_ids=prompt,
    response_ids=response, rollout_logprobs=[0.0] * 64, loss_mask=[1] * 64, reward=1.0)])
start = time.perf_counter()
stats = batch_token_stats(model, [prompt], [response])
stats.logprobs.sum().backward()
print(json.dumps({{"peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "loaded_gb": loaded, "s": time.perf_counter() - start}}))
"""


def run(length: int, mode: str, log_dir: str) -> dict[str, float]:
    code = ONE.format(root=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code, str(length), mode, log_dir],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1000,2000,4000", help="prompt lengths in tokens")
    args = ap.parse_args()
    import tempfile

    print("prompt  kept: peak GB   s | recomputed: peak GB   s | memory ratio  time ratio")
    with tempfile.TemporaryDirectory() as tmp:
        for length in (int(x) for x in args.lengths.split(",")):
            off, on = run(length, "off", tmp), run(length, "on", tmp)
            print(
                f"{length:6d}  {off['peak_gb']:13.2f} {off['s']:4.0f} | {on['peak_gb']:19.2f} {on['s']:4.0f} | "
                f"{on['peak_gb'] / off['peak_gb']:12.2f}  {on['s'] / off['s']:10.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
