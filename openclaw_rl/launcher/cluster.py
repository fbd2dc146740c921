"""Cluster mode: the same loops placed on a Ray cluster (``[env_service] mode = "cloud"``).

Why Ray and not a home-made scheduler: users who outgrow one machine already run a cluster engine;
Ray gives placement over nodes, resource requests (CPUs / GPUs per actor), actor restarts when a
node dies, and one address to connect to. Nothing in the loops changes between local and cluster
mode — the actors here host the very same objects:

* **environment workers** — ``num_envs`` :class:`EnvWorker` actors spread over the nodes
  (``SPREAD``), each running the env service's episode logic against the one policy service URL over
  HTTP. The driver (:class:`ClusterEnvRunner`) deals out *episodes* one at a time; when a node dies,
  the episodes in flight there fail with an actor error and are dealt again to a live worker (Ray
  restarts the dead worker elsewhere). None is lost; :class:`RunReport` counts the retries. The
  runner names each attempt's session, so a retried episode starts afresh under a new session id
  and the dead attempt's half-finished session is closed through the policy service
  (``POST /v1/admin/close_session``): its last turn, which will never see a next state, is closed
  rather than left open, and its earlier turns are judged as usual;
* **the judges** — ``[prm_service] num_workers`` :class:`JudgeWorker` actors spread over the nodes
  (``SPREAD``), ``judge-0`` … ``judge-<n-1>``, each hosting a ``JudgeLoop`` that judges one turn at
  a time. So ``num_workers`` means "judgements at once" in both modes: locally one service runs that
  many concurrently, on a cluster that many actors run one each. The store's per-turn lease gives
  every turn to exactly one judge; a judge actor that dies is restarted by Ray with the same id and
  frees the leases it held at once (others wait out the lease). A ``local`` / ``minilm`` judge loads
  its model in every actor;
* **the trainer** — one :class:`TrainerWorker` actor reserving ``[training] num_cpus`` / ``num_gpus``,
  running :class:`~openclaw_rl.trainer.loop.TrainingLoop` (or the FSDP loop).

The durable store (SQLite, WAL) stays the single source of truth: the policy service (launcher child
on the head node), the judge and the trainer open the *same file*. On one machine that is simply
the log_dir; across hosts ``[global] log_dir`` must be a shared filesystem path mounted at the same
place on every node that hosts a judge or trainer actor (SQLite over NFS needs working POSIX locks;
keep those actors on one host otherwise). Environment workers never touch the store.

``ray`` is an optional extra (``pip install 'openclaw-rl[ray]'``); this module imports it lazily so
that everything else works without it. See docs/scaling.md.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.runtime.policy_admin import close_session
from openclaw_rl.runtime.ray_cluster import connect, live_nodes, ray_module
from openclaw_rl.runtime.rundir import RunDir

log = logging.getLogger("openclaw_rl.cluster")

#: CPUs an environment worker reserves: it is an HTTP client plus a light environment.
ENV_WORKER_CPUS = 0.25
#: CPUs each judge actor reserves (one judgement at a time; an API judge mostly waits, a minilm or
#: local judge computes). ``num_workers`` actors reserve ``num_workers`` × this.
JUDGE_CPUS = 0.25


# ---------------------------------------------------------------------- actors (plain classes)


def _local_env_config(cfg: Config) -> Config:
    """The worker-side config: the env service's own checks expect mode = "local" (one worker)."""
    local = cfg.model_copy(deep=True)
    local.env_service.mode = "local"
    local.env_service.num_envs = 1
    return local


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: everything a worker needs to run it the same way on any node."""

    index: int
    interaction_type: str
    seed: int
    persona: str | None = None
    session_id: str = ""  # this attempt's session; a retry gets a new one
    group: dict[str, str] | None = None  # the episode-group headers its members share (same seed)


class EnvWorker:
    """An environment worker (a Ray actor): runs one episode per call against the policy URL."""

    def __init__(self, cfg: Config, policy_url: str, worker_index: int):
        from openclaw_rl.envs.loop import EnvLoop, PolicyClient

        self.cfg = _local_env_config(cfg)
        self.index = worker_index
        self.service = EnvLoop(self.cfg, base_url=policy_url)
        self.client = PolicyClient.from_config(
            self.cfg, policy_url, self.service.stop_event, self.service.backoff_max
        )
        self.envs: dict[str, Any] = {}

    def node_id(self) -> str:
        """The Ray node this worker lives on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def run_episode(self, spec: EpisodeSpec) -> dict[str, Any]:
        """Run ``spec`` to its end; returns the episode's stats plus ``node`` and ``episode``."""
        key = f"{spec.interaction_type}:{spec.persona}" if spec.persona else spec.interaction_type
        env = self.envs.get(key)
        if env is None:
            env = self.service._make_env(spec.interaction_type, spec.seed, spec.persona)
            if env is None:
                raise RuntimeError(f"interaction type {spec.interaction_type!r} is unavailable on this node")
            self.envs[key] = env
        stats = self.service._episode(
            self.index,
            spec.interaction_type,
            env,
            self.client,
            spec.seed,
            spec.session_id or None,
            group=spec.group,
        )
        if stats is None:
            raise RuntimeError("the environment worker is stopping")
        if stats.error and stats.details.get("env_failed"):
            self.envs.pop(key, None)
            env.close()
        return {"episode": spec.index, "node": self.node_id(), **stats.to_dict()}

    def close(self) -> None:
        """Stop the in-flight request and close the environments."""
        self.service.stop_event.set()
        for env in self.envs.values():
            env.close()
        self.envs.clear()
        self.client.close()


