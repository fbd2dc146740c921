"""The live learning curve: score each new policy on the held-out slice while the run learns.

Runs as its own process (``python -m openclaw_rl.launcher.eval_loop --config FILE``), started by the
launcher when ``[training] eval_interval > 0``::

    evaluate the base policy (version 0, step 0)                            once, at start
    loop: read policy/latest.json                                           every POLL_S
          a version not evaluated yet, published >= eval_interval updates
          after the last evaluated one?  → load its weights, evaluate it
    each evaluation → one "eval" row in metrics.jsonl + TensorBoard, one [eval] line

The evaluation is the chat part of ``openclaw-rl eval`` (:mod:`openclaw_rl.launcher.evaluate`): the
greedy first reply to each of the first ``[training] eval_size`` held-out GSM8K problems, scored by
each persona in ``[env_service] personas``. The policy is served by a private in-process
:class:`~openclaw_rl.policy.server.PolicyService` on a free loopback port with its own temporary
store, so evaluation turns never become training data; each evaluated version's exported weights are
swapped into it.

In ``[users] mode = "per_user"`` each simulated user's adapter (``sim-<persona>``) is evaluated on
its own persona's problems once it has ``eval_interval`` more updates than at its last evaluation
(:func:`due_user_policies`): one ``eval`` row per evaluation with ``user``, ``adapter_version``,
``user_score`` and ``score_<persona>``, and an ``[eval] user=...`` line. Those rows carry no
``score`` / ``policy_version``, so the run-wide figures (base, progress line, sessions to learn)
read only the shared rows.

What has been evaluated is read back from ``metrics.jsonl`` (:func:`due_policy`), so a restarted
evaluator never evaluates a version twice, and the launcher can ask the same function whether an
evaluation is still due before it stops the run. SIGTERM / SIGINT end it after the request in flight;
an evaluation cut short writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_rl.config import Config, Persona, live_eval_every
from openclaw_rl.runtime.metrics import MetricsWriter, read_metrics
from openclaw_rl.runtime.rundir import POLICY_META, PublishedPolicy, RunDir

if TYPE_CHECKING:  # the evaluation code (httpx, the environments) loads only in the evaluator itself
    from openclaw_rl.launcher.evaluate import EvalSizes

#: How often the evaluator looks for a newly published policy (seconds).
POLL_S = 2.0
#: Tokens per reply: long enough for a worked GSM8K answer with its closing line (the student
#: persona checks it), short enough that one evaluation stays around a minute on 2 CPU cores.
EVAL_MAX_TOKENS = 128
#: Problems of one persona sent at once: the embedded engine decodes them as one batch, several
#: times the throughput of one after another on CPU.
EVAL_CONCURRENCY = 8
#: ``policy_version`` of the base policy's row.
BASE_VERSION = 0


def live_eval_problem(cfg: Config) -> str | None:
    """Why this config gets no live evaluator (one line for the person), or None when it does."""
    if cfg.training.eval_interval <= 0:
        return "[training] eval_interval = 0: live evaluation is off"
    if "chat" not in cfg.env_service.interaction_types:
        return (
            "live evaluation scores the chat personas, and [env_service] interaction_types has no "
            '"chat": no live evaluation (openclaw-rl eval scores terminal and tool_call after the run)'
        )
    if cfg.policy_service.backend != "transformers":
        return (
            f"live evaluation needs a private copy of the policy in the embedded engine; backend "
            f'"{cfg.policy_service.backend}" serves it elsewhere: no live evaluation'
        )
    return None


def eval_rows(log_dir: Path) -> list[dict[str, Any]]:
    """The ``kind = "eval"`` rows of ``metrics.jsonl``, oldest first."""
    return read_metrics(log_dir, kind="eval")


def _score(row: dict[str, Any]) -> float | None:
    value = row.get("score")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def base_score(rows: list[dict[str, Any]]) -> float | None:
    """The base policy's score among ``rows`` (None before it was evaluated)."""
    return next(
        (_score(r) for r in rows if r.get("policy_version") == BASE_VERSION and _score(r) is not None), None
    )


