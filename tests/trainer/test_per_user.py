"""Per-user training: each update trains one user's adapter on their samples only, with their own
optimiser state; users take turns; a crash mid-update of one user loses nothing and touches no one else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store
from openclaw_rl.runtime.users import adapter_meta
from openclaw_rl.trainer.loop import STARVE_AFTER, TrainingLoop, pick_user
from openclaw_rl.trainer.ppo import user_checkpoints
from openclaw_rl.types import Sample

ROOT = Path(__file__).resolve().parents[2]


def _samples(user: str, n: int, start: int = 0) -> list[Sample]:
    out = []
    for i in range(start, start + n):
        resp = [100 + i, 200 + i, 300 + i]
        out.append(
            Sample(
                sample_id=f"{user}-s{i}",
                session_id=f"{user}-sess{i}",
                turn_index=0,
                prompt_ids=[1, 2, 3, 4],
                response_ids=resp,
                rollout_logprobs=[-11.0] * 3,
                loss_mask=[1, 1, 1],
                reward=1.0 if i % 2 else -1.0,
                user=user,
            )
        )
    return out


def test_the_user_with_most_waiting_goes_first_and_a_quiet_user_is_not_starved():
    assert pick_user({}, {}, 4) is None
    assert pick_user({"a": 5, "b": 2}, {}, 4) == "a"
    assert pick_user({"a": 2, "b": 1}, {}, 4) is None  # together 3 < a batch: wait
    assert pick_user({"a": 3, "b": 1}, {}, 4) == "a"  # together a batch: the largest share trains
    assert pick_user({"a": 9, "b": 1}, {"b": STARVE_AFTER}, 4) == "b"  # passed over too often
    assert pick_user({"a": 9, "b": 0}, {"b": 10}, 4) == "a"  # nothing waiting: not a candidate


def _per_user_cfg(make_cfg, **training):
    cfg = make_cfg(**training)
    cfg.users.mode = "per_user"
    return cfg


def _adapter(cfg, user: str) -> dict[str, torch.Tensor]:
    ckpt = user_checkpoints(cfg, user)
    latest = (ckpt / "latest").read_text().strip()
    return load_file(str(ckpt / latest / "policy" / "adapter_model.safetensors"))


def test_an_update_trains_one_users_adapter_on_their_samples_only(make_cfg):
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1)
    cfg.policy_service.weight_sync_interval = 1
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("alice", 4) + _samples("bob", 2))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    claimed: list[list[str]] = []
    real_train = loop.started_trainer.train_update

    def spy(batch: list[Sample], interrupted=None) -> dict[str, float]:
        claimed.append(sorted({s.user for s in batch}))
        return real_train(batch, interrupted=interrupted)

    loop.started_trainer.train_update = spy  # type: ignore[method-assign]
    loop.update_once()  # alice: the most waiting (4 against 2)
    bob_untouched = not user_checkpoints(cfg, "bob").exists()
    loop.update_once()  # 2 each: a tie goes to the first name
    loop.update_once()
    assert claimed == [["alice"], ["alice"], ["bob"]]
    assert bob_untouched
    # each user has their own adapter, optimiser state and published version
    run = RunDir.of(cfg)
    for user, updates in (("alice", 2), ("bob", 1)):
        published = run.read_published_policy(user)
        assert published is not None and published.version == updates
        assert (published.path / "adapter_config.json").is_file()
        latest = user_checkpoints(cfg, user) / (user_checkpoints(cfg, user) / "latest").read_text().strip()
        assert (latest / "optimizer.pt").is_file()
    a, b = _adapter(cfg, "alice"), _adapter(cfg, "bob")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    c = store.counters()
    assert (c.samples_trained, c.samples_ready, c.samples_claimed) == (6, 0, 0)
    assert store.user_stats("alice", "x").updates == 2 and store.user_stats("bob", "x").updates == 1


def test_an_abandoned_update_is_not_counted_as_the_users(make_cfg, capsys):
    """A stop before alice's update began: her samples go back and the update is not hers; the next
    one, after the stop is lifted, is her first (its metrics and publish count say so)."""
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1)
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("alice", 2))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    loop._stop.set()
    assert loop.update_once() == {}
    assert "abandoned" in capsys.readouterr().out
    assert store.counters().samples_ready == 2
    loop._stop.clear()
    metrics = loop.update_once()
    assert metrics["user_updates"] == 1.0
    assert store.user_stats("alice", "x").updates == 1


def test_a_users_adapter_version_counts_publishes_so_max_staleness_means_what_it_does_in_shared_mode(
    make_cfg,
):
    # publish every 2 updates, drop samples more than 1 version behind: after 2 updates the adapter
    # is at version 1 (one publish), so samples rolled out on the base (version 0) are still fresh
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1, max_staleness=1)
    cfg.policy_service.weight_sync_interval = 2
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("alice", 6))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    for _ in range(3):
        assert loop.update_once(), "an update found no fresh samples"
    published = RunDir.of(cfg).read_published_policy("alice")
    assert published is not None and published.version == 1
    c = store.counters()
    assert (c.samples_trained, c.samples_dropped) == (6, 0)


def test_the_end_of_a_run_publishes_every_users_unpublished_updates(make_cfg, capsys):
    # sync every 4 updates, run 3: alice trains twice and bob once, and both are served after the run
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1, max_steps=3, checkpoint_interval=1)
    cfg.policy_service.weight_sync_interval = 4
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("alice", 4) + _samples("bob", 2))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    assert loop.run() == 0
    run = RunDir.of(cfg)
    for user in ("alice", "bob"):
        published = run.read_published_policy(user)
        assert published is not None and published.version == 1, user
        assert (published.path / "adapter_model.safetensors").is_file()
    # what alice serves is her newest weights, not bob's (the loop switched adapters to export)
    served = load_file(str(run.read_published_policy("alice").path / "adapter_model.safetensors"))
    assert all(torch.equal(served[k], v) for k, v in _adapter(cfg, "alice").items())
    # each update's checkpoint is written once (checkpoint_interval 1 saves it inside the update)
    saved = [line for line in capsys.readouterr().out.splitlines() if "checkpoint saved" in line]
    assert len(saved) == 3 and len(set(saved)) == 3, saved


def _forget(cfg, store: Store, user: str) -> None:
    """What ``openclaw-rl users delete`` does to the store and the folders."""
    store.delete_user(user)
    for folder in RunDir.of(cfg).user_folders(user):
        shutil.rmtree(folder, ignore_errors=True)


def _names(cfg, user: str) -> list[str]:
    """Every path under log_dir, and every metrics row, that names ``user``."""
    root = RunDir.of(cfg).root
    found = [str(p) for p in root.rglob("*") if user in p.name]
    metrics = root / "metrics.jsonl"
    if metrics.is_file():
        found += [line for line in metrics.read_text().splitlines() if f'"user": "{user}"' in line]
    return found


@pytest.mark.parametrize("when", ["during the update", "after it, before its commit"])
def test_a_user_deleted_during_their_update_leaves_nothing_and_comes_back_afresh(make_cfg, when, capsys):
    """`users delete` while the trainer holds the user's samples: the update is dropped with all it
    wrote, nothing is published for them, the other user is untouched, and the name added again
    starts from the base, not from the deleted adapter."""
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1)
    cfg.policy_service.weight_sync_interval = 1
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("alice", 2) + _samples("bob", 2))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    loop.update_once()  # alice's first update (a tie goes to the first name): her adapter v1
    assert RunDir.of(cfg).read_published_policy("alice") is not None
    store.add_samples(_samples("alice", 2, start=10))
    trainer = loop.started_trainer
    if when == "during the update":
        real = trainer.train_update

        def delete_midway(batch, interrupted=None):
            out = real(batch, interrupted=interrupted)
            _forget(cfg, store, "alice")
            return out

        trainer.train_update = delete_midway  # type: ignore[method-assign]
    else:
        real_save = trainer.save_checkpoint_once

        def delete_after_save():
            real_save()
            _forget(cfg, store, "alice")

        trainer.save_checkpoint_once = delete_after_save  # type: ignore[method-assign]
    assert loop.update_once() == {}
    assert "deleted during their update" in capsys.readouterr().out
    assert _names(cfg, "alice") == []
    assert store.get_meta(adapter_meta("alice")) is None
    vars(trainer).pop("train_update", None)  # the trainer's own methods again
    vars(trainer).pop("save_checkpoint_once", None)
    loop.update_once()  # bob's turn, as if nothing happened
    assert loop.started_trainer.user == "bob"
    # alice added again: her first update starts from the base, version 1 again
    store.add_samples(_samples("alice", 2, start=20))
    loop.update_once()
    published = RunDir.of(cfg).read_published_policy("alice")
    assert published is not None and published.version == 1
    assert loop.started_trainer.policy_version == 1
    assert loop.run_dir.root.joinpath("metrics.jsonl").read_text().count('"user": "alice"') == 1


def test_user_a_training_leaves_user_b_bitwise_unchanged(make_cfg):
    cfg = _per_user_cfg(make_cfg, batch_size=2, mini_batch_size=1)
    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("bob", 2))
    loop = TrainingLoop(cfg, policy_url=None, store=store)
    loop.start()
    loop.update_once()
    bob = _adapter(cfg, "bob")
    bob_opt = torch.load(
        user_checkpoints(cfg, "bob")
        / (user_checkpoints(cfg, "bob") / "latest").read_text().strip()
        / "optimizer.pt",
        weights_only=True,
    )
    store.add_samples(_samples("alice", 6))
    for _ in range(3):
        loop.update_once()
    assert loop.started_trainer.user == "alice"
    again = _adapter(cfg, "bob")
    assert set(again) == set(bob) and all(torch.equal(again[k], bob[k]) for k in bob)
    opt_now = torch.load(
        user_checkpoints(cfg, "bob")
        / (user_checkpoints(cfg, "bob") / "latest").read_text().strip()
        / "optimizer.pt",
        weights_only=True,
    )
    assert opt_now["state"].keys() == bob_opt["state"].keys()
    for k, state in bob_opt["state"].items():
        assert torch.equal(state["exp_avg"], opt_now["state"][k]["exp_avg"])
    # and bob's next update continues from his own adapter and optimiser, not alice's
    store.add_samples(_samples("bob", 2, start=10))
    loop.update_once()
    assert loop.started_trainer.user == "bob"


@pytest.mark.slow
def test_kill_9_mid_update_of_one_user_loses_nothing_and_leaves_the_other_alone(make_cfg, tmp_path):
    cfg = _per_user_cfg(make_cfg)
    conf = tmp_path / "loop.toml"

    def write_conf(max_steps: int) -> None:
        conf.write_text(f"""
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
max_steps = {max_steps}
[users]
mode = "per_user"
""")

    store = Store(cfg.log_dir / "store.sqlite")
    store.add_samples(_samples("bob", 2))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "openclaw_rl.trainer.loop", "--config", str(conf)]
    write_conf(1)
    first = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    bob = _adapter(cfg, "bob")
    store.add_samples(_samples("alice", 14))
    write_conf(8)
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and store.counters().samples_trained < 6:
        time.sleep(0.05)
    while time.monotonic() < deadline and store.counters().samples_claimed == 0:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = store.counters()
    assert before.samples_claimed == 2  # the update that was cut short
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "returned to the queue" in out.stdout
    after = store.counters()
    assert (after.samples_trained, after.samples_ready, after.samples_claimed) == (16, 0, 0)
    again = _adapter(cfg, "bob")
    assert all(torch.equal(again[k], bob[k]) for k in bob)
    assert store.user_stats("alice", "x").updates == 7
