"""Trainer fixtures: configs pointing at the tiny model, samples with real rollout log-probs."""

from __future__ import annotations

from pathlib import Path

import pytest

from openclaw_rl.config import Config, build_config


@pytest.fixture
def make_cfg(tmp_path: Path, tiny_model_dir: Path):
    """Build a Config whose policy is the tiny model and whose log_dir is a fresh temp dir."""

    def make(**training) -> Config:
        base = {
            "lora": True,
            "lr": 1e-2,
            "batch_size": 2,
            "mini_batch_size": 1,
            "kl_coef": 0.01,
            "checkpoint_interval": 1000,
        }
        base.update(training)
        return build_config(
            {
                "global": {"log_dir": str(tmp_path / "logs"), "seed": 0},
                "policy_service": {"model": str(tiny_model_dir)},
                "training": base,
            },
            environ={},
        )

    return make
