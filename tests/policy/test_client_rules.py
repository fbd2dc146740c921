"""OpenClaw's own housekeeping, recognised on traffic recorded from the real client (OpenClaw
2026.9.6, tests/fixtures/openclaw/traffic.jsonl), is served but never trained on; its users' turns are."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from openclaw_rl.policy.client_rules import clean_user_text, housekeeping_reason
from openclaw_rl.policy.protocol import ChatCompletionRequest

TRAFFIC = Path(__file__).resolve().parents[1] / "fixtures" / "openclaw" / "traffic.jsonl"
#: What the recording labelled as OpenClaw's own requests (how each was produced: record.py there).
HOUSEKEEPING = {
    "memory_flush",
    "compaction_summary",
    "compaction_merge",
    "compaction_turn_prefix",
    "agent_overflow_retry",
}


def _recorded() -> list[dict]:
    rows = [json.loads(line) for line in TRAFFIC.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["path"] == "/v1/chat/completions"]


def test_every_recorded_request_is_classified_as_its_label_says():
    rows = _recorded()
    assert {r["label"] for r in rows} >= HOUSEKEEPING | {"agent_turn"}
    for r in rows:
        req = ChatCompletionRequest.model_validate(r["body"])
        reason = housekeeping_reason(req.messages, bool(req.tools), ["openclaw"])
        assert (reason is not None) == (r["label"] in HOUSEKEEPING), (r["seq"], r["label"], reason)
        assert housekeeping_reason(req.messages, bool(req.tools), []) is None  # rules off: nothing matches


def test_decorations_are_removed_from_the_users_words():
    first = (
        "[Wed 2026-12-02 21:59 UTC] Hi! Why do bicycles have gears?\n\nRuntime: agent=main | "
        "session=agent:main:explicit:chat-1 | sessionId=chat-1 | host=vm | shell=bash"
    )
    assert clean_user_text(first, ["openclaw"]) == "Hi! Why do bicycles have gears?"
    assert clean_user_text("[Thu 2026-12-03 08:05 CET] ok, thanks", ["openclaw"]) == "ok, thanks"
    plain = "[note] keep the brackets: this is not a timestamp"
    assert clean_user_text(plain, ["openclaw"]) == plain and clean_user_text(first, []) == first


@pytest.mark.slow  # replays 47 recorded requests of several thousand tokens each
@pytest.mark.parametrize("session", ["chat", "compact", "overflow"])
def test_replayed_traffic_trains_only_the_users_turns(start_service, tiny_model_dir, session):
    """The recorded bodies, replayed in order through the real server (answers capped at 2 tokens)."""
    svc, url = start_service(tiny_model_dir, f"replay-{session}", max_model_len=32768)
    rows = [r for r in _recorded() if r["session"] == session]
    sid = rows[0]["openclaw_session_id"]
    expected = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for r in rows:
            body = {**r["body"], "max_completion_tokens": 2}
            resp = client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
            assert resp.status_code == 200, resp.text
            expected.append("side" if r["label"] in HOUSEKEEPING else "main")
    turns = svc.store.session_turns(sid)
    assert [t.turn_type for t in turns] == expected
    main = [t for t in turns if t.turn_type == "main"]
    for t in main:
        state = t.next_state
        assert state is None or (
            "Runtime: agent=" not in state.content and not state.content.startswith("[Wed ")
        )
    for t in turns:
        if t.turn_type == "side":  # never judged, never a sample, never anyone's next state
            assert svc.store.turn_status(sid, t.turn_index) == "side"
            assert not any(
                m.next_state and "Pre-compaction memory flush" in m.next_state.content for m in main
            )
    users = [t.next_state.content for t in main if t.next_state is not None and t.next_state.role == "user"]
    assert users and all(not u.startswith(("Pre-compaction", "Continue the current task")) for u in users)
