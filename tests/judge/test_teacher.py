"""Teacher log-probs: the hint's placement in the prompt and equality with a direct forward pass."""

from __future__ import annotations

import asyncio

import pytest
import torch

from openclaw_rl.judge.prompts import HINT_HEADING
from openclaw_rl.judge.teacher import LocalTeacher, hinted_messages, hinted_prompt
from openclaw_rl.runtime.chat_format import prompt_ids
from openclaw_rl.types import NextState, Turn

from ..helpers import weather_round

HINT = "Write plain prose without bold text or numbered lists."


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from openclaw_rl.runtime.models import load_model

    return load_model(str(tiny_model_dir))


def make_turn(tok, messages, response="Sure! **Step 1:** add them. The answer is 7."):
    prompt = prompt_ids(tok, messages)
    ids = tok.encode(response, add_special_tokens=False)
    return Turn(
        session_id="s",
        turn_index=0,
        messages=messages,
        prompt_ids=prompt,
        response_ids=ids,
        response_logprobs=[-1.0] * len(ids),
        response_text=response,
    )


MESSAGES = [
    {"role": "system", "content": "You are a helpful tutor."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "**7**"},
    {"role": "user", "content": "and 2 + 5?"},
    {"role": "tool", "content": "irrelevant tool output after the last user message"},
]


def test_hint_goes_to_last_user_message_under_heading():
    out = hinted_messages(MESSAGES, HINT)
    assert out[3]["content"] == f"and 2 + 5?\n\n{HINT_HEADING}\n{HINT}"
    assert out[1]["content"] == "What is 3 + 4?"  # earlier user turns untouched
    assert out[4] == MESSAGES[4]
    assert MESSAGES[3]["content"] == "and 2 + 5?"  # the turn's own messages are not mutated
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert hinted_messages(parts, HINT)[0]["content"].startswith("hello\n\n" + HINT_HEADING)
    no_user = hinted_messages([{"role": "system", "content": "s"}], HINT)
    assert no_user[-1] == {"role": "user", "content": f"{HINT_HEADING}\n{HINT}"}


def test_hint_placed_in_the_system_message_joins_it_or_stands_in_for_the_default():
    out = hinted_messages(MESSAGES, HINT, "system")
    assert out[0] == {"role": "system", "content": f"You are a helpful tutor.\n\n{HINT_HEADING}\n{HINT}"}
    assert out[1:] == MESSAGES[1:]  # every user message as the policy saw it
    bare = hinted_messages(MESSAGES[1:4], HINT, "system")
    assert bare[0] == {"role": "system", "content": f"{HINT_HEADING}\n{HINT}"}
    assert bare[1:] == MESSAGES[1:4]


def test_a_system_placed_hint_replaces_the_templates_default_persona_in_the_teachers_prompt(tiny):
    """SmolLM2's template adds "You are a helpful AI assistant ..." when a prompt has no system
    message; the system placement puts the hint there instead, before the whole conversation."""
    _, tok = tiny
    turn = make_turn(tok, MESSAGES[1:4])
    plain = tok.decode(turn.prompt_ids)
    ids, added = hinted_prompt(tok, turn, HINT, "system")
    text = tok.decode(ids)
    assert text.index(HINT) < text.index("What is 3 + 4?")
    assert added == len(ids) - len(turn.prompt_ids)
    assert "You are a helpful AI assistant" in plain
    assert "You are a helpful AI assistant" not in text


def test_enhanced_prompt_renders_hint_and_counts_added_tokens(tiny):
    _, tok = tiny
    turn = make_turn(tok, MESSAGES[:4])
    ids, added = hinted_prompt(tok, turn, HINT)
    text = tok.decode(ids)
    assert HINT_HEADING in text and HINT in text
    assert text.rstrip().endswith("assistant")  # prompt only, ending in the generation prompt
    assert text.index(HINT) > text.index("and 2 + 5?")
    assert added == len(ids) - len(turn.prompt_ids) > 0


def test_teacher_logprobs_equal_a_direct_forward_pass(tiny):
    model, tok = tiny
    turn = make_turn(tok, MESSAGES[:4])
    teacher = LocalTeacher(model, tok, topk=4, chunk_size=5)  # several chunks
    out = asyncio.run(teacher.score(turn, HINT))

    prompt, added = hinted_prompt(tok, turn, HINT)
    full = torch.tensor([prompt + turn.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=full).logits[0].float(), dim=-1)
    n_p = len(prompt)
    expected = [logp[n_p + j - 1, t].item() for j, t in enumerate(turn.response_ids)]
    assert len(out.logprobs) == len(turn.response_ids)
    assert out.logprobs == pytest.approx(expected, abs=1e-4)
    assert out.context_len == added
    top = logp[n_p - 1 : n_p - 1 + len(turn.response_ids)].topk(4, dim=-1)
    assert out.topk_ids == top.indices.tolist()
    flat = [x for row in out.topk_logprobs for x in row]
    assert flat == pytest.approx(top.values.flatten().tolist(), abs=1e-4)
    # The hint must matter: scoring without it gives different log-probs.
    with torch.no_grad():
        base = torch.log_softmax(
            model(input_ids=torch.tensor([turn.prompt_ids + turn.response_ids])).logits[0], -1
        )
    plain = [base[len(turn.prompt_ids) + j - 1, t].item() for j, t in enumerate(turn.response_ids)]
    assert out.logprobs != pytest.approx(plain, abs=1e-4)