class JudgeWorker:
    """One judge as an actor: leases turns from, and writes samples to, the shared store.

    It judges one turn at a time (its own config copy has ``num_workers = 1``); run several for
    more. The loop starts in the constructor, so when Ray restarts the actor (same constructor
    arguments, so the same ``worker_id``) judging resumes by itself, after the service has freed
    the leases its previous incarnation held.
    """

    def __init__(self, cfg: Config, worker_id: str = "judge-0"):
        from openclaw_rl.judge.loop import JudgeLoop
        from openclaw_rl.runtime.store import Store

        local = cfg.model_copy(deep=True)
        local.prm_service.num_workers = 1
        self.store = Store(RunDir.of(local).store)
        self.service = JudgeLoop(local, self.store, worker_id=worker_id)
        self.service.start()

    def start(self) -> str:
        """Make sure the loop runs; returns the service's start line."""
        self.service.start()
        return self.service.start_line()

    def stop(self) -> None:
        self.service.stop()
        self.store.close()


class TrainerWorker:
    """The training loop as an actor with the configured CPU / GPU reservation.

    Run as a threaded actor (``max_concurrency=2``) so that :meth:`stop` reaches the loop while
    :meth:`run` is busy training.
    """

    def __init__(
        self, cfg: Config, policy_url: str | None, config_path: str | None = None, workdir: str | None = None
    ):
        self.cfg, self.policy_url, self.config_path = cfg, policy_url, config_path
        self.workdir = workdir
        self.loop: Any = None
        self._stop = threading.Event()

    def run(self) -> dict[str, Any]:
        """Train until ``max_steps`` or :meth:`stop`; returns ``{rc, step, version}``."""
        if self.cfg.training.backend == "fsdp":
            if not self.config_path:
                raise ValueError(
                    'backend = "fsdp" on a cluster needs the config file path (shared filesystem)'
                )
            from openclaw_rl.trainer.fsdp import run_training

            # The FSDP processes read the config file themselves: run them from the launcher's
            # directory (when this host has it) so its relative paths mean what they meant there.
            if self.workdir and Path(self.workdir).is_dir():
                os.chdir(self.workdir)

            return {"rc": run_training(self.config_path, self.policy_url), "step": None, "version": None}
        from openclaw_rl.trainer.loop import TrainingLoop

        self.loop = TrainingLoop(self.cfg, self.policy_url)
        if self._stop.is_set():
            return {"rc": 0, "step": 0, "version": 0}
        self.loop.start()
        rc = self.loop.run()
        return {"rc": rc, "step": self.loop.trainer.step, "version": self.loop.version}

    def stop(self) -> None:
        self._stop.set()
        if self.loop is not None:
            self.loop.stop()


