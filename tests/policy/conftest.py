"""Policy-service fixtures: real servers on loopback around the tiny random model (real tokenizer)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openclaw_rl.config import Config, build_config
from openclaw_rl.policy.server import PolicyService

KEY = "not-a-real-client-key"


def make_config(log_dir: Path, model: str | Path, api: dict[str, Any] | None = None, **policy: Any) -> Config:
    raw: dict[str, Any] = {
        "global": {"log_dir": str(log_dir)},
        "policy_service": {
            "model": str(model),
            "port": 0,
            "host": "127.0.0.1",
            "batch_wait_ms": 2.0,
            "max_tokens_default": 16,
            "weight_sync_interval": 10,
            **policy,
        },
        "env_service": {"enabled": False},
    }
    if api is not None:
        raw["api"] = api
    return build_config(raw, environ={})


@pytest.fixture
def start_service(tmp_path) -> Iterator[Callable[..., tuple[PolicyService, str]]]:
    """Start a PolicyService with config overrides; every one started is stopped at teardown."""
    started: list[PolicyService] = []

    def start(
        model: str | Path, name: str = "svc", api: dict[str, Any] | None = None, **policy: Any
    ) -> tuple[PolicyService, str]:
        svc = PolicyService(make_config(tmp_path / name, model, api=api, **policy))
        url = svc.start()
        started.append(svc)
        return svc, url

    yield start
    for svc in reversed(started):
        svc.stop()


@pytest.fixture(scope="module")
def tiny_service(tiny_model_dir, tmp_path_factory) -> Iterator[tuple[PolicyService, str]]:
    """One keyed tiny-model service shared by a test module."""
    svc = PolicyService(make_config(tmp_path_factory.mktemp("svc"), tiny_model_dir, api_key=KEY))
    url = svc.start()
    yield svc, url
    svc.stop()


@pytest.fixture
def client(tiny_service) -> Iterator[httpx.Client]:
    _, url = tiny_service
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def weight_dirs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """What the trainer's export_policy writes: a full model dir (other seed) and a LoRA adapter dir."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tests.helpers import save_tiny_model, tiny_model

    root = tmp_path_factory.mktemp("weights")
    full = save_tiny_model(root / "full", seed=1)
    base, _ = tiny_model(seed=0)
    torch.manual_seed(3)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(root / "adapter")
    return {"full": full, "adapter": root / "adapter"}