def _api_turn_setup(remote, tiny_model_dir, tok, api: dict | None = None):
    from .conftest import api_config

    cfg = api_config(remote, api=api, training={"opd_enabled": True}, teacher="api")
    cfg.policy_service.model = str(tiny_model_dir)
    remote.eval_reply = "SCORE: -1"
    remote.hint_reply = f"VERDICT: +1\n[HINT_START]{HINT}[HINT_END]"
    turn = make_turn(tok, MESSAGES[:4])
    turn.next_state = NextState(role="user", content="no bold please")
    return cfg, turn


def test_api_teacher_uses_prompt_logprobs_of_the_response_positions(remote, tiny, tiny_model_dir):
    from openclaw_rl.judge import make_judge

    _, tok = tiny
    cfg, turn = _api_turn_setup(remote, tiny_model_dir, tok)
    result = asyncio.run(make_judge(cfg).judge(turn))
    assert result.ok and result.score == -1 and result.hint == HINT
    prompt, added = hinted_prompt(tok, turn, HINT)
    n_p = len(prompt)
    assert result.teacher_logprobs == pytest.approx([-(n_p + j) / 100 for j in range(len(turn.response_ids))])
    assert result.teacher_context_len == added


def test_api_without_prompt_logprobs_says_opd_needs_a_capable_teacher(remote, tiny, tiny_model_dir, caplog):
    from openclaw_rl.judge import make_judge

    _, tok = tiny
    cfg, turn = _api_turn_setup(remote, tiny_model_dir, tok)
    remote.prompt_logprobs = False
    with caplog.at_level("ERROR", logger="openclaw_rl.judge"):
        result = asyncio.run(make_judge(cfg).judge(turn))
    # The RL part is still judged; only the OPD part is missing, and the log says why.
    assert result.ok and result.score == -1 and result.teacher_logprobs is None
    assert "OPD needs a local teacher" in caplog.text


def test_an_api_teachers_outage_is_reported_without_the_key(remote, tiny, tiny_model_dir):
    from openclaw_rl.judge import make_judge

    _, tok = tiny
    remote.key = "plain-teacher-key"  # a key of no known shape
    cfg, turn = _api_turn_setup(remote, tiny_model_dir, tok, api={"api_key": remote.key})
    remote.completions_fail = [422]  # its message quotes the key it was sent
    result = asyncio.run(make_judge(cfg).judge(turn))
    assert not result.ok and "teacher:" in (result.error or "") and "HTTP 422" in result.error, result
    assert remote.key not in result.error and "[key]" in result.error


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
#: Conversations as agent clients send them: a system prompt or a developer message, content parts,
#: tools, an assistant turn that was only a tool call (content null), the tool's result.
CLIENT_CONVERSATIONS = {
    "plain chat": ({"messages": [{"role": "user", "content": "What is 12 * 7?"}]}),
    "developer message and content parts": {
        "messages": [
            {"role": "developer", "content": "Answer in one word."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Capital of "}, {"type": "text", "text": "France?"}],
            },
        ]
    },
    "tools, first turn": {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
    },
    "tools, after a call and its result": {
        "messages": [
            {"role": "system", "content": "You are an agent."},
            *weather_round("c1", "4C, light snow"),
        ],
        "tools": [WEATHER_TOOL],
    },
    "a prefilled reply": {
        "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "It is"},
        ],
        "continue_final_message": True,
    },
    "tools turned off by tool_choice none": {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
    },
}


def test_the_teacher_reads_what_the_policy_read_plus_the_hint(tiny_model_dir, tmp_path, tiny):
    """Without the hint, the teacher's prompt is the served prompt token for token, whatever the
    client sent; so teacher - student measures the hint and nothing else."""
    import httpx

    from openclaw_rl.config import build_config
    from openclaw_rl.policy.server import PolicyService

    _, tok = tiny
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"model": str(tiny_model_dir), "port": 0, "max_tokens_default": 4},
            "env_service": {"enabled": False},
        },
        environ={},
    )
    svc = PolicyService(cfg)
    url = svc.start()
    try:
        for name, body in CLIENT_CONVERSATIONS.items():
            r = httpx.post(f"{url}/v1/chat/completions", json={**body, "session_id": name}, timeout=60)
            assert r.status_code == 200, (name, r.text)
            (turn,) = svc.store.session_turns(name)
            assert prompt_ids(tok, turn.messages, turn.tools, turn.continues_final) == turn.prompt_ids, name
            enhanced, added = hinted_prompt(tok, turn, HINT)
            assert added > 0 and len(enhanced) == len(turn.prompt_ids) + added, name
            text = tok.decode(enhanced)
            assert text.endswith(tok.decode(turn.prompt_ids)[-12:]), name  # the hint comes before the reply
            assert HINT in text and (
                ("get_weather" in text) == ("get_weather" in tok.decode(turn.prompt_ids))
            ), name
    finally:
        svc.stop()
