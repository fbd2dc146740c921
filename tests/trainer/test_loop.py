"""The training loop process: batches from the store, weight sync, checkpoints, crash resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store
from openclaw_rl.trainer.loop import TrainingLoop
from openclaw_rl.types import Sample

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

ROOT = Path(__file__).resolve().parents[2]


def _samples(n: int, version: int = 0) -> list[Sample]:
    out = []
    for i in range(n):
        resp = [100 + i, 200 + i, 300 + i]
        out.append(
            Sample(
                sample_id=f"s{i}",
                session_id=f"sess{i}",
                turn_index=0,
                policy_version=version,
                prompt_ids=[1, 2, 3, 4],
                response_ids=resp,
                rollout_logprobs=[-11.0] * 3,
                loss_mask=[1, 1, 1],
                reward=1.0 if i % 2 else -1.0,
            )
        )
    return out


def test_loop_trains_publishes_and_checkpoints(make_cfg):
    cfg = make_cfg(max_steps=2, checkpoint_interval=1)
    cfg.policy_service.weight_sync_interval = 1
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(5))
    store.set_meta("trainer_updates", 99)  # left by an earlier run whose checkpoints are gone
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    assert store.get_meta("trainer_updates") == 0  # progress counts this trainer's updates
    assert loop.run() == 0
    c = store.counters()
    assert (c.samples_trained, c.samples_ready, c.samples_claimed) == (4, 1, 0)
    version, path = RunDir.of(cfg).read_policy_pointer()
    assert version == 2 and (path / "adapter_config.json").is_file()
    rows = (cfg.log_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and '"reward_mean"' in rows[0]
    # a train row counts weight changes apart from the published policy_version (eval rows, status)
    assert '"weight_version"' in rows[1] and '"policy_version"' not in rows[1]
    assert any((cfg.log_dir / "tensorboard").iterdir())


def test_a_run_keeps_only_its_newest_policy_versions_on_disk(make_cfg):
    cfg = make_cfg(max_steps=3, keep_policies=2)
    cfg.policy_service.weight_sync_interval = 1
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(6))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    assert loop.run() == 0
    run = RunDir.of(cfg)
    assert [v for v, _ in run.published_versions()] == [3, 2]  # v1 removed when v3 was published
    version, path = run.read_policy_pointer()
    assert version == 3 and (path / "adapter_config.json").is_file()


def test_resuming_from_an_older_checkpoint_trains_its_later_samples_again(make_cfg, tmp_path, capsys):
    """The newest checkpoint was damaged and moved aside, as the error says to: the samples its
    update trained are in no surviving weights, so they go back to the queue (not lost), and the
    next update trains them into the weights that remain."""
    import shutil

    cfg = make_cfg(max_steps=2, checkpoint_interval=1, batch_size=2, mini_batch_size=1)
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(4))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    assert loop.run() == 0
    assert store.counters().samples_trained == 4
    shutil.move(cfg.log_dir / "checkpoints" / "step_00000002", tmp_path / "aside")
    again = TrainingLoop(cfg, policy_url=None, store=store)
    again.start()
    assert "2 sample(s) trained after step=1" in capsys.readouterr().out
    c = store.counters()
    assert (again.started_trainer.step, c.samples_trained, c.samples_ready, c.trainer_step) == (1, 2, 2, 1)
    again.update_once()
    assert store.counters().samples_trained == 4


def test_the_last_update_of_a_run_is_published_whatever_the_sync_interval(make_cfg):
    # max_steps = 3 with weight_sync_interval = 4: without a final publish, three updates would be
    # trained and never served, exported or evaluated.
    cfg = make_cfg(max_steps=3, checkpoint_interval=100)
    cfg.policy_service.weight_sync_interval = 4
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(3 * cfg.training.batch_size))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    assert loop.run() == 0
    version, path = RunDir.of(cfg).read_policy_pointer()
    assert loop.started_trainer.step == 3 and version == 1 and (path / "adapter_config.json").is_file()


def test_a_stop_between_updates_publishes_what_was_trained(make_cfg):
    # Ctrl-C after two updates, before the sync interval (4) came round: the run still serves them
    cfg = make_cfg(checkpoint_interval=100)
    cfg.policy_service.weight_sync_interval = 4
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(2 * cfg.training.batch_size))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    for _ in range(2):
        assert loop.update_once()
    loop.stop()
    assert loop.run() == 0
    assert RunDir.of(cfg).read_policy_pointer()[0] == 1


def test_a_stop_mid_update_returns_its_batch_to_the_queue_and_checkpoints_the_weights_before_it(
    make_cfg, capsys
):
    """Ctrl-C while an update runs: the loop does not wait for it. The update is taken back, its
    samples are ready again (none lost, none counted as trained), and the final checkpoint holds the
    weights of the last finished update."""
    cfg = make_cfg(max_steps=5, batch_size=4, mini_batch_size=2, checkpoint_interval=100)
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(8))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    trainer = loop.started_trainer
    micro_steps = 0
    real_micro_step = trainer._micro_step

    def micro_step(*args, **kw):  # the stop arrives while the second update's first step computes
        nonlocal micro_steps
        micro_steps += 1
        if micro_steps == 3:
            loop.stop()
        return real_micro_step(*args, **kw)

    trainer._micro_step = micro_step
    after_first: list[torch.Tensor] = []
    real_update = trainer.train_update

    def train_update(batch, interrupted=None):
        if trainer.step == 1:
            after_first.extend(p.detach().clone() for p in trainer.params)
        return real_update(batch, interrupted=interrupted)

    trainer.train_update = train_update
    assert loop.run() == 0
    out = capsys.readouterr().out
    assert "update 2 abandoned" in out and "4 sample(s) back in the queue" in out
    c = store.counters()
    assert (c.samples_trained, c.samples_ready, c.samples_claimed, c.trainer_step) == (4, 4, 0, 1)
    assert all(torch.equal(a, p) for a, p in zip(after_first, trainer.params, strict=True))
    assert trainer.latest_checkpoint().name == "step_00000001"


def _write_config(cfg, path: Path, max_steps: int) -> None:
    path.write_text(f"""
