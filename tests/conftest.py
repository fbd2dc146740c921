"""Shared fixtures: a tiny random model with the real tokenizer, the embedded model, configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from openclaw_rl.config import PACKAGED_DATA

# Two cores: keep each test process from oversubscribing them.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Llama saved as a local HF directory (real SmolLM2 tokenizer)."""
    from tests.helpers import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted once into the safetensors cache."""
    from openclaw_rl.runtime.models import resolve_model_dir

    return resolve_model_dir("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gsm8k_path() -> Path:
    """The GSM8K test split that ships inside the package."""
    return PACKAGED_DATA["gsm8k"]