def latest_eval(log_dir: Path) -> dict[str, Any] | None:
    """The newest evaluation with a score (``score``, ``base_score``, ``policy_version``, ``step``)."""
    rows = eval_rows(log_dir)
    scored = [r for r in rows if _score(r) is not None]
    if not scored:
        return None
    newest = dict(scored[-1])
    if newest.get("base_score") is None:
        newest["base_score"] = base_score(rows)
    return newest


#: The live eval's lead over the base that counts as "it has learned me" (sessions to learn).
LEARNED_MARGIN = 0.15


def sessions_to_learn(log_dir: Path, margin: float = LEARNED_MARGIN) -> int | None:
    """How many conversations the run took to learn: the sessions seen by the update that made the
    first evaluated policy scoring at least ``base + margin`` whose later evaluations all stay there
    too; None when no evaluation got there (or stayed). Read from ``metrics.jsonl``: the evaluator's
    rows (score, base, training step) and the trainer's (``sessions`` at each step)."""
    rows = read_metrics(log_dir)
    evals = [r for r in rows if r.get("kind") == "eval" and _score(r) is not None]
    base = base_score(evals)
    if base is None:
        return None
    trained = sorted(
        (r for r in evals if r.get("policy_version") != BASE_VERSION), key=lambda r: int(r.get("step", 0))
    )
    first = None
    for i, r in enumerate(trained):
        if all((_score(later) or 0.0) >= base + margin for later in trained[i:]):
            first = r
            break
    if first is None:
        return None
    sessions = {
        int(r["step"]): r["sessions"]
        for r in rows
        if r.get("kind") == "train" and isinstance(r.get("sessions"), int | float) and "step" in r
    }
    step = int(first.get("step", 0))
    known = [s for k, s in sessions.items() if k <= step]
    return int(sessions.get(step, max(known) if known else 0))


def learned_line(log_dir: Path, margin: float = LEARNED_MARGIN) -> str | None:
    """``[learned] ...``: sessions to learn, or how far the live eval is from it; None without evals."""
    best = [r for r in eval_rows(log_dir) if _score(r) is not None]
    base = base_score(best)
    if base is None:
        return None
    n = sessions_to_learn(log_dir, margin)
    if n is not None:
        return f"[learned] sessions to learn: {n} (live eval >= base {base:.2f} + {margin:.2f} from then on)"
    top = max(_score(r) or 0.0 for r in best)
    return (
        f"[learned] sessions to learn: not yet (best live eval {top:.2f}, base {base:.2f}; "
        f"needs base + {margin:.2f} and to stay there)"
    )


def policy_step(cfg: Config, published: PublishedPolicy) -> int:
    """The training step ``published`` was exported at: the pointer's ``step``, else the step the
    export recorded beside the weights, else the step the trainer publishes that version at."""
    if published.step is not None:
        return published.step
    try:
        meta = json.loads((published.path / POLICY_META).read_text(encoding="utf-8"))
        return int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return published.version * cfg.policy_service.weight_sync_interval


def due_policy(cfg: Config) -> PublishedPolicy | None:
    """The policy the evaluator should evaluate next, or None when it is up to date.

    The base policy first (when ``metrics.jsonl`` has no row for version 0); then the newest
    published version, when it is newer than every evaluated one and was published at least
    ``eval_interval`` updates after the last evaluated one. A version with a row — scored, or
    recorded as failed — is never due again.
    """
    rows = eval_rows(cfg.log_dir)
    done = {int(r["policy_version"]) for r in rows if isinstance(r.get("policy_version"), int)}
    if BASE_VERSION not in done:
        return PublishedPolicy(BASE_VERSION, Path(cfg.policy_service.model), 0)
    try:
        published = RunDir.of(cfg).read_published_policy()
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable pointer: look again on the next poll
    if published is None or published.version <= max(done):
        return None
    step = policy_step(cfg, published)
    scored_steps = [int(r["step"]) for r in rows if _score(r) is not None and isinstance(r.get("step"), int)]
    last = max(scored_steps, default=0)
    if step < last + cfg.training.eval_interval:
        return None
    return PublishedPolicy(published.version, published.path, step)


