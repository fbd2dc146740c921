"""The training loop: consume judged samples from the store as they become ready.

Runs as its own process (``python -m openclaw_rl.trainer.loop --config FILE --policy-url URL``)
so that a trainer crash never stops serving. The whole loop::

    trainer.resume(); store.recover_claims(trainer.step)        # no sample lost, none trained twice
    while not done:
        if store.ready_count() >= batch_size:
            batch = store.claim_samples(batch_size, step + 1, version, max_staleness)
            metrics = trainer.train_update(batch)                  # one PPO update
            every weight_sync_interval updates: export policy, repoint latest, tell serving
            every checkpoint_interval updates: checkpoint on disk, then store.commit_checkpoint
    on SIGTERM / max_steps: final checkpoint, commit, exit 0

With ``async_mode = false`` the same loop runs in lock-step, the baseline async mode is measured
against: once a batch of turns is collected it pauses serving (requests are held, not refused),
waits for the judge, trains, syncs, then resumes serving.

A sample is marked trained only after a checkpoint containing its update is on disk, so killing this
process at any moment and restarting it loses nothing and trains nothing twice into the weights
that survive.

With ``[users] mode = "per_user"`` each update trains one user's adapter on that user's samples
only, with that adapter's own optimiser state (:meth:`Trainer.use_user`); :func:`pick_user` says
whose turn it is. Every per-user update is checkpointed (the user's adapter and optimiser, a few MB)
and committed at once, so a crash mid-update of one user returns only that update's samples to the
queue and touches no other user's files. A user's adapter is published, and swapped into serving
for them alone, every ``weight_sync_interval`` of *their* updates (docs/users.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import torch

from openclaw_rl.config import Config, is_loopback, launched_by_launcher
from openclaw_rl.runtime.loop_main import loop_config, run_loop_body
from openclaw_rl.runtime.metrics import REPEAT_WINDOW, MetricsWriter, drop_user_rows, repeat_share
from openclaw_rl.runtime.policy_admin import SWAP_TIMEOUT_S, request_pause, request_swap, serving_generating
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import SIGNAL_META, Store
from openclaw_rl.trainer.ppo import Trainer, UpdateInterrupted, last_user_step
from openclaw_rl.types import Sample

#: per_user mode: a user with waiting samples who was passed over this many updates in a row trains
#: next, with whatever they have — so a user with little traffic still learns.
STARVE_AFTER = 4


def pick_user(waiting: dict[str, int], passed_over: dict[str, int], batch_size: int) -> str | None:
    """Whose adapter the next per_user update trains, or None (wait for more samples).

    The user passed over ``STARVE_AFTER`` or more updates in a row (with samples waiting) goes
    first, the longest-waiting of them; otherwise the user with the most waiting samples, once
    they have a full batch — or once all users together have one (then the largest share trains,
    a partial batch, rather than everyone waiting for a batch no single user fills)."""
    waiting = {u: n for u, n in waiting.items() if n > 0}
    if not waiting:
        return None
    starved = [u for u in waiting if passed_over.get(u, 0) >= STARVE_AFTER]
    if starved:
        return max(sorted(starved), key=lambda u: (passed_over[u], waiting[u]))
    best = max(sorted(waiting), key=lambda u: waiting[u])
    if waiting[best] >= batch_size or sum(waiting.values()) >= batch_size:
        return best
    return None


class CoreBudget:
    """How many torch threads the trainer may use for its next pass: every core while serving and
    judging are idle (requests held by a lock-step pause count as idle), its launcher share (its
    threads at start) while either works.

    Why: the launcher gives the trainer half the cores because spinning intra-op threads of two busy
    processes on the same cores slow both (``launcher/wiring.thread_shares``). But serving is often
    idle while the trainer works: environment workers wait while a batch's worth of samples is
    queued, and lock-step pauses serving outright; then half the machine sat unused. The decision is
    taken again before every scoring pass and micro-batch (a few seconds of work each), so a request
    that arrives mid-update costs at most one micro-batch of contention. ``idle`` is asked at most
    once per ``recheck_s``."""

    def __init__(self, share: int, cores: int, idle: Callable[[], bool], recheck_s: float = 1.0):
        self.share, self.cores, self.idle, self.recheck_s = max(1, share), max(1, cores), idle, recheck_s
        self._at = -float("inf")
        self._threads = self.share
        self.wide_passes = 0  # passes that ran on every core (a metric)
        self.passes = 0

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self._at >= self.recheck_s:
            self._at = now
            self._threads = self.cores if self.cores > self.share and self.idle() else self.share
        self.passes += 1
        self.wide_passes += self._threads > self.share
        return self._threads

    def take_share_of_wide(self) -> float:
        """The share of passes since the last call that ran on every core (then starts counting anew)."""
        share = self.wide_passes / self.passes if self.passes else 0.0
        self.passes = self.wide_passes = 0
        return share


def signal_health(
    batch: list[Sample], signal: dict[str, float], before: dict[str, float]
) -> dict[str, float]:
    """Is the learning signal worth training on? Metrics of one update.

    From the batch:

    * ``adv_abs_mean``: mean |advantage| of the samples with an RL part (0: nothing to push);
    * ``teacher_minus_rollout``: mean (teacher - rollout) log-prob over the hinted samples' tokens;
      about 0 means the hinted teacher prefers nothing the rollout did not, and OPD adds only noise;
    * ``opd_abs_mean``: mean |teacher - rollout| over those tokens: the OPD term's scale per token,
      to set beside ``adv_abs_mean``, the RL term's;
    * ``repeat_frac``: the batch's mean share of response token runs that repeat an earlier run of
      the same response (:func:`~openclaw_rl.runtime.metrics.repeat_share`): a policy that has
      started to loop shows here before any evaluation (no truth needed, so in real use too);

    From the judge's ``signal`` counters, over what was judged since the previous update
    (``before``: the counters then):

    * ``hint_rate``: judged turns with a usable hint (teacher log-probs) / judged turns;
    * ``group_reward_mean`` / ``group_reward_spread``: the mean over the groups finished since of
      each group's episode-reward mean and spread;
    * ``zero_adv_group_frac``: the fraction of those groups whose rewards were all equal (no push).

    In simulated runs, where the environment knows the truth (a persona's own preference score of
    each response, which the judge never sees):

    * ``truth_mean``: how satisfied the simulated users were by the turns judged since (0..1);
    * ``judge_agreement``: of the turns the judge scored ±1 (in a group: relative to the group), the
      fraction whose sign the truth shares (satisfied / not; in a group: more / less satisfied than
      the group's other attempts). About 0.5 means the reward is noise;
    * ``truth_judged_pos`` / ``truth_judged_neg``: the mean truth of the turns judged +1 and -1; a
      working judge has the first well above the second.
    """
    out: dict[str, float] = {}
    advs = [abs(s.rl_signal) for s in batch if s.rl_signal is not None]
    if batch:
        out["adv_abs_mean"] = sum(advs) / len(advs) if advs else 0.0
    gaps = [
        t - r
        for s in batch
        if s.teacher_logprobs is not None
        for t, r, m in zip(s.teacher_logprobs, s.rollout_logprobs, s.loss_mask, strict=True)
        if m
    ]
    if gaps:
        out["teacher_minus_rollout"] = sum(gaps) / len(gaps)
        out["opd_abs_mean"] = sum(abs(g) for g in gaps) / len(gaps)

    if batch:
        out["repeat_frac"] = sum(repeat_share(s.response_ids, REPEAT_WINDOW) for s in batch) / len(batch)

    def delta(key: str) -> float:
        return float(signal.get(key, 0)) - float(before.get(key, 0))

    if delta("judged") > 0:
        out["hint_rate"] = delta("hinted") / delta("judged")
    groups = delta("groups")
    if groups > 0:
        out["group_reward_mean"] = delta("group_reward_mean_sum") / groups
        out["group_reward_spread"] = delta("group_reward_spread_sum") / groups
        out["zero_adv_group_frac"] = delta("groups_zero_advantage") / groups
    for name, count, total in (
        ("truth_mean", "truth_turns", "truth_sum"),
        ("judge_agreement", "truth_pairs", "truth_agree"),
        ("truth_judged_pos", "truth_pos", "truth_pos_sum"),
        ("truth_judged_neg", "truth_neg", "truth_neg_sum"),
    ):
        if delta(count) > 0:
            out[name] = delta(total) / delta(count)
    return out


class TrainingLoop:
    """Owns one :class:`Trainer`, the store handle and the metrics sink; start/run/stop lifecycle."""

    def __init__(
        self, cfg: Config, policy_url: str | None, store: Store | None = None, trainer: Trainer | None = None
    ):
        """``trainer``: an already built trainer (FSDP rank 0 passes its sharded one); by default
        :meth:`start` builds the single-process :class:`Trainer`."""
        self.cfg = cfg
        self.policy_url = policy_url
        self.run_dir = RunDir.of(cfg)
        self.store = store or Store(self.run_dir.store, create=not launched_by_launcher())
        self.metrics = MetricsWriter(cfg.log_dir, run_name=cfg.global_.run_name)
        self.trainer: Trainer | None = trainer
        self.version = 0
        self._stop = threading.Event()
        self._swap_thread: threading.Thread | None = None
        self._paused = False
        self._last_signal: dict[str, float] = {}
        self.per_user = cfg.users.mode == "per_user"
        self._passed_over: dict[str, int] = {}  # per_user: updates each waiting user was passed over
        self._user_updates: dict[str, int] = {}  # per_user: updates of each user's adapter in this run
        # adapters trained since their last publish (None: the shared policy); published at the end
        self._unpublished: set[str | None] = set()
        self.cores: CoreBudget | None = None  # [training] use_idle_cores: set by start()

    def start(self) -> None:
        tc = self.cfg.training
        if self.trainer is None:
            self.trainer = Trainer(self.cfg, self.cfg.policy_service.model)
        if tc.use_idle_cores and self._shares_cores_with_serving(self.trainer):
            self.cores = CoreBudget(torch.get_num_threads(), len(os.sched_getaffinity(0)), self._others_idle)
            self.trainer.thread_budget = self.cores
        if self.per_user:  # each user's adapter is loaded when their turn comes (Trainer.use_user)
            # the newest checkpoint may be a deleted user's, gone with them: the store's committed
            # count keeps step numbers from being reused
            self.trainer.step = max(last_user_step(self.cfg), self.store.counters().trainer_step)
            resumed = self.trainer.step > 0
        else:
            resumed = self.trainer.resume()
            untrained = self.store.untrain_after(self.trainer.step)
            if untrained:
                print(
                    f"[training] {untrained} sample(s) trained after step={self.trainer.step} (the "
                    "checkpoint resumed from) are in no surviving weights: back in the queue",
                    flush=True,
                )
        released = self.store.recover_claims(self.trainer.step)
        # an update that finished but was never checkpointed (kill -9) is undone: progress says so
        self.store.set_meta("trainer_updates", self.trainer.step)
        pointer = self.run_dir.read_policy_pointer()
        self.version = pointer[0] if pointer else 0
        processes = f", num_processes={self.trainer.world}" if tc.backend == "fsdp" else ""
        print(
            f"[training] algorithm={tc.algorithm}, backend={tc.backend}{processes}, "
            f"asymmetric_clip={str(tc.asymmetric_clip).lower()}, "
            f"opd_enabled={str(tc.opd_enabled).lower()}",
            flush=True,
        )
        if resumed or released:
            print(
                f"[training] resumed at step={self.trainer.step} version={self.version}, "
                f"{released} claimed sample(s) returned to the queue",
                flush=True,
            )

    def stop(self) -> None:
        self._stop.set()

    def _shares_cores_with_serving(self, trainer: Trainer) -> bool:
        """Whether this trainer and the serving engine take turns on the same CPU cores: one process
        training on the CPU, serving on this machine (a loopback URL)."""
        host = urlsplit(self.policy_url or "").hostname
        return trainer.world == 1 and str(trainer.device).startswith("cpu") and is_loopback(host or "")

    def _others_idle(self) -> bool:
        """Whether serving computes no request and no turn waits for the judge (see CoreBudget)."""
        if self.policy_url is None or self.store.turns_waiting() > 0:
            return False
        return serving_generating(self.policy_url) == 0

    @property
    def started_trainer(self) -> Trainer:
        """The trainer :meth:`start` built (or was given); a RuntimeError before there is one."""
        if self.trainer is None:
            raise RuntimeError("the training loop is not started: call start() first")
        return self.trainer

    @property
    def done(self) -> bool:
        max_steps = self.cfg.training.max_steps
        return self._stop.is_set() or (max_steps is not None and self.started_trainer.step >= max_steps)

    def run(self) -> int:
        """Train until ``max_steps`` or :meth:`stop`; always ends with a checkpoint."""
        trainer = self.started_trainer
        tc = self.cfg.training
        try:
            while not self.done:
                if not self._ready_for_update():
                    self._stop.wait(0.5)
                    continue
                self.update_once()
        finally:
            self._set_paused(False)
            self._publish_the_rest()
            self._checkpoint()
            self.metrics.close()
            if self._swap_thread is not None:
                # the last publish is served before the run stops the service (bounded by the
                # request's own timeout)
                self._swap_thread.join(timeout=SWAP_TIMEOUT_S + 5)
        # per_user: versions count each user's own publishes, so there is no one run-wide version
        where = "" if self.per_user else f" version={self.version}"
        print(f"[training] stopped at step={trainer.step}{where}", flush=True)
        return 0 if tc.max_steps is None or trainer.step >= tc.max_steps or self._stop.is_set() else 1

    def _next_user(self) -> str | None:
        return pick_user(self.store.ready_by_user(), self._passed_over, self.cfg.training.batch_size)

    def _ready_for_update(self) -> bool:
        if self.per_user and self.cfg.global_.async_mode:
            return self._next_user() is not None
        if self.cfg.global_.async_mode:
            return self.store.ready_count() >= self.cfg.training.batch_size
        return self._lock_step_ready()

    def _set_paused(self, paused: bool) -> None:
        if self.policy_url and paused != self._paused:
            err = request_pause(self.cfg, self.policy_url, paused)
            print(
                f"[async] lock-step: serving {'paused for training' if paused else 'resumed'}"
                + (f" — failed: {err}" if err else ""),
                flush=True,
            )
        self._paused = paused

    def _lock_step_ready(self) -> bool:
        """``async_mode = false``: collect a batch, stop serving, let the judge finish it, train."""
        c = self.store.counters()
        batch = self.cfg.training.batch_size
        if not self._paused:
            if c.samples_ready + c.waiting < batch:
                return False
            self._set_paused(True)  # the batch is collected: hold new requests
        if c.waiting or c.failed:
            return False  # the judge is still working on the collected turns
        if c.samples_ready >= batch:
            return True
        self._set_paused(False)  # judged turns without signal (score 0): collect more
        return False

    def update_once(self) -> dict[str, float]:
        """Claim one batch, run one PPO update, then sync and checkpoint on their intervals."""
        tc, trainer = self.cfg.training, self.started_trainer
        step = trainer.step + 1
        user: str | None = None
        if self.per_user:
            user = self._next_user()
            if user is None:
                return {}
            self._use_user(user)
        batch = self.store.claim_samples(tc.batch_size, step, self.version, tc.max_staleness, user=user)
        if not batch:
            return {}
        try:
            metrics = trainer.train_update(batch, interrupted=self._stop.is_set)
        except UpdateInterrupted as stopped:
            # Ctrl-C mid-update: nothing of it was applied, so its samples wait for the next run.
            released = self.store.release_sample_claims(step)
            print(
                f"[training] update {step} abandoned ({stopped}); {released} sample(s) back in the queue",
                flush=True,
            )
            return {}
        if user is not None and self.store.claimed_count(step) == 0:
            self._discard_deleted(user)  # `users delete` took their samples during the update
            return {}
        if user is not None:  # counted once the update is done: an abandoned one trained nobody
            for other, n in self.store.ready_by_user().items():
                if other != user and n > 0:
                    self._passed_over[other] = self._passed_over.get(other, 0) + 1
            self._passed_over[user] = 0
            self._user_updates[user] = self._user_updates.get(user, 0) + 1
        if self.cores is not None:
            metrics["wide_pass_frac"] = self.cores.take_share_of_wide()
        rewards = [s.reward for s in batch if s.reward is not None]
        if rewards:  # none when every group's rewards were equal (no RL part): not a mean of 0
            metrics["reward_mean"] = sum(rewards) / len(rewards)
        signal = self.store.get_meta(SIGNAL_META, {})
        metrics.update(signal_health(batch, signal if isinstance(signal, dict) else {}, self._last_signal))
        self._last_signal = signal if isinstance(signal, dict) else {}
        metrics["staleness_mean"] = sum(self.version - s.policy_version for s in batch) / len(batch)
        counters = self.store.counters()
        metrics["samples_dropped"] = float(counters.samples_dropped)
        metrics["sessions"] = float(counters.sessions)  # conversations so far: "sessions to learn"
        if user is not None:
            metrics["user_updates"] = float(self._user_updates[user])
        self.metrics.write(trainer.step, metrics, user=user)
        self.store.set_meta("trainer_updates", trainer.step)  # progress shows updates before their checkpoint
        self._unpublished.add(user)
        if user is not None:
            due = self._user_updates[user] % self.cfg.policy_service.weight_sync_interval == 0
            exported = self._export(user) if due else None
            # every per-user update: the user's adapter, optimiser and (just exported) version
            trainer.save_checkpoint_once()
            if self._commit_checkpoint() == 0:  # deleted after the check above: files written since go
                self._discard_deleted(user)
                return {}
            if exported is not None:
                self._swap(exported, user)  # only once committed: serving never loads a deleted user
        else:
            if trainer.step % self.cfg.policy_service.weight_sync_interval == 0:
                self._publish()
            if trainer.step % tc.checkpoint_interval == 0:
                self._commit_checkpoint()
        if not self.cfg.global_.async_mode:
            if self._swap_thread is not None:
                self._swap_thread.join()  # lock-step: serve again only on the new weights
            self._set_paused(False)
        return metrics

    def _publish_the_rest(self) -> None:
        """At the end of a run (max_steps, Ctrl-C between updates), publish every adapter trained
        since its last publish, so what a run learned after its last interval is served, exported and
        evaluated (max_steps = 2 with weight_sync_interval = 4 would have trained for nothing)."""
        for user in sorted(self._unpublished, key=lambda u: u or ""):
            if user is not None:
                # every per-user update is checkpointed: no checkpoints, the user was deleted since
                if not self.run_dir.user_folders(user)[1].is_dir():
                    continue
                self._use_user(user)
            self._publish(user)

    def _use_user(self, user: str) -> None:
        """Per_user: train and publish ``user``'s adapter. Its version counts its publishes, as the
        shared policy's does, so max_staleness means the same in both modes."""
        self.started_trainer.use_user(user)
        published = self.run_dir.read_published_policy(user)
        self.version = published.version if published else 0

    def _publish(self, user: str | None = None) -> None:
        """Export a new policy version (``user``: of that user's adapter), repoint ``latest``, tell
        serving without waiting on it."""
        self._swap(self._export(user), user)

    def _export(self, user: str | None) -> tuple[Path, int]:
        """Write a new policy version (``user``: of that user's adapter) and repoint ``latest``."""
        trainer = self.started_trainer
        self._unpublished.discard(user)
        self.version += 1
        path = trainer.export_policy(self.run_dir.policy_dir(user), self.version)
        # with a service to swap into, old versions go once it has loaded this one (_swap): until
        # then it may still read the one it serves (a LoRA reloaded into a restarted engine)
        keep = 0 if self.policy_url else self.cfg.training.keep_policies
        self.run_dir.publish_policy(self.version, path, step=trainer.step, user=user, keep=keep)
        who = f" user={user}" if user is not None else ""
        print(f"[async] published policy{who} version={self.version} at step={trainer.step}", flush=True)
        return path, self.version

    def _swap(self, exported: tuple[Path, int], user: str | None) -> None:
        """Tell serving to load an exported version, without waiting on it."""
        if not self.policy_url:
            return
        if self._swap_thread is not None:
            self._swap_thread.join()  # at most one swap in flight; a newer one supersedes on arrival
        url, (path, version) = self.policy_url, exported

        def swap() -> None:
            err = request_swap(self.cfg, url, path, version, user=user)
            if err:
                print(f"[async] weight swap to version={version} not applied: {err}", flush=True)
            else:  # serving reads this version now: the older ones may go
                self.run_dir.prune_policies(self.cfg.training.keep_policies, user)

        self._swap_thread = threading.Thread(target=swap, name="weight-swap", daemon=True)
        self._swap_thread.start()

    def _discard_deleted(self, user: str) -> None:
        """``openclaw-rl users delete`` removed ``user`` during their update: the update is dropped
        and whatever it wrote (checkpoint, exported version, metrics row) goes too, so nothing of
        theirs outlives the delete (docs/users.md)."""
        for folder in self.run_dir.user_folders(user):
            shutil.rmtree(folder, ignore_errors=True)
        drop_user_rows(self.run_dir.root, user)
        self._unpublished.discard(user)
        self._user_updates.pop(user, None)
        self._passed_over.pop(user, None)
        self.started_trainer.forget_user()
        print("[training] a user was deleted during their update: it is discarded", flush=True)

    def _commit_checkpoint(self) -> int:
        """The trainer has just written a checkpoint: its claimed samples become trained (how many)."""
        return self.store.commit_checkpoint(self.started_trainer.step, self.version)

    def _checkpoint(self) -> None:
        """Final checkpoint, unless the last update already wrote one for this very step."""
        if self.per_user:  # every per-user update was checkpointed and committed as it finished
            return
        self.started_trainer.save_checkpoint_once()
        self._commit_checkpoint()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openclaw_rl.trainer.loop")
    parser.add_argument("--config", required=True)
    parser.add_argument("--policy-url", default=None, help="policy service to swap weights into")
    args = parser.parse_args(argv)
    cfg = loop_config(args.config)
    # transformers deprecation chatter from inside torch.utils.checkpoint; not actionable by users
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

    def body() -> int:
        loop = TrainingLoop(cfg, args.policy_url)
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        signal.signal(signal.SIGINT, lambda *_: loop.stop())
        loop.start()
        return loop.run()

    return run_loop_body("training", body, cfg.log_dir)


if __name__ == "__main__":
    sys.exit(main())
