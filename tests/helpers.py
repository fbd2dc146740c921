"""Test-only helpers: a tiny randomly initialised model with the embedded tokenizer, a minimal
training sample, and a loop started as its own process.

Real token ids and the real tokenizer, but a model small enough to train in a test in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openclaw_rl.runtime.models import load_tokenizer
from openclaw_rl.types import DEFAULT_USER, Sample


def tiny_model(seed: int = 0, hidden: int = 64, layers: int = 2):
    """A randomly initialised Llama with the embedded tokenizer: fast tests, real token ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.eval()
    return model, tok


def save_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write :func:`tiny_model` as a local HF directory (what tests point a config at)."""
    model, tok = tiny_model(seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def one_token_sample(
    sample_id: str, session_id: str, turn_index: int = 0, version: int = 0, user: str = DEFAULT_USER
) -> Sample:
    """A ready sample of one prompt and one response token with reward +1, rolled out by ``version``:
    for tests of how samples are stored, counted and claimed, not of what they train."""
    return Sample(
        sample_id=sample_id,
        session_id=session_id,
        turn_index=turn_index,
        policy_version=version,
        prompt_ids=[1],
        response_ids=[2],
        rollout_logprobs=[-1.0],
        loss_mask=[1],
        reward=1.0,
        user=user,
    )


ROOT = Path(__file__).resolve().parents[1]


def start_module(module: str, config: Path) -> subprocess.Popen[str]:
    """``python -m <module> --config <config>`` from the repository root, as the launcher starts a
    loop: stdout and stderr merged into one unbuffered text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def weather_round(
    call_id: str = "call_1", result: str = "rainy", arguments: str = '{"city": "Oslo"}'
) -> list[dict]:
    """A chat history with one tool round: the user asks, the assistant calls get_weather, the tool
    answers (what an agent sends back after a call)."""
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]
