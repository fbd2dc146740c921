"""``openclaw-rl users export`` in shared mode: the user has no adapter of their own, and says so."""

from __future__ import annotations

from openclaw_rl.config import build_config
from openclaw_rl.launcher.users import users_export
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import Turn


def test_a_shared_mode_export_names_the_policy_everyone_is_served(tmp_path, capsys):
    cfg = build_config({"global": {"log_dir": str(tmp_path / "logs")}}, environ={})
    run = RunDir.of(cfg)
    store = Store(run.store)
    turn = Turn(
        session_id="s", turn_index=0, messages=[], prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1]
    )
    store.record_turn(turn.model_copy(update={"user": "alice"}))
    store.close()
    (run.policies / "v000007").mkdir(parents=True)
    run.publish_policy(7, run.policies / "v000007")
    assert users_export(cfg, "alice", str(tmp_path / "out")) == 0
    said = capsys.readouterr().out
    assert "1 turns in turns.jsonl" in said and "everyone is served the shared policy v7" in said, said
    assert not (tmp_path / "out" / "adapter").exists()
