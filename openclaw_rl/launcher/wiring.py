"""Run the four loops as child processes of the launcher, and stop exactly those children.

Why processes and not threads is in the README ("Why processes"): in short, one GIL would let
training stall serving, and a crashed loop must not take the others down.

    launcher ──▶ policy service   (python -m openclaw_rl.cli serve)          HTTP on the configured port
             ──▶ judge            (python -m openclaw_rl.judge.loop)       store → judgements, samples
             ──▶ trainer          (python -m openclaw_rl.trainer.loop)        samples → updates → swaps
             ──▶ environments     (python -m openclaw_rl.envs.loop)        HTTP client of the policy
             ──▶ evaluator        (python -m openclaw_rl.launcher.eval_loop)   [training] eval_interval > 0:
                                  held-out score of each new policy → metrics.jsonl (a private copy)

The evaluator is optional: when it keeps crashing the run goes on without it.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from openclaw_rl.config import CHILD_ENV, Config
from openclaw_rl.launcher.eval_loop import learned_line, live_eval_problem, pending_evaluation
from openclaw_rl.launcher.status import run_progress_line
from openclaw_rl.runtime.loop_main import DISK_FULL_EXIT
from openclaw_rl.runtime.metrics import plot_metrics
from openclaw_rl.runtime.rundir import MIN_FREE_BYTES, RunDir, free_bytes
from openclaw_rl.runtime.store import Store

MAX_RESTARTS = 3
PROGRESS_EVERY_S = 10.0  # checked this often, printed when it moved ...
PROGRESS_QUIET_S = 60.0  # ... or when this long has passed without a line (a quiet run is alive)
HEALTH_TIMEOUT_S = 180.0
#: When training reaches max_steps, how long the launcher waits for the evaluator to score the last
#: published policy (the curve's final point) before it stops the run anyway.
FINAL_EVAL_TIMEOUT_S = 300.0
#: Children the run can lose: after MAX_RESTARTS crashes the run goes on without them.
OPTIONAL_CHILDREN = ("evaluator",)
#: The children a stopping run waits for, in this order: every one but the server is told to stop at
#: once, the server (last) once they are gone (:func:`_stop_all`).
STOP_ORDER = ("env_service", "evaluator", "training", "prm_service", "policy_service")
#: Seconds a child may take to stop before it is killed: the trainer may be writing its checkpoint.
STOP_TIMEOUT_S = {"training": 120.0}
DEFAULT_STOP_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def stop_with_launcher(launcher_pid: int) -> None:
    """``preexec_fn`` for a child process: the kernel sends it SIGTERM when the launcher dies.

    The launcher stops its children itself on a normal exit or Ctrl-C; this covers the exits it
    cannot handle (``kill -9``, the OOM killer), after which a child would otherwise keep serving,
    judging or training with no one to stop it. Linux only; elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != launcher_pid:  # it died before the request took effect: do not start at all
        os._exit(1)


@dataclass
class Child:
    """One loop process the launcher started (and therefore must stop)."""

    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    restarts: int = 0
    finished: bool = field(default=False)
    threads: int | None = None  # torch's intra-op threads (OMP_NUM_THREADS), see thread_shares
    keep_fds: tuple[int, ...] = ()  # open files the child inherits (the run's folder lock)
    waiting_for_room: bool = False  # stopped on a full disk, restarted once there is room

    def start(self) -> None:
        # A new process group per child: Ctrl-C in the terminal reaches the launcher alone, which
        # then stops the loops and, after them, the server (_stop_all).
        env = {**os.environ, CHILD_ENV: "1", "PYTHONUNBUFFERED": "1"}
        if self.threads is not None and "OMP_NUM_THREADS" not in os.environ:  # the user's own setting wins
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        self.proc = subprocess.Popen(
            self.argv,
            start_new_session=True,
            env=env,
            preexec_fn=functools.partial(stop_with_launcher, os.getpid()),
            pass_fds=self.keep_fds,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float) -> None:
        """Ask the child to stop (SIGTERM) and wait for it; killed after ``timeout`` seconds."""
        self.ask_to_stop()
        self.wait_stopped(timeout)

    def kill(self) -> None:
        """SIGKILL, if it is still running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def ask_to_stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:  # started and still running
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        """Wait for a child asked to stop; kill it after ``timeout`` seconds."""
        proc = self.proc
        if proc is None or proc.poll() is not None:  # never started, or already exited
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"[launch] {self.name} did not stop within {timeout:.0f}s; killing it", flush=True)
            proc.kill()
            proc.wait(timeout=10)


def policy_url(cfg: Config) -> str:
    return cfg.policy_service.local_url


def wait_healthy(url: str, child: Child, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            return False
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass  # not listening yet: the model is still loading
        time.sleep(0.5)
    return False


def trainer_module(cfg: Config) -> str:
    """The training loop's entry point: one process, or FSDP over ``num_processes``."""
    return "openclaw_rl.trainer.fsdp" if cfg.training.backend == "fsdp" else "openclaw_rl.trainer.loop"


