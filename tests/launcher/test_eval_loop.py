"""The live evaluator: base once, each new policy far enough after the last, never twice, never into
the training store; the launcher starts it and goes on without it when it keeps crashing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_rl.config import build_config
from openclaw_rl.launcher.eval_loop import EvalLoop, due_policy, latest_eval, live_eval_problem, policy_step
from openclaw_rl.launcher.evaluate import EvalSizes
from openclaw_rl.launcher.status import progress_line
from openclaw_rl.runtime.metrics import MetricsWriter, read_metrics
from openclaw_rl.runtime.rundir import POLICY_POINTER, PublishedPolicy, RunDir
from openclaw_rl.runtime.store import Store
from tests.helpers import save_tiny_model, start_module

ROOT = Path(__file__).resolve().parents[2]
SIZES = EvalSizes(chat=2, terminal=0, tool_call=0, max_tokens=8)


def _cfg(tmp_path: Path, model: str | Path = "smollm2-135m-instruct", gsm8k: Path | None = None, **training):
    env = {"interaction_types": ["chat"], "personas": ["student", "teacher"], "eval_size": 20}
    if gsm8k is not None:
        env["data_path"] = str(gsm8k)
    return build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"model": str(model), "batch_wait_ms": 2.0, "weight_sync_interval": 1},
            "env_service": env,
            "training": {"eval_interval": 2, "eval_size": 2, **training},
        },
        environ={},
    )


def _publish(cfg, version: int, step: int | None, seed: int | None = None) -> Path:
    """What the trainer leaves behind: policy/v00000N and the pointer at it."""
    run = RunDir.of(cfg)
    path = run.policies / f"v{version:06d}"
    if seed is not None:
        save_tiny_model(path, seed=seed)
    else:
        path.mkdir(parents=True, exist_ok=True)
    run.publish_policy(version, path, step=step)
    return path


# ------------------------------------------------------------------ fast: what is due, what is shown


def test_due_policy_base_first_then_spaced_by_eval_interval(tmp_path):
    cfg = _cfg(tmp_path, eval_interval=4)
    assert due_policy(cfg) == PublishedPolicy(0, Path(cfg.policy_service.model), 0)  # base before anything
    writer = MetricsWriter(cfg.log_dir, tensorboard=False)
    writer.write(0, {"policy_version": 0, "score": 0.25, "base_score": 0.25}, kind="eval")
    writer.write(1, {"loss": 1.0})  # training rows do not count
    assert due_policy(cfg) is None  # nothing published yet
    _publish(cfg, 1, step=2)
    assert due_policy(cfg) is None  # 2 < 0 + 4: too close to the base
    path = _publish(cfg, 2, step=4)
    assert due_policy(cfg) == PublishedPolicy(2, path, 4)
    writer.write(4, {"policy_version": 2, "score": 0.5, "base_score": 0.25}, kind="eval")
    assert due_policy(cfg) is None  # evaluated: never again
    _publish(cfg, 3, step=6)
    assert due_policy(cfg) is None
    _publish(cfg, 4, step=8)
    assert due_policy(cfg).version == 4
    writer.write(8, {"policy_version": 4, "error": "loading the weights failed"}, kind="eval")
    assert due_policy(cfg) is None  # a failed version is recorded and not retried
    # spacing counts from the last *scored* evaluation (step 4), not the failed one
    _publish(cfg, 5, step=9)
    assert due_policy(cfg).version == 5


def test_old_pointer_without_step_still_reads(tmp_path):
    cfg = _cfg(tmp_path)
    run = RunDir.of(cfg)
    run.policies.mkdir(parents=True)
    path = run.policies / "v000003"
    path.mkdir()
    (run.policies / POLICY_POINTER).write_text(json.dumps({"version": 3, "path": str(path)}))  # older format
    assert run.read_policy_pointer() == (3, path)
    published = run.read_published_policy()
    assert published.step is None
    # no step anywhere: the step the trainer publishes version 3 at (weight_sync_interval = 1)
    assert policy_step(cfg, published) == 3
    (path / "openclaw_policy.json").write_text(
        json.dumps({"version": 3, "step": 7})
    )  # what export_policy writes
    assert policy_step(cfg, published) == 7
    run.publish_policy(4, path, step=12)
    assert run.read_policy_pointer() == (4, path) and run.read_published_policy().step == 12


def test_progress_line_shows_the_newest_eval_with_its_base(tmp_path):
    cfg = _cfg(tmp_path)
    store = Store(RunDir.of(cfg).store)
    try:
        assert "eval=" not in progress_line(store.counters(), latest_eval(cfg.log_dir))
        writer = MetricsWriter(cfg.log_dir, tensorboard=False)
        writer.write(0, {"policy_version": 0, "score": 0.34, "base_score": 0.34}, kind="eval")
        assert progress_line(store.counters(), latest_eval(cfg.log_dir)).endswith(" eval=0.34 (base 0.34)")
        writer.write(8, {"policy_version": 2, "score": 0.47, "base_score": 0.34}, kind="eval")
        writer.write(9, {"policy_version": 3, "error": "broken"}, kind="eval")  # no score: not shown
        assert progress_line(store.counters(), latest_eval(cfg.log_dir)).endswith(" eval=0.47 (base 0.34)")
    finally:
        store.close()


def test_two_writers_append_whole_rows(tmp_path):
    """The trainer and the evaluator append to one metrics.jsonl: rows never interleave."""
    code = (
        "import sys; from pathlib import Path; from openclaw_rl.runtime.metrics import MetricsWriter\n"
        "w = MetricsWriter(Path(sys.argv[1]), tensorboard=False)\n"
        "for i in range(300): w.write(i, {'who': sys.argv[2], 'pad': 'x' * 3000}, kind=sys.argv[2])\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), kind], cwd=ROOT)
        for kind in ("train", "eval")
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 600
    rows = [json.loads(line) for line in lines]  # every line is one whole row
    assert sum(r["kind"] == "eval" for r in rows) == 300 and all(r["who"] == r["kind"] for r in rows)
    assert len(read_metrics(tmp_path, kind="eval")) == 300


def test_the_launcher_starts_the_evaluator_only_when_it_can_run(tmp_path):
    from openclaw_rl.launcher.wiring import STOP_ORDER, build_children

    children = build_children(_cfg(tmp_path), "run.toml")
    assert children["evaluator"].argv[1:] == ["-m", "openclaw_rl.launcher.eval_loop", "--config", "run.toml"]
    assert STOP_ORDER[-1] == "policy_service" and "evaluator" in STOP_ORDER  # stopped with the loops
    off = _cfg(tmp_path, eval_interval=0)
    assert "evaluator" not in build_children(off, "run.toml") and "eval_interval = 0" in live_eval_problem(
        off
    )
    no_chat = build_config(
        {"env_service": {"interaction_types": ["terminal"]}, "training": {"eval_interval": 4}}, environ={}
    )
    assert "evaluator" not in build_children(no_chat, "run.toml") and "chat" in live_eval_problem(no_chat)


def test_a_crashing_evaluator_is_given_up_on_and_the_run_goes_on(capsys):
    from openclaw_rl.launcher.wiring import MAX_RESTARTS, Child, supervise

    crash = [sys.executable, "-c", "raise SystemExit(3)"]
    children = {"evaluator": Child("evaluator", crash)}
    children["evaluator"].start()
    for _ in range(MAX_RESTARTS + 2):
        children["evaluator"].proc.wait(timeout=60)
        assert supervise(children) is None  # never fatal
    assert children["evaluator"].finished and children["evaluator"].restarts == MAX_RESTARTS
    out = capsys.readouterr().out
    assert out.count("the run goes on without live evaluation") == 1
    # a required loop that keeps crashing still stops the run
    judge = Child("prm_service", crash, restarts=MAX_RESTARTS)
    judge.start()
    judge.proc.wait(timeout=60)
    assert supervise({"prm_service": judge}) == 1


# ------------------------------------------------------------------ slow: the evaluator on the tiny model


@pytest.mark.slow
def test_evaluator_base_once_new_versions_spaced_never_twice_nothing_trained(
    tmp_path, tiny_model_dir, gsm8k_path, capsys
):
    cfg = _cfg(tmp_path, tiny_model_dir, gsm8k_path)
    training_store = Store(RunDir.of(cfg).store)  # the run's store, as the launcher opens it
    loop = EvalLoop(cfg, sizes=SIZES, tensorboard=True)
    loop.start()
    try:
        base = loop.run_once()
        assert (base.version, base.step, base.base_score) == (0, 0, base.score)
        assert loop.run_once() is None  # base only once; nothing published yet
        _publish(cfg, 1, step=1, seed=1)
        assert loop.run_once() is None  # step 1 < 0 + eval_interval 2
        _publish(cfg, 2, step=2, seed=2)
        v2 = loop.run_once()
        assert (v2.version, v2.step, v2.base_score) == (2, 2, base.score)
        assert loop.service.policy_version == 2  # the exported weights were loaded into the private copy
        assert loop.run_once() is None
    finally:
        loop.close()
    out = capsys.readouterr().out
    assert f"[eval] version=0 step=0 score={base.score:.2f} (base)" in out
    assert f"[eval] version=2 step=2 score={v2.score:.2f} (base {base.score:.2f})" in out

    # a restarted evaluator reads what was done from metrics.jsonl
    again = EvalLoop(cfg, sizes=SIZES, tensorboard=False)
    again.start()
    try:
        assert again.run_once() is None  # neither the base nor version 2 again
        _publish(cfg, 3, step=4, seed=3)
        v3 = again.run_once()
        assert (v3.version, v3.step, v3.base_score) == (3, 4, base.score)
    finally:
        again.close()

    rows = read_metrics(cfg.log_dir, kind="eval")
    assert [r["policy_version"] for r in rows] == [0, 2, 3] and [r["step"] for r in rows] == [0, 2, 4]
    for r in rows:
        assert {"time", "score", "base_score", "score_student", "score_teacher", "n_per_persona"} <= set(r)
        assert 0.0 <= r["looping_student"] <= 1.0 and 0.0 <= r["looping_teacher"] <= 1.0
        assert r["score"] == pytest.approx((r["score_student"] + r["score_teacher"]) / 2)
        assert r["base_score"] == base.score
    assert any((cfg.log_dir / "tensorboard").iterdir())
    # evaluation traffic went to a private store, never the training store
    c = training_store.counters()
    assert (c.turns, c.samples_ready, c.policy_version) == (0, 0, 0)
    line = progress_line(c, latest_eval(cfg.log_dir))
    assert f"eval={v3.score:.2f} (base {base.score:.2f})" in line
    training_store.close()

    from openclaw_rl.runtime.metrics import plot_metrics

    assert plot_metrics(cfg.log_dir).is_file()  # eval rows alone are enough for the plot


@pytest.mark.slow
def test_evaluator_process_runs_niced_and_stops_on_sigterm(tmp_path, tiny_model_dir, gsm8k_path):
    conf = tmp_path / "run.toml"
    log_dir = tmp_path / "logs"
    conf.write_text(
        f'[global]\nlog_dir = "{log_dir}"\n[policy_service]\nmodel = "{tiny_model_dir}"\n'
        f"batch_wait_ms = 2.0\nmax_tokens_default = 8\n"
        f'[env_service]\npersonas = ["student"]\ndata_path = "{gsm8k_path}"\neval_size = 20\n'
        f"[training]\neval_interval = 1\neval_size = 2\n"
    )
    proc = start_module("openclaw_rl.launcher.eval_loop", conf)
    try:
        deadline = time.monotonic() + 240
        while not read_metrics(log_dir, kind="eval"):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "no evaluation written"
            time.sleep(0.2)
        nice = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        # yields the CPU to the loops it measures (19 is as nice as a process gets)
        assert nice == min(os.nice(0) + 10, 19)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "[eval] version=0 step=0 score=" in out and "(base)" in out
    assert "listening on" not in out  # the private service stays out of the run's output
    assert [r["policy_version"] for r in read_metrics(log_dir, kind="eval")] == [0]


def test_sessions_to_learn_is_the_first_lasting_lead_of_the_live_eval(tmp_path):
    from openclaw_rl.launcher.eval_loop import learned_line, sessions_to_learn

    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step, sessions in ((4, 10), (8, 20), (12, 30), (16, 40)):
        writer.write(step, {"loss": 0.1, "sessions": sessions})
    assert sessions_to_learn(tmp_path) is None and learned_line(tmp_path) is None  # no evaluation yet
    writer.write(0, {"policy_version": 0, "score": 0.30}, kind="eval")
    writer.write(4, {"policy_version": 1, "score": 0.50}, kind="eval")  # a lead that does not last
    writer.write(8, {"policy_version": 2, "score": 0.40}, kind="eval")
    assert sessions_to_learn(tmp_path) is None
    assert "not yet (best live eval 0.50, base 0.30" in (learned_line(tmp_path) or "")
    writer.write(12, {"policy_version": 3, "score": 0.46}, kind="eval")
    writer.write(16, {"policy_version": 4, "score": 0.52}, kind="eval")
    assert sessions_to_learn(tmp_path) == 30  # from step 12 on it stays at base + 0.15 or above
    assert (learned_line(tmp_path) or "").startswith("[learned] sessions to learn: 30")


def _user_adapter(tmp_path: Path, cfg, user: str, version: int, seed: int) -> Path:
    """A user's published LoRA adapter (peft format, as the per_user trainer exports it)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tests.helpers import tiny_model

    base, _ = tiny_model(seed=0)
    torch.manual_seed(seed)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    run = RunDir.of(cfg)
    path = run.policy_dir(user) / f"v{version:06d}"
    model.save_pretrained(path)
    run.publish_policy(version, path, step=version, user=user)
    return path


