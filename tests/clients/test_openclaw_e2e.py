"""The real OpenClaw (npm ``openclaw``, installed by ``make openclaw-client``) against the embedded
policy service: a session of three turns answered, recorded as one stitched session, judged.

The client is configured with exactly what ``openclaw-rl openclaw-config`` prints, so this also
checks that the documented fragment works. ``make test`` installs the client; a plain ``pytest``
without it skips this file with the command to run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from openclaw_rl.config import build_config
from openclaw_rl.judge.loop import JudgeLoop
from openclaw_rl.launcher.openclaw_config import openclaw_fragment, render
from openclaw_rl.policy.server import PolicyService
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store

pytestmark = pytest.mark.slow  # a real Node client, the real embedded model and the embedded judge

ROOT = Path(__file__).resolve().parents[2]
CLIENT_BIN = ROOT / ".openclaw-client" / "node_modules" / ".bin"
MESSAGES = [
    "Hi! What is 12 times 7?",
    "Thanks. And what is that number plus 16?",
    "Please answer in one short sentence, without any extra words.",
]


def _json5_to_json(text: str) -> dict:
    """The fragment is JSON5 only for its // comment lines; without them it is JSON."""
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("//")))


@pytest.fixture(scope="module")
def openclaw() -> Path:
    exe = CLIENT_BIN / "openclaw"
    if not exe.exists():
        if os.environ.get("OPENCLAW_RL_REQUIRE_CLIENT"):  # set by `make test`: a missing client is a failure
            pytest.fail(f"{exe} is missing although make test installs it (make openclaw-client)")
        pytest.skip(f"the real OpenClaw client is not installed at {exe}: run `make openclaw-client`")
    return exe


@pytest.mark.timeout(1200)  # three Node start-ups, three answers and the judge on 2 cores
@pytest.mark.parametrize("api", ["openai-completions", "openai-responses", "anthropic-messages"])
def test_a_real_openclaw_session_is_served_recorded_and_judged(openclaw, tmp_path, api):
    """OpenClaw speaking each protocol it can be pointed at (``openclaw-rl openclaw-config --api``)."""
    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"port": 0, "host": "127.0.0.1", "batch_wait_ms": 2.0},
            "env_service": {"enabled": False},
            "prm_service": {"vote_count": 3},
            "training": {"opd_enabled": True},
        },
        environ={},
    )
    service = PolicyService(cfg)
    url = service.start()
    try:
        cfg.policy_service.port = int(url.rsplit(":", 1)[1])
        fragment = render(cfg, api)
        config = _json5_to_json(fragment)
        assert config == json.loads(json.dumps(openclaw_fragment(cfg, api)))  # comments aside, the same data
        # a short answer keeps the test quick on 2 cores; everything else is the printed fragment
        config["models"]["providers"]["openclaw-rl"]["models"][0]["maxTokens"] = 48
        # greedy: a sampled reply may begin a tool call that 48 tokens cut off, which OpenClaw rightly
        # reports as no answer; greedy makes the three turns the same on every run
        config["agents"]["defaults"]["params"] = {"temperature": 0}
        (tmp_path / "openclaw.json").write_text(json.dumps(config, indent=2))
        env = {
            **os.environ,
            "PATH": f"{CLIENT_BIN}:{os.environ['PATH']}",
            "NO_COLOR": "1",
            "OPENCLAW_CONFIG_PATH": str(tmp_path / "openclaw.json"),
            "OPENCLAW_STATE_DIR": str(tmp_path / "state"),
            "HOME": str(tmp_path / "home"),
        }
        for message in MESSAGES:
            proc = subprocess.run(
                [str(openclaw), "agent", "--local", "--session-id", "e2e-1", "--message", message, "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            out = json.loads(proc.stdout)
            text = " ".join(p.get("text") or "" for p in out.get("payloads") or [])
            assert text.strip(), out  # every turn answered
            # OpenClaw's meta repeats the reply; a model that writes "error" is not an error
            meta = json.dumps(out.get("meta", {}))
            for p in out.get("payloads") or []:
                meta = meta.replace(json.dumps(p.get("text") or "")[1:-1], "")
            assert not re.search(r"\b(error|HTTP 4\d\d|HTTP 5\d\d)\b", meta, re.I), out
        with sqlite3.connect(RunDir.of(cfg).store) as db:
            sids = [r[0] for r in db.execute("SELECT DISTINCT session_id FROM turns")]
        turns = [t for sid in sids for t in service.store.session_turns(sid)]
        main = [t for t in turns if t.turn_type == "main"]
        sessions = {t.session_id for t in main}
        # stitched into one session (on failure: each main turn's session, index, time and last messages)
        assert len(sessions) == 1, [
            (t.session_id, t.turn_index, round(t.created_at, 1), [str(m)[:120] for m in t.messages[-3:]])
            for t in main
        ]
        assert [t.turn_index for t in main] == [0, 1, 2]
        for turn, said in zip(
            main[:2], MESSAGES[1:], strict=True
        ):  # each reply is the next state of the turn before
            assert turn.next_state is not None and turn.next_state.role == "user"
            assert turn.next_state.content == said  # OpenClaw's timestamp / runtime lines removed
        assert all(t.response_ids and len(t.response_logprobs) == len(t.response_ids) for t in main)
    finally:
        service.stop()
    # the judge loop, on the run's store, turns the two turns the user answered into judged samples
    store = Store(RunDir.of(cfg).store)
    try:
        loop = JudgeLoop(cfg, store)

        async def judge_all() -> None:  # one round judges num_workers turns; go until none is waiting
            while await loop.run_once():
                pass

        asyncio.run(judge_all())
        judged = [store.turn_status(main[i].session_id, i) for i in range(2)]
        assert judged == ["judged", "judged"], judged
        verdicts = [store.judgement(main[i].session_id, i) for i in range(2)]
        assert all(v is not None and v.ok and len(v.votes) == 3 for v in verdicts), verdicts
        assert store.counters().samples_ready >= 1  # the instruction in the last message is a hint
    finally:
        store.close()