def thread_shares(cores: int) -> dict[str, int]:
    """Torch threads per loop process, so that together they do not ask for more cores than there are.

    Why: torch's intra-op threads wait for each other at the end of every operation, spinning. When
    the serving engine and the trainer each run a thread on every core, a thread of one is often
    descheduled in favour of the other's, and its partner spins until it comes back: on 2 cores a
    PPO update took 60-100 s next to a generating engine with 2 threads each, 21-30 s with 1 each
    (bench/update_profile.py has the whole story). The engine and the trainer get half the cores
    each; the judge (a small classifier and a teacher pass now and then) and the environment workers
    get a quarter and one; the evaluator, at low priority, half (as it sets itself).
    """
    half = max(1, cores // 2)
    small = max(1, cores // 4)
    return {
        "policy_service": half,
        "training": half,
        "prm_service": small,
        "env_service": 1,
        "evaluator": half,
    }


def build_children(cfg: Config, config_path: str, keep_fds: tuple[int, ...] = ()) -> dict[str, Child]:
    """The run's loop processes, not started yet; each inherits ``keep_fds`` (the run's folder
    lock, :meth:`~openclaw_rl.runtime.rundir.RunDir.hold`)."""
    py, conf, url = sys.executable, str(Path(config_path)), policy_url(cfg)
    children = {
        "policy_service": Child("policy_service", [py, "-m", "openclaw_rl.cli", "serve", "--config", conf]),
        "prm_service": Child("prm_service", [py, "-m", "openclaw_rl.judge.loop", "--config", conf]),
        "training": Child("training", [py, "-m", trainer_module(cfg), "--config", conf, "--policy-url", url]),
    }
    if cfg.env_service.enabled and cfg.env_service.num_envs > 0:
        children["env_service"] = Child(
            "env_service", [py, "-m", "openclaw_rl.envs.loop", "--config", conf, "--policy-url", url]
        )
    if live_eval_problem(cfg) is None:
        children["evaluator"] = Child(
            "evaluator", [py, "-m", "openclaw_rl.launcher.eval_loop", "--config", conf]
        )
    shares = thread_shares(len(os.sched_getaffinity(0)))
    for name, child in children.items():
        child.threads = shares.get(name)
        child.keep_fds = keep_fds
    return children


def supervise(children: dict[str, Child], log_dir: Path | None = None) -> int | None:
    """Restart each child that exited (up to :data:`MAX_RESTARTS` times). Returns the run's exit code
    when a required child exhausted its restarts, else None; an optional one (the evaluator) is then
    given up on with one line, and the run goes on without it. A child that stopped on a full disk
    (under ``log_dir``) waits for room instead, and is restarted then without counting a crash."""
    for child in children.values():
        if child.alive() or child.finished:
            continue
        code = child.proc.returncode if child.proc is not None else None
        if code == DISK_FULL_EXIT and log_dir is not None:
            _restart_when_there_is_room(child, log_dir)
            continue
        if child.restarts >= MAX_RESTARTS and child.name in OPTIONAL_CHILDREN:
            child.finished = True  # given up on: never restarted, nothing left to stop
            print(
                f"[launch] {child.name} exited (code {code}) again after {MAX_RESTARTS} restarts; the run goes on without "
                "live evaluation",
                flush=True,
            )
            continue
        if child.restarts >= MAX_RESTARTS:
            print(
                f"[launch] {child.name} exited (code {code}) again after {MAX_RESTARTS} restarts; stopping the run",
                flush=True,
            )
            return 1
        child.restarts += 1
        resumes = "metrics.jsonl" if child.name == "evaluator" else "the store"
        print(
            f"[launch] {child.name} exited with code {code}; restarting "
            f"({child.restarts}/{MAX_RESTARTS}) — it resumes from {resumes}",
            flush=True,
        )
        child.start()
    return None


def _restart_when_there_is_room(child: Child, log_dir: Path) -> None:
    """``child`` stopped because the disk under ``log_dir`` is full: say so once, and start it again
    (it resumes from the store) once :data:`MIN_FREE_BYTES` are free; the other loops go on."""
    free = free_bytes(log_dir)
    if free < MIN_FREE_BYTES:
        if not child.waiting_for_room:
            child.waiting_for_room = True
            print(
                f"[launch] {child.name} stopped: the disk under {log_dir} is full ({free // 2**20} MiB "
                f"free); the rest of the run goes on, and {child.name} restarts once "
                f"{MIN_FREE_BYTES // 2**20} MiB are free",
                flush=True,
            )
        return
    child.waiting_for_room = False
    print(
        f"[launch] {child.name}: room on the disk again; restarting it — it resumes from the store",
        flush=True,
    )
    child.start()


def start_serving(
    cfg: Config, server: Child, should_stop: Callable[[], bool] | None = None
) -> tuple[bool, Any]:
    """Start what serves the policy and wait until it answers: the external SGLang / vLLM engine when
    ``launch = true``, then the policy service (which serves the run's newest published weights, not
    the base). Returns (ok, the external engine or None); on failure whatever was
    started here is stopped again. ``should_stop``: Ctrl-C while the engine loads ends the wait.
    Used by both the local and the cluster launcher."""
    url = policy_url(cfg)
    engine = None
    Store(RunDir.of(cfg).store).close()  # made here, first: the loops open it and never make one
    if cfg.policy_service.launch:
        from openclaw_rl.launcher.external import EngineError, ExternalEngine

        try:
            engine = ExternalEngine(cfg)
            engine.start()
            engine.wait_ready(should_stop=should_stop)
        except EngineError as exc:
            print(f"[launch] {exc}", flush=True)
            if engine is not None:
                engine.stop()
            return False, None
    server.start()
    if not wait_healthy(url, server):
        print(f"[launch] policy service did not become healthy at {url}", flush=True)
        server.stop(timeout=30)
        if engine is not None:
            engine.stop()
        return False, None
    return True, engine  # the service loads the newest published policy itself (restarts too)


def engine_gone(cfg: Config, engine: Any) -> str | None:
    """Why the run must stop when the engine it launched has exited (None while it runs, or when it
    launched none): nothing answers the policy service's requests any more, so a run that waited
    would make no progress and never reach max_steps. Used by both launchers."""
    if engine is None or engine.alive():
        return None
    return (
        f"the {cfg.policy_service.backend} engine exited with code {engine.proc.returncode}; "
        f"see {engine.log_path}; stopping the run"
    )


#: The launcher's exit status after a second Ctrl-C killed the loops (a shell's 128 + SIGINT).
KILLED_EXIT = 130


def run_all(cfg: Config, config_path: str, keep_fds: tuple[int, ...] = ()) -> int:
    """Start the loops, watch them, restart a crashed one, stop all on max_steps or Ctrl-C.
    ``keep_fds``: files every loop inherits (the run's folder lock, :meth:`RunDir.hold`)."""
    run = RunDir.of(cfg)
    store = Store(run.store)
    started_with = run.store_identity()
    children = build_children(cfg, config_path, keep_fds)
    url = policy_url(cfg)
    stopping = killed = False

    def on_signal(*_: object) -> None:
        nonlocal stopping, killed
        if stopping:  # asked again while the loops finish: the user wants it over now
            print(
                "[launch] asked again: killing the loops still stopping (replies in flight are lost)",
                flush=True,
            )
            _kill_all(children)
            killed = True
            return
        # at once: the loops may take a minute to finish what they are doing
        print(
            "[launch] stopping: the trainer ends or abandons its update and publishes what it "
            "trained; the server finishes the replies in flight (each within request_timeout_sec "
            f"= {cfg.policy_service.request_timeout_sec:g} s) and records them; Ctrl-C again to stop at once",
            flush=True,
        )
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(
        f"[async] weight_sync_interval={cfg.policy_service.weight_sync_interval}, "
        f"non_blocking={str(cfg.policy_service.non_blocking).lower()}",
        flush=True,
    )
    if "env_service" not in children:
        print(f"[launch] no environment workers: personal-agent mode, talk to {url}/v1", flush=True)
    eval_problem = live_eval_problem(cfg)
    if eval_problem is not None and cfg.training.eval_interval > 0:
        print(f"[launch] {eval_problem}", flush=True)
    ok, engine = start_serving(cfg, children["policy_service"], lambda: stopping)
    if not ok:
        store.close()
        return KILLED_EXIT if killed else 0 if stopping else 1
    for name in ("prm_service", "training", "env_service", "evaluator"):
        if name in children:
            children[name].start()

    rc = 0
    reached_max_steps = False
    last_progress, last_printed, last_line = 0.0, 0.0, ""
    try:
        while not stopping:
            time.sleep(0.5)
            trainer = children["training"]
            if not trainer.alive() and trainer.proc is not None and trainer.proc.returncode == 0:
                print("[launch] training reached max_steps; stopping the run", flush=True)
                reached_max_steps = True
                break
            gone = run.store_gone(started_with)  # before any restart, which would make a new one
            if gone is not None:
                print(f"[launch] {gone}", flush=True)
                # killed, not asked: a trainer's final checkpoint would put the deleted folder back,
                # and a later run there would resume those weights against an empty store
                _kill_all(children)
                stopping, rc = True, 1
                break
            failed = supervise(children, run.root)
            if failed is not None:
                stopping, rc = True, failed
                break
            gone = engine_gone(cfg, engine)
            if gone is not None:
                print(f"[launch] {gone}", flush=True)
                stopping, rc = True, 1
                break
            now = time.monotonic()
            if now - last_progress >= PROGRESS_EVERY_S:
                line = run_progress_line(cfg, store)
                if line != last_line or now - last_printed >= PROGRESS_QUIET_S:
                    print(line, flush=True)
                    last_printed = now
                last_progress, last_line = now, line
    finally:
        if reached_max_steps:
            if "env_service" in children:
                children["env_service"].stop(timeout=30)  # no new traffic: the evaluator gets the cores
            _await_final_eval(cfg, children.get("evaluator"), lambda: stopping)
        _stop_all(children, server_stop_timeout(cfg))
        if engine is not None:
            engine.stop()
        print(run_progress_line(cfg, store), flush=True)
        learned = learned_line(cfg.log_dir)
        if learned:
            print(learned, flush=True)
        store.close()
        plot = plot_metrics(cfg.log_dir)
        if plot is not None:
            print(f"[launch] training curves: {plot}", flush=True)
    # a stop the loops could not finish (a second Ctrl-C) is told apart from a clean one: 128 + SIGINT
    return KILLED_EXIT if killed else rc


def _kill_all(children: dict[str, Child]) -> None:
    """SIGKILL every child still running: for a stop that must not let them finish anything."""
    for child in children.values():
        child.kill()


def _await_final_eval(cfg: Config, evaluator: Child | None, interrupted: Callable[[], bool]) -> None:
    """Training reached ``max_steps``: give the evaluator (if running) time to score the policy it has
    not scored yet — the learning curve's last point — before the run is stopped. Ctrl-C ends the
    wait."""
    if evaluator is None or not evaluator.alive():
        return
    due = pending_evaluation(cfg)
    if due is None:
        return
    print(
        f"[launch] waiting up to {FINAL_EVAL_TIMEOUT_S:.0f}s for the evaluator to score policy "
        f"{due} (Ctrl-C to skip)",
        flush=True,
    )
    deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
    while (
        evaluator.alive()
        and not interrupted()
        and time.monotonic() < deadline
        and pending_evaluation(cfg) is not None
    ):
        time.sleep(0.5)


def server_stop_timeout(cfg: Config) -> float:
    """How long the launcher lets the policy service drain: as long as the server itself lets a
    reply in flight run (``request_timeout_sec``), and a little more to record it and exit. Killed
    sooner, a user's reply still streaming would be cut off and never recorded."""
    return cfg.policy_service.request_timeout_sec + 10.0


def _stop_all(children: dict[str, Child], server_timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
    """Stop every child the launcher started. All but the policy server are asked at once, and each
    finishes what it is in the middle of (an environment worker its in-flight turn, the trainer its
    final checkpoint, the judge its judgement); none needs another to do so. The server goes last,
    once they are gone, draining and recording the turns still in flight. One after another the
    stops added up (~27 s on 2 cores, 17 of them the worker's turn); at once they take as long as
    the slowest."""
    server = children.get("policy_service")
    clients = [children[name] for name in STOP_ORDER if name in children and children[name] is not server]
    for child in clients:
        child.ask_to_stop()
    for child in clients:
        child.wait_stopped(STOP_TIMEOUT_S.get(child.name, DEFAULT_STOP_TIMEOUT_S))
    if server is not None:
        server.stop(server_timeout)
