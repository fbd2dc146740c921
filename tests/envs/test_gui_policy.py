"""A gui episode driven end to end by the real policy service (tiny random model, real tokenizer).

The random model emits garbage, so the point is the plumbing: its replies go through the
OpenAI-compatible HTTP API into the browser environment, each one comes back as an (error)
observation, the episode runs to truncation without an exception, and the service records every
turn with the environment's observation as the next state of the turn before.
"""

from __future__ import annotations

import os
import uuid

import httpx
import pytest

from openclaw_rl.config import build_config
from openclaw_rl.envs import make

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def policy_url(tiny_model_dir, tmp_path_factory):
    from openclaw_rl.policy.server import PolicyService

    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path_factory.mktemp("gui_policy"))},
            "policy_service": {
                "model": str(tiny_model_dir),
                "host": "127.0.0.1",
                "port": 0,
                "max_tokens_default": 24,
                "batch_wait_ms": 2.0,
            },
            "env_service": {"enabled": False},
        },
        environ={},
    )
    svc = PolicyService(cfg)
    url = svc.start()
    yield svc, url
    svc.stop()


def test_episode_through_policy_service(policy_url):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not installed; run `make sysdeps`")
    svc, url = policy_url
    session = f"gui-{uuid.uuid4().hex[:8]}"
    max_steps = 3
    env = make("gui", max_turns=max_steps, tasks=["todo_add"], action_timeout_s=3.0, offer_tools=True)
    observations = []
    try:
        obs, info = env.reset(seed=0)
        system, first = info["messages"]
        assert system["role"] == "system" and first == {"role": "user", "content": obs}
        tools = info["tools"]
        history = [first]
        with httpx.Client(base_url=url, timeout=120) as client:
            for _ in range(max_steps + 1):  # one more than the limit: the loop must end by itself
                # Keep the prompt inside the tiny model's context: system + the last exchanges.
                messages = [system, *history[-3:]]
                r = client.post(
                    "/v1/chat/completions",
                    headers={"X-Session-Id": session},
                    json={
                        "model": "policy",
                        "messages": messages,
                        "max_tokens": 24,
                        "temperature": 1.0,
                        "tools": tools,
                    },
                )
                assert r.status_code == 200, r.text
                reply = r.json()["choices"][0]["message"]
                # As the environment service does: the whole message when it has tool calls.
                action = reply if reply.get("tool_calls") else (reply.get("content") or "")
                obs, reward, term, trunc, info = env.step(action)
                assert isinstance(obs, str) and obs.startswith("Step ")
                assert info["messages"][0]["content"] == obs
                observations.append(obs)
                history += [
                    {"role": "assistant", "content": reply.get("content") or ""},
                    {"role": "user", "content": obs},
                ]
                if term or trunc:
                    break
    finally:
        env.close()
    assert (len(observations) == max_steps) if trunc else term
    assert info["next_state_role"] == "environment" and info["success"] in (True, False)
    assert reward in (0.0, 1.0)
    # Random tokens are not valid commands: error observations, never an exception.
    assert any("Error:" in o for o in observations)
    turns = svc.store.session_turns(session)
    assert len(turns) == len(observations)
    assert all(t.turn_type == "main" and t.response_ids for t in turns)
    # The observation after turn t is the next state the service recorded for turn t.
    for turn, obs_after in zip(turns[:-1], observations[:-1], strict=True):
        assert turn.next_state is not None and turn.next_state.content == obs_after