def remote_classes() -> dict[str, Any]:
    """The actor classes wrapped with ``ray.remote`` (done lazily: ray is optional)."""
    ray = ray_module()
    return {
        "env": ray.remote(EnvWorker),
        "judge": ray.remote(JudgeWorker),
        "trainer": ray.remote(TrainerWorker),
    }


# ---------------------------------------------------------------------- episode dealing


@dataclass
class RunReport:
    """What a cluster run of the environment workers did."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    #: The session of every attempt whose worker died mid-episode; each such episode was dealt again.
    abandoned_sessions: list[str] = field(default_factory=list)

    @property
    def retried(self) -> int:
        """Episodes dealt again because their worker died (one per abandoned attempt)."""
        return len(self.abandoned_sessions)

    @property
    def by_node(self) -> dict[str, int]:
        return dict(Counter(e["node"] for e in self.episodes))

    def line(self) -> str:
        ok = sum(1 for e in self.episodes if e.get("success"))
        return (
            f"[cluster] episodes={len(self.episodes)} (success={ok}), retried={self.retried} "
            f"after a worker died, nodes={len(self.by_node)}"
        )


class ClusterEnvRunner:
    """Deals episodes to ``num_envs`` environment-worker actors spread over the cluster's nodes.

    Usage (after :func:`connect`)::

        runner = ClusterEnvRunner(cfg, policy_url)
        report = runner.run(max_episodes=100)      # or run(stop=event) until the event is set
        print(report.line()); runner.close()
    """

    def __init__(
        self,
        cfg: Config,
        policy_url: str,
        num_envs: int | None = None,
        cpus_per_worker: float = ENV_WORKER_CPUS,
    ):
        ray = ray_module()
        self.cfg = cfg
        self.ray = ray
        n = num_envs if num_envs is not None else cfg.env_service.num_envs
        if n < 1:
            raise ValueError(f"[env_service] num_envs = {n}: cluster mode needs at least one worker")
        actor = remote_classes()["env"]
        # max_restarts=-1: Ray recreates a worker whose node died on a live node. max_task_retries=0:
        # the episode in flight fails instead of silently re-running, so the runner decides (and counts).
        self.workers = [
            actor.options(
                num_cpus=cpus_per_worker, scheduling_strategy="SPREAD", max_restarts=-1, max_task_retries=0
            ).remote(cfg, policy_url, i)
            for i in range(n)
        ]
        self.policy_url = policy_url
        self.rng = random.Random(cfg.global_.seed)
        self._next_index = 0
        self._pending: list[tuple[str, int, str | None, dict[str, str] | None]] = []  # rest of a group

    def placement(self, timeout: float = 120.0) -> list[str]:
        """The node id of each worker (waits until every worker is up)."""
        return self.ray.get([w.node_id.remote() for w in self.workers], timeout=timeout)

    def _spec(self) -> EpisodeSpec:
        """The next episode: the next member of the current group, or the first of a new group of
        ``group_size`` episodes of one task (same type, persona and seed)."""
        es = self.cfg.env_service
        if not self._pending:
            # Plain names from here on, as an EpisodeSpec carries them to the worker.
            itype: str = self.rng.choice(es.interaction_types)
            persona: str | None = self.rng.choice(es.personas) if itype == "chat" else None
            seed = self.rng.randrange(1 << 30)
            from openclaw_rl.envs.loop import group_headers  # envs is loaded only where episodes run

            group = group_headers(self.cfg, itype, self._next_index, es.group_size)
            self._pending = [(itype, seed, persona, group)] * es.group_size
        itype, seed, persona, group = self._pending.pop()
        spec = EpisodeSpec(self._next_index, itype, seed, persona, group=group)
        self._next_index += 1
        return spec

    def run(
        self,
        max_episodes: int | None = None,
        stop: threading.Event | None = None,
        on_episode: Callable[[dict[str, Any]], None] | None = None,
        on_dispatch: Callable[[int, EpisodeSpec], None] | None = None,
        report: RunReport | None = None,
    ) -> RunReport:
        """Deal episodes until ``max_episodes`` are done or ``stop`` is set; returns the report
        (``report``, when given, is filled as the run goes, for a caller that reads it from
        another thread).

        An episode whose worker dies (node failure, crash) is dealt again, to the first live worker;
        the dead worker gets no new episode until it answers a ping (Ray restarts it elsewhere).
        """
        from ray.exceptions import GetTimeoutError, RayActorError

        stop = stop or threading.Event()
        report = report if report is not None else RunReport()
        retry: deque[EpisodeSpec] = deque()
        idle = list(range(len(self.workers)))
        running: dict[Any, tuple[int, EpisodeSpec]] = {}
        pings: dict[Any, int] = {}
        dealt = 0
        while True:
            done_count = len(report.episodes)
            if max_episodes is not None and done_count >= max_episodes:
                break
            if stop.is_set() and not running:
                break
            while idle and not stop.is_set() and (retry or max_episodes is None or dealt < max_episodes):
                w = idle.pop(0)
                if retry:
                    spec = retry.popleft()
                else:
                    spec = self._spec()
                    dealt += 1
                spec = replace(
                    spec, session_id=f"env-{spec.interaction_type}-e{spec.index}-{uuid.uuid4().hex[:12]}"
                )
                running[self.workers[w].run_episode.remote(spec)] = (w, spec)
                if on_dispatch is not None:
                    on_dispatch(w, spec)
            waiting = list(running) + list(pings)
            if not waiting:
                time.sleep(0.2)
                continue
            ready, _ = self.ray.wait(waiting, num_returns=1, timeout=0.5)
            for ref in ready:
                if ref in pings:
                    w = pings.pop(ref)
                    try:
                        self.ray.get(ref, timeout=5)
                        idle.append(w)  # restarted and answering again
                    except (RayActorError, GetTimeoutError):
                        pings[self.workers[w].node_id.remote()] = w
                    continue
                w, spec = running.pop(ref)
                try:
                    stats = self.ray.get(ref, timeout=5)
                except RayActorError as exc:
                    retry.append(spec)
                    log.warning(
                        "[cluster] env worker %d died during episode %d (%s); retrying it elsewhere",
                        w,
                        spec.index,
                        type(exc).__name__,
                    )
                    self._abandon(spec.session_id, report)
                    pings[self.workers[w].node_id.remote()] = w
                    continue
                report.episodes.append(stats)
                idle.append(w)
                if on_episode is not None:
                    on_episode(stats)
        return report

    def _abandon(self, session_id: str, report: RunReport) -> None:
        """Close a dead attempt's session so its open last turn does not wait for a next state forever."""
        report.abandoned_sessions.append(session_id)
        err = close_session(self.cfg, self.policy_url, session_id)
        if err:
            log.warning("[cluster] could not close abandoned session %s: %s", session_id, err)

    def close(self) -> None:
        """Kill the worker actors (episodes in flight are abandoned)."""
        for w in self.workers:
            self.ray.kill(w, no_restart=True)
        self.workers = []