def test_per_user_each_simulated_users_adapter_is_scored_on_its_own_persona(
    tmp_path, tiny_model_dir, gsm8k_path, capsys
):
    from openclaw_rl.launcher.eval_loop import due_user_policies, pending_evaluation

    cfg = build_config(
        {
            "global": {"log_dir": str(tmp_path / "logs")},
            "policy_service": {"model": str(tiny_model_dir), "batch_wait_ms": 2.0, "weight_sync_interval": 1},
            "env_service": {
                "interaction_types": ["chat"],
                "personas": ["student", "teacher"],
                "data_path": str(gsm8k_path),
            },
            "training": {"eval_interval": 2, "eval_size": 2, "lora": True},
            "users": {"mode": "per_user"},
        },
        environ={},
    )
    loop = EvalLoop(cfg, sizes=SIZES, tensorboard=False)
    loop.start()
    try:
        base = loop.run_once()
        assert base is not None and base.user is None and set(base.scores) == {"student", "teacher"}
        _user_adapter(tmp_path, cfg, "sim-student", 1, seed=1)
        _user_adapter(tmp_path, cfg, "alice", 5, seed=2)  # a real user: no held-out persona
        assert due_user_policies(cfg) == [] and loop.run_once() is None  # 1 update < eval_interval 2
        _user_adapter(tmp_path, cfg, "sim-student", 2, seed=3)
        assert pending_evaluation(cfg) == "user=sim-student version=2"
        result = loop.run_once()
        assert result is not None and (result.user, result.version) == ("sim-student", 2)
        assert set(result.scores) == {"student"} and result.base_score == base.scores["student"]
        assert loop.service.policy_version == 2  # the student's adapter was merged into the private copy
        assert loop.run_once() is None and pending_evaluation(cfg) is None
    finally:
        loop.close()
    out = capsys.readouterr().out
    assert f"[eval] user=sim-student version=2 step=2 score={result.score:.2f}" in out
    rows = read_metrics(cfg.log_dir, kind="eval")
    user_row = next(r for r in rows if r.get("user") == "sim-student")
    assert user_row["adapter_version"] == 2 and user_row["score_student"] == result.score
    assert 0.0 <= user_row["looping_student"] <= 1.0
    assert "score" not in user_row and "policy_version" not in user_row  # the run-wide figures ignore it
    assert latest_eval(cfg.log_dir)["policy_version"] == 0 and due_policy(cfg) is None
    # a restarted evaluator does not score that version again
    again = EvalLoop(cfg, sizes=SIZES, tensorboard=False)
    again.start()
    try:
        assert again.run_once() is None
    finally:
        again.close()