[global]
log_dir = "{cfg.log_dir}"
seed = 0
[policy_service]
model = "{cfg.policy_service.model}"
weight_sync_interval = 3
[env_service]
num_envs = 0
[training]
lora = true
lr = 1e-3
batch_size = 2
mini_batch_size = 1
checkpoint_interval = 2
max_steps = {max_steps}
""")
    tomllib.loads(path.read_text())


def test_kill_9_mid_run_resumes_without_loss_or_double_training(make_cfg, tmp_path):
    cfg = make_cfg()
    conf = tmp_path / "loop.toml"
    _write_config(cfg, conf, max_steps=6)
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples(12))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "openclaw_rl.trainer.loop", "--config", str(conf)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    # Kill it after its first checkpoint (step 2), while step 3 has claimed samples.
    while time.monotonic() < deadline and store.counters().trainer_step < 2:
        time.sleep(0.05)
    while time.monotonic() < deadline and store.counters().samples_claimed == 0:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = store.counters()
    assert before.trainer_step >= 2 and before.samples_trained == 2 * before.trainer_step
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "returned to the queue" in out.stdout
    after = store.counters()
    # 6 updates of 2 samples in the surviving lineage: every sample trained exactly once, none lost.
    assert after.trainer_step == 6
    assert (after.samples_trained, after.samples_ready, after.samples_claimed) == (12, 0, 0)


def test_signal_health_reports_what_the_learning_signal_is_worth():
    from openclaw_rl.trainer.loop import signal_health
    from openclaw_rl.types import Sample

    def sample(sid, advantage=None, reward=None, teacher=None):
        return Sample(
            sample_id=sid,
            session_id=sid,
            turn_index=0,
            prompt_ids=[1],
            response_ids=[2, 3],
            rollout_logprobs=[-2.0, -1.0],
            loss_mask=[1, 1],
            reward=reward,
            advantage=advantage,
            teacher_logprobs=teacher,
        )

    batch = [
        sample("a", advantage=1.5, reward=1.0),
        sample("b", advantage=-0.5, reward=-1.0),
        sample("c", teacher=[-1.0, -1.0]),
    ]
    before = {
        "judged": 10,
        "hinted": 2,
        "groups": 1,
        "groups_zero_advantage": 1,
        "group_reward_mean_sum": -1.0,
        "group_reward_spread_sum": 0.0,
        "truth_turns": 4,
        "truth_sum": 1.0,
        "truth_pairs": 4,
        "truth_agree": 2,
        "truth_pos": 1,
        "truth_pos_sum": 0.25,
        "truth_neg": 3,
        "truth_neg_sum": 0.75,
    }
    now = {
        "judged": 14,
        "hinted": 3,
        "groups": 3,
        "groups_zero_advantage": 2,
        "group_reward_mean_sum": -1.5,
        "group_reward_spread_sum": 0.8,
        # since then: 4 turns with a truth, all scored ±1, 3 agreeing; +1 on 0.75 and 0.5, -1 on 0 and 0.25
        "truth_turns": 8,
        "truth_sum": 2.5,
        "truth_pairs": 8,
        "truth_agree": 5,
        "truth_pos": 3,
        "truth_pos_sum": 1.5,
        "truth_neg": 5,
        "truth_neg_sum": 1.0,
    }
    got = signal_health(batch, now, before)
    assert got == pytest.approx(
        {
            "adv_abs_mean": 1.0,
            "teacher_minus_rollout": 0.5,
            "opd_abs_mean": 0.5,
            "hint_rate": 0.25,
            "group_reward_mean": -0.25,
            "group_reward_spread": 0.4,
            "zero_adv_group_frac": 0.5,
            "truth_mean": 0.375,
            "judge_agreement": 0.75,
            "truth_judged_pos": 0.625,
            "truth_judged_neg": 0.125,
            "repeat_frac": 0.0,
        }
    )
    # nothing new judged, no RL or OPD part: only what every batch has, and an RL push of 0
    assert signal_health([sample("d")], now, now) == {"repeat_frac": 0.0, "adv_abs_mean": 0.0}


def test_core_budget_takes_every_core_only_while_the_others_are_idle():
    from openclaw_rl.trainer.loop import CoreBudget

    idle = {"now": True}
    asked: list[bool] = []

    def others_idle() -> bool:
        asked.append(idle["now"])
        return idle["now"]

    budget = CoreBudget(share=1, cores=4, idle=others_idle, recheck_s=0.0)
    assert budget() == 4
    idle["now"] = False
    assert budget() == 1
    assert budget.take_share_of_wide() == 0.5 and budget.take_share_of_wide() == 0.0
    # no core to borrow: the share, without asking anyone
    asked.clear()
    assert CoreBudget(share=2, cores=2, idle=others_idle, recheck_s=0.0)() == 2 and asked == []
    # asked at most once per recheck_s: a burst of micro-batches costs one look
    slow = CoreBudget(share=1, cores=2, idle=others_idle, recheck_s=3600.0)
    asked.clear()
    idle["now"] = True
    assert [slow() for _ in range(5)] == [2] * 5 and len(asked) == 1


def test_trainer_uses_idle_cores_and_gives_them_back_when_a_turn_waits_for_the_judge(
    make_cfg, tiny_model_dir
):
    """Against a real, idle policy service the trainer's passes run on every core; with a turn
    waiting for the judge they keep the launcher's share."""
    import torch

    from openclaw_rl.policy.server import PolicyService
    from openclaw_rl.types import NextState
    from tests.runtime.test_store import turn

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to borrow")
    cfg = make_cfg(max_steps=2, checkpoint_interval=100)
    svc_cfg = cfg.model_copy(deep=True)
    svc_cfg.policy_service.port = 0
    svc_cfg.global_.log_dir = str(cfg.log_dir / "svc")
    svc = PolicyService(svc_cfg)
    url = svc.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the launcher's share on a 2-core machine
    try:
        store = Store(cfg.log_dir / "store.sqlite")
        store.add_samples(_samples(4))
        loop = TrainingLoop(cfg, policy_url=url, store=store)
        loop.start()
        first = loop.update_once()
        assert first["wide_pass_frac"] == 1.0
        store.record_turn(turn("judge-me", 0))
        store.record_turn(turn("judge-me", 1), next_state_for_previous=NextState(role="user", content="no"))
        assert store.turns_waiting() == 1
        time.sleep(1.1)  # past the budget's recheck interval
        second = loop.update_once()
        assert second["wide_pass_frac"] == 0.0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        svc.stop()