@dataclass(frozen=True)
class UserDue:
    """A simulated user's adapter version that is due for evaluation on its own persona."""

    user: str
    persona: Persona
    policy: PublishedPolicy


def due_user_policies(cfg: Config) -> list[UserDue]:
    """per_user mode: each simulated user whose newest published adapter is newer than the last one
    evaluated for them by at least ``eval_interval`` updates (a version is published every
    ``weight_sync_interval`` of the user's updates), in user order. Real users have no held-out
    persona and are not evaluated here."""
    from openclaw_rl.envs.loop import simulated_persona

    if cfg.users.mode != "per_user":
        return []
    rows = eval_rows(cfg.log_dir)
    run = RunDir.of(cfg)
    out: list[UserDue] = []
    for user in run.published_users():
        persona = simulated_persona(cfg, user)
        if persona is None:
            continue
        try:
            published = run.read_published_policy(user)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable pointer: look again on the next poll
        if published is None:
            continue
        done = [
            int(r["adapter_version"])
            for r in rows
            if r.get("user") == user and isinstance(r.get("adapter_version"), int)
        ]
        last = max(done, default=0)
        updates_since = (published.version - last) * cfg.policy_service.weight_sync_interval
        if published.version > last and updates_since >= cfg.training.eval_interval:
            out.append(UserDue(user, persona, published))
    return out


def pending_evaluation(cfg: Config) -> str | None:
    """What the evaluator still has to score (``version=N`` or ``user=U version=N``), or None."""
    due = due_policy(cfg)
    if due is not None:
        return f"version={due.version}"
    users = due_user_policies(cfg)
    return ", ".join(f"user={u.user} version={u.policy.version}" for u in users) or None


def base_persona_score(rows: list[dict[str, Any]], persona: str) -> float | None:
    """The base policy's score on one persona (its ``score_<persona>``)."""
    for r in rows:
        value = r.get(f"score_{persona}")
        if r.get("policy_version") == BASE_VERSION and isinstance(value, int | float):
            return float(value)
    return None


@dataclass(frozen=True)
class EvalResult:
    """One finished evaluation, as written to ``metrics.jsonl``."""

    version: int
    step: int
    score: float
    scores: dict[str, float]
    base_score: float | None
    user: str | None = None  # per_user: the simulated user whose adapter this was

    def line(self) -> str:
        base = (
            "base"
            if self.version == BASE_VERSION
            else ("base n/a" if self.base_score is None else f"base {self.base_score:.2f}")
        )
        who = f" user={self.user}" if self.user is not None else ""
        return f"[eval]{who} version={self.version} step={self.step} score={self.score:.2f} ({base})"


