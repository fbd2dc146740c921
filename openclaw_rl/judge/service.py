"""The judge service loop: store → judge → samples, off the request path (SPEC §3 loop 3).

The policy service only *records* turns; this loop polls the durable store for turns whose next
state has arrived (``store.turns_to_judge()``), judges up to ``num_workers`` of them concurrently, and
saves each judgement next to its turn together with the samples SPEC §1 derives from it
(:func:`openclaw_rl.runtime.samples.build_samples`) in one commit. Done sessions whose judged turns
produced nothing get their at-least-one sample (:func:`guarantee_sample`).

Outages: a failed judgement (API down, key refused, rate limit after retries) is stored as an error
with a retry time — the turn stays in the store and is judged again later; it is never saved as a
score. While the judge is failing the loop also backs off (``retry_interval_sec``) instead of
hammering the endpoint.

Run it in-process (``JudgeService(cfg, store).start()`` … ``stop()``) or as its own process::

    python -m openclaw_rl.judge.service --config config.toml
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
from pathlib import Path

from openclaw_rl.config import Config, ConfigError, load_config, print_warnings
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.base import Judge
from openclaw_rl.runtime.samples import build_samples, guarantee_sample
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import JudgeResult, Turn

log = logging.getLogger("openclaw_rl.judge")

#: Seconds between polls of an idle store.
POLL_INTERVAL_S = 0.2


def store_path(cfg: Config) -> Path:
    """Where the run's durable store lives: ``<log_dir>/store.sqlite``."""
    return cfg.log_dir / "store.sqlite"


class JudgeService:
    """Polls the store and judges turns; never on the request path."""

    def __init__(self, cfg: Config, store: Store, judge: Judge | None = None):
        self.cfg = cfg
        self.store = store
        self._judge = judge
        self.step = 0  # judged turns since start, shown in the [rollout] lines
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    @property
    def judge(self) -> Judge:
        """The judge, built on first use (the minilm head trains at set-up)."""
        if self._judge is None:
            self._judge = make_judge(self.cfg)
        return self._judge

    def start_line(self) -> str:
        p = self.cfg.prm_service
        return (f"[prm_service] backend={p.backend}, vote_count={p.vote_count}, "
                f"extract_instruction={str(p.extract_instruction).lower()}")

    # ------------------------------------------------------------------ one round
    async def _judge_one(self, turn: Turn) -> JudgeResult:
        try:
            result = await self.judge.judge(turn)
        except Exception as exc:  # a bug or bad turn must not kill the loop; the turn is retried
            log.exception("[prm_service] judging turn %s raised", turn.key)
            result = JudgeResult(error=f"judge raised {type(exc).__name__}: {exc}")
        if result.ok:
            samples = build_samples(turn, result, self.cfg.training)
        else:
            samples = []
        self.store.save_judgement(turn, result, samples, retry_after_s=self.cfg.prm_service.retry_interval_sec)
        if result.ok:
            self.step += 1
            log.info("[rollout] step=%d reward=%d instruction_extracted=%s", self.step, result.score,
                     str(result.hint is not None).lower())
            if result.teacher_logprobs is not None:
                log.info("[opd] token_level_advantage applied, teacher_context_len=%d", result.teacher_context_len)
        else:
            self.failures += 1
            self.last_error = result.error
            log.warning("[prm_service] judging turn %s failed, will retry in %gs: %s", turn.key,
                        self.cfg.prm_service.retry_interval_sec, result.error)
        return result

    def _guarantees(self) -> int:
        done = 0
        for sid in self.store.sessions_needing_guarantee():
            turns = self.store.session_turns(sid)
            results = {}
            for t in turns:
                j = self.store.judgement(sid, t.turn_index)
                if j is not None and j.ok and self.store.turn_status(sid, t.turn_index) == "judged":
                    results[t.turn_index] = j
            sample = guarantee_sample(turns, results, self.cfg.training)
            self.store.apply_guarantee(sid, sample)
            done += 1
            if sample is not None:
                log.info("[prm_service] session %s: at-least-one sample kept (turn %d)", sid, sample.turn_index)
        return done

    async def run_once(self) -> list[JudgeResult]:
        """Judge one batch of due turns (up to ``num_workers`` at once) and apply guarantees."""
        turns = self.store.turns_to_judge(limit=self.cfg.prm_service.num_workers)
        results = list(await asyncio.gather(*(self._judge_one(t) for t in turns))) if turns else []
        await asyncio.to_thread(self._guarantees)
        return results

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Loop until :meth:`stop`; an all-failed round pauses for ``retry_interval_sec``."""
        log.info(self.start_line())
        try:
            # Build the judge before the first turn: a setup mistake (no model, empty base_url)
            # stops the service with its message instead of failing every turn forever.
            await asyncio.to_thread(lambda: self.judge)
        except Exception:
            log.exception("[prm_service] the judge could not be set up")
            raise
        try:
            while not self._stop.is_set():
                results = await self.run_once()
                if results and all(not r.ok for r in results):
                    wait = self.cfg.prm_service.retry_interval_sec  # outage: pause, do not hammer
                elif results:
                    continue  # more may be waiting
                else:
                    wait = POLL_INTERVAL_S
                await asyncio.to_thread(self._stop.wait, wait)
        finally:
            if self._judge is not None:
                await self._judge.close()

    def start(self) -> None:
        """Run the loop in a background thread with its own event loop."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="judge-service",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the loop to finish its current round and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def main(config_path: str) -> int:
    """Run the judge service as its own process until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print_warnings(cfg)
    store = Store(store_path(cfg))
    service = JudgeService(cfg, store)
    try:
        asyncio.run(service.run())
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # already logged with its traceback by run(); exit non-zero
        print(f"[prm_service] stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m openclaw_rl.judge.service", description="run the judge loop")
    ap.add_argument("--config", required=True, help="path to config.toml")
    raise SystemExit(main(ap.parse_args().config))