def test_serving_generating_counts_a_request_being_computed_but_not_one_held_by_a_pause(
    tiny_model_dir, tmp_path
):
    import threading

    import httpx

    from openclaw_rl.config import build_config
    from openclaw_rl.policy.server import PolicyService
    from openclaw_rl.runtime.policy_admin import serving_generating

    cfg = build_config(
        {"global": {"log_dir": str(tmp_path)}, "policy_service": {"model": str(tiny_model_dir), "port": 0}},
        environ={},
    )
    svc = PolicyService(cfg)
    url = svc.start()
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}
    try:
        assert serving_generating(url) == 0
        seen: list[int | None] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                seen.append(serving_generating(url))
                time.sleep(0.02)

        poller = threading.Thread(target=poll)
        poller.start()
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        done.set()
        poller.join()
        assert r.status_code == 200
        assert max(n or 0 for n in seen) >= 1
        assert serving_generating(url) == 0
        # lock-step: a request held by the pause waits in the queue and computes nothing
        svc.serving.set_paused(True)
        held = threading.Thread(
            target=lambda: httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        )
        held.start()
        deadline = time.monotonic() + 10
        while svc.serving.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert svc.serving.in_flight == 1 and serving_generating(url) == 0
        svc.serving.set_paused(False)
        held.join(timeout=120)
        assert serving_generating("http://127.0.0.1:9") is None  # nothing listens: cannot tell
    finally:
        svc.stop()


def test_old_versions_go_only_once_serving_has_loaded_the_new_one(make_cfg):
    """With a service to swap into, a version is pruned after serving loaded a newer one: a swap that
    fails (the service gone) removes nothing, so the folder serving last read stays."""
    from openclaw_rl.policy.server import PolicyService

    cfg = make_cfg(max_steps=3, keep_policies=2, batch_size=1, mini_batch_size=1)
    cfg.policy_service.weight_sync_interval = 1
    svc_cfg = cfg.model_copy(deep=True)
    svc_cfg.policy_service.port = 0
    svc = PolicyService(svc_cfg)
    url = svc.start()
    run = RunDir.of(cfg)
    try:
        store = Store(cfg.log_dir / "store.sqlite")
        store.add_samples(_samples(5))
        loop = TrainingLoop(cfg, policy_url=url, store=store)
        loop.start()
        for _ in range(3):
            loop.update_once()
            loop._swap_thread.join()
        assert svc.engine.policy_version == 3
        assert [v for v, _ in run.published_versions()] == [3, 2]
    finally:
        svc.stop()
    loop.update_once()  # v4 is published; its swap fails: nothing is pruned
    loop._swap_thread.join()
    assert [v for v, _ in run.published_versions()] == [4, 3, 2]
