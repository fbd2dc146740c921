"""The recorded log-probs are the trainer's log-probs: PPO's ratio starts at exactly 1.

Sampling at temperature 0.7 / top_p 0.9 picks the tokens, but what is recorded for each sampled
token must be the model's own log-prob, the same number the trainer's forward pass computes —
otherwise the ratio's denominator and numerator come from different distributions.
"""

from __future__ import annotations

import httpx
import torch

from openclaw_rl.runtime.logprobs import sequence_logprobs
from openclaw_rl.runtime.models import load_model


def test_recorded_logprobs_match_a_training_forward_pass(start_service, tiny_model_dir):
    svc, url = start_service(tiny_model_dir)
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        headers={"X-Session-Id": "lp"},
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 24,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 3,
        },
    )
    assert r.status_code == 200, r.text
    turn = svc.store.session_turns("lp")[0]
    assert len(turn.response_ids) > 1
    model, _ = load_model(str(tiny_model_dir))
    trainer_lp, _, _ = sequence_logprobs(model, turn.prompt_ids, turn.response_ids)
    torch.testing.assert_close(trainer_lp, torch.tensor(turn.response_logprobs), rtol=1e-4, atol=1e-4)