class EvalLoop:
    """Owns the private policy service and the metrics sink; start / run / stop lifecycle."""

    def __init__(
        self,
        cfg: Config,
        sizes: EvalSizes | None = None,
        poll_s: float = POLL_S,
        tensorboard: bool = True,
        concurrency: int = EVAL_CONCURRENCY,
    ):
        from openclaw_rl.launcher.evaluate import EvalSizes

        self.cfg = cfg
        self.sizes = sizes or EvalSizes(
            chat=cfg.training.eval_size, terminal=0, tool_call=0, max_tokens=EVAL_MAX_TOKENS
        )
        self.poll_s = poll_s
        self.concurrency = concurrency
        self._tensorboard = tensorboard
        self._stop = threading.Event()
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.service: Any = None
        self.ecfg: Config | None = None
        self.url = ""
        self.metrics: MetricsWriter | None = None
        self.loaded_version = BASE_VERSION
        self.loaded_user: str | None = None  # per_user: whose adapter the private copy holds
        self.evaluated: list[EvalResult] = []

    def start(self) -> None:
        """Start the private policy service on the base weights."""
        from openclaw_rl.launcher.evaluate import private_service_config
        from openclaw_rl.policy.server import PolicyService

        self._tmp = tempfile.TemporaryDirectory(prefix="openclaw_live_eval_")
        self.ecfg = private_service_config(self.cfg, self._tmp.name)
        # per_user: the private copy serves one adapter at a time, merged into the base like a
        # shared policy version, so each user's adapter is scored exactly as it was trained
        self.ecfg.users.mode = "shared"
        self.service = PolicyService(self.ecfg)
        with contextlib.redirect_stdout(io.StringIO()):  # its "listening" line would read as the run's server
            self.url = self.service.start()
        self.metrics = MetricsWriter(
            self.cfg.log_dir, tensorboard=self._tensorboard, run_name=self.cfg.global_.run_name
        )
        personas = ", ".join(self.cfg.env_service.personas)
        print(
            f"[eval] live evaluation every {live_eval_every(self.cfg)} updates: "
            f"{self.sizes.chat} held-out problems per persona ({personas}), greedy, max_tokens="
            f"{self.sizes.max_tokens}, on a private copy of the policy",
            flush=True,
        )

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def run(self) -> int:
        """Evaluate what is due until :meth:`stop`; returns the exit code (0)."""
        try:
            while not self._stop.is_set():
                if self.run_once() is None:
                    self._stop.wait(self.poll_s)
        finally:
            self.close()
        return 0

    def _load_and_score(self, pub: PublishedPolicy, user: str | None, ecfg: Config) -> dict[str, Any] | None:
        """Put ``pub`` (``user``'s adapter, or a shared version) into the private copy unless it is
        there already, then run the held-out chat evaluation with ``ecfg``. None when the weights
        would not load or the service refused a request (both recorded, never retried) or the loop
        is stopping (nothing written: it is due again after a restart)."""
        from openclaw_rl.envs.loop import PolicyRequestError
        from openclaw_rl.launcher.evaluate import evaluate

        assert self.service is not None
        if (self.loaded_user, self.loaded_version) != (user, pub.version):
            try:
                self.service.swap_weights(pub.path, pub.version)
            except Exception as exc:  # a broken export: record it, keep evaluating later ones
                self._record_failure(pub, f"loading the weights failed: {type(exc).__name__}: {exc}", user)
                return None
            self.loaded_version, self.loaded_user = pub.version, user
        try:
            return evaluate(
                ecfg, self.url, self.sizes, stop=self._stop, verbose=False, concurrency=self.concurrency
            )
        except PolicyRequestError as exc:  # a 4xx from the private service: retrying would repeat it
            self._record_failure(pub, str(exc), user)
            return None
        except RuntimeError:
            if self._stop.is_set():
                return None
            raise

    def run_once(self) -> EvalResult | None:
        """Evaluate the policy that is due, if any; None when nothing was (or the loop is stopping)."""

        assert self.service is not None and self.metrics is not None, "call start() first"
        assert self.ecfg is not None, "call start() first"  # start() sets it before the service
        due = due_policy(self.cfg)
        if due is None and not self._stop.is_set():
            users = due_user_policies(self.cfg)
            return self._evaluate_user(users[0]) if users else None
        if (
            due is None
            or self._stop.is_set()
            or any(r.version == due.version and r.user is None for r in self.evaluated)
        ):
            return None
        if due.version == BASE_VERSION and (self.loaded_user, self.loaded_version) != (None, BASE_VERSION):
            return None  # unreachable: the base is due first, and is evaluated before any swap
        started = time.monotonic()
        summary = self._load_and_score(due, None, self.ecfg)
        if summary is None:
            return None
        chat = summary.get("chat", {})
        scores = {p: float(v["personalization"]) for p, v in chat.items()}
        score = sum(scores.values()) / max(1, len(scores))
        base = score if due.version == BASE_VERSION else base_score(eval_rows(self.cfg.log_dir))
        result = EvalResult(due.version, due.step or 0, score, scores, base)
        values: dict[str, Any] = {
            "policy_version": due.version,
            "score": score,
            "base_score": base,
            **{f"score_{p}": s for p, s in scores.items()},
            **{f"looping_{p}": float(v["looping"]) for p, v in chat.items()},
            "n_per_persona": max((int(v["n"]) for v in chat.values()), default=0),
            "elapsed_s": round(time.monotonic() - started, 1),
        }
        self.metrics.write(result.step, values, kind="eval")
        self.evaluated.append(result)
        print(result.line(), flush=True)
        return result

    def _evaluate_user(self, due: UserDue) -> EvalResult | None:
        """Score one simulated user's adapter on that user's persona (see the module docstring)."""

        assert self.service is not None and self.metrics is not None and self.ecfg is not None
        pub = due.policy
        step = policy_step(self.cfg, pub)
        ecfg = self.ecfg.model_copy(deep=True)
        ecfg.env_service.personas = [due.persona]
        started = time.monotonic()
        summary = self._load_and_score(pub, due.user, ecfg)
        if summary is None:
            return None
        chat = summary.get("chat", {}).get(due.persona)
        if chat is None:
            self._record_failure(pub, f"no chat score for persona {due.persona!r}", due.user)
            return None
        score = float(chat["personalization"])
        base = base_persona_score(eval_rows(self.cfg.log_dir), due.persona)
        result = EvalResult(pub.version, step, score, {due.persona: score}, base, user=due.user)
        values: dict[str, Any] = {
            "adapter_version": pub.version,
            "user_score": score,
            f"score_{due.persona}": score,
            f"looping_{due.persona}": float(chat["looping"]),
            "user_base_score": base,
            "n_per_persona": int(chat["n"]),
            "elapsed_s": round(time.monotonic() - started, 1),
        }
        self.metrics.write(step, values, kind="eval", user=due.user)
        self.evaluated.append(result)
        print(result.line(), flush=True)
        return result

    def _record_failure(self, due: PublishedPolicy, error: str, user: str | None = None) -> None:
        """A version that cannot be evaluated gets a row without a score: it is never retried."""
        assert self.metrics is not None, "call start() first"
        who = f" user={user}" if user is not None else ""
        print(f"[eval]{who} version={due.version} step={due.step} not evaluated: {error}", flush=True)
        key = "policy_version" if user is None else "adapter_version"
        self.metrics.write(due.step or 0, {key: due.version, "error": error[:500]}, kind="eval", user=user)


def main(argv: list[str] | None = None) -> int:
    from openclaw_rl.runtime.loop_main import loop_config, run_loop_body

    parser = argparse.ArgumentParser(prog="python -m openclaw_rl.launcher.eval_loop")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    cfg = loop_config(args.config)
    problem = live_eval_problem(cfg)
    if problem is not None:
        print(f"[eval] {problem}", flush=True)
        return 0
    # Lower priority than the loops it measures: on a machine with few cores, serving, judging and
    # training get the CPU first and the evaluation takes what is left. It is a measurement; it must
    # not slow down (and so change) the run it measures.
    os.nice(10)
    # At most half the cores: torch's intra-op threads spin at their barriers, so an evaluator with a
    # thread on every core would still take cycles from the loops whenever it runs; with half it
    # cannot touch the other half at all.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))

    def body() -> int:
        loop = EvalLoop(cfg)
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        signal.signal(signal.SIGINT, lambda *_: loop.stop())
        try:
            loop.start()
        except BaseException:
            loop.close()
            raise
        return loop.run()

    return run_loop_body("evaluator", body, cfg.log_dir)


if __name__ == "__main__":
    sys.exit(main())