# ---------------------------------------------------------------------- the whole run


def run_cluster(
    cfg: Config,
    config_path: str,
    max_episodes: int | None = None,
    install_signals: bool = True,
    keep_fds: tuple[int, ...] = (),
) -> int:
    """Cluster-mode counterpart of :func:`openclaw_rl.launcher.wiring.run_all`.

    The policy service runs as the launcher's child on this (head) node, as locally; the judge, the
    trainer and the environment workers are Ray actors. Ends when the trainer reaches
    ``max_steps`` (or on SIGINT / SIGTERM) and prints the episode report, retries included.
    """
    import signal

    from openclaw_rl.launcher.wiring import build_children, engine_gone, policy_url, start_serving

    cfg = cfg.with_absolute_paths()
    try:
        ray = connect(cfg.global_.ray_address)  # bounded: an unreachable head fails within 10 s
    except ConnectionError as exc:
        print(f"[cluster] error: {exc}", flush=True)
        return 1
    children = build_children(cfg, config_path, keep_fds)  # the policy service holds the folder too
    run = RunDir.of(cfg)
    server = children["policy_service"]
    url = policy_url(cfg)
    stop = threading.Event()
    if install_signals:
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ok, engine = start_serving(cfg, server, stop.is_set)
    if not ok:
        return 0 if stop.is_set() else 1
    started_with = run.store_identity()  # start_serving made it
    runner: ClusterEnvRunner | None = None
    judges: list[Any] = []
    trainer = None
    report = RunReport()
    rc = 1
    try:
        classes = remote_classes()
        # One actor per judgement at once; restarts keep the constructor arguments, so the same id.
        judges = [
            classes["judge"]
            .options(num_cpus=JUDGE_CPUS, scheduling_strategy="SPREAD", max_restarts=-1)
            .remote(cfg, f"judge-{i}")
            for i in range(cfg.prm_service.num_workers)
        ]
        lines = ray.get([j.start.remote() for j in judges], timeout=300)
        print(lines[0], flush=True)
        print(
            f"[prm_service] judge actors={len(judges)} (judge-0..judge-{len(judges) - 1}), "
            "one judgement each",
            flush=True,
        )
        tc = cfg.training
        trainer = (
            classes["trainer"]
            .options(num_cpus=tc.num_cpus, num_gpus=tc.num_gpus, max_concurrency=2)
            .remote(cfg, url, str(Path(config_path).resolve()), os.getcwd())
        )
        train_ref = trainer.run.remote()
        runner = ClusterEnvRunner(cfg, url)
        print(
            f"[env_service] mode=cloud, num_envs={len(runner.workers)}, nodes={len(live_nodes())}", flush=True
        )
        env_thread = threading.Thread(
            target=runner.run,
            kwargs={"max_episodes": max_episodes, "stop": stop, "report": report},
            name="cluster-envs",
            daemon=True,
        )
        env_thread.start()
        result: dict[str, Any] | None = None
        while not stop.is_set():
            ready, _ = ray.wait([train_ref], timeout=1.0)
            if ready:
                result = ray.get(train_ref)
                print(f"[cluster] training finished: {result}", flush=True)
                break
            if not server.alive():
                print("[cluster] policy service exited; stopping the run", flush=True)
                break
            gone = engine_gone(cfg, engine) or run.store_gone(started_with)
            if gone is not None:
                print(f"[cluster] {gone}", flush=True)
                break
        stop.set()
        if result is None and trainer is not None:
            ray.get(trainer.stop.remote(), timeout=30)
            result = ray.get(train_ref, timeout=300)
        env_thread.join(timeout=120)
        rc = int(result["rc"]) if result else 1
    finally:
        stop.set()
        print(report.line(), flush=True)
        if runner is not None:
            runner.close()
        if judges:
            try:
                ray.get([j.stop.remote() for j in judges], timeout=60)
            except Exception as exc:  # shutting down: report, go on stopping the rest
                print(f"[cluster] judges did not stop cleanly: {type(exc).__name__}: {exc}", flush=True)
            for j in judges:
                ray.kill(j, no_restart=True)  # max_restarts=-1 would otherwise outlive the run
        if trainer is not None:
            ray.kill(trainer, no_restart=True)  # it has returned (or was told to stop): free its CPUs now
        server.stop(timeout=30)
        if engine is not None:
            engine.stop()
    return rc
