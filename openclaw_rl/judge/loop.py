"""The judge service loop: store → judge → samples, off the request path.

The policy service only *records* turns; this loop polls the durable store for turns whose next
state has arrived, leases up to ``num_workers`` of them (``store.claim_turns(worker_id, ...)``),
judges them concurrently, and saves each judgement next to its turn together with the samples its
rules derive from it (:func:`openclaw_rl.judge.sample_rules.build_samples`, advantages against the
running baseline it keeps in the store) in one commit. Done sessions whose judged turns produced
nothing get their at-least-one sample (:func:`guarantee_sample`). Turns of an environment's episode
group are judged the same way but their samples wait for the group: once every member is done and
judged, :func:`group_samples` makes them with group-relative advantages.

Signal health goes to the store's ``signal`` counters (judged turns, turns with a usable hint,
groups, groups whose advantages were all zero, sums of group reward means and spreads); the
training loop turns them into metrics.

Several services may judge one store at once (several processes, or the Ray judge actors of cluster
mode), each under its own stable ``worker_id``: the store's per-turn lease gives every turn to one
judge; a judge whose lease ran out before it saved finds its save refused (another judge took the
turn over) and drops that result. A service frees the leases left by an earlier run under its id
when it starts, so a restarted judge does not wait :data:`JUDGE_LEASE_S` for its own turns.

Outages: a failed judgement (API down, key refused, rate limit after retries) is stored as an error
with a retry time — the turn stays in the store and is judged again later; it is never saved as a
score. While the judge is failing the loop also backs off (``retry_interval_sec``) instead of
hammering the endpoint.

Run it in-process (``JudgeLoop(cfg, store).start()`` … ``stop()``) or as its own process::

    python -m openclaw_rl.judge.loop --config config.toml [--worker-id judge-1]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sqlite3
import threading

from openclaw_rl.config import Config, launched_by_launcher
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.base import Judge
from openclaw_rl.judge.prompts import shortened
from openclaw_rl.judge.sample_rules import (
    Episode,
    RunningBaseline,
    build_samples,
    group_samples,
    group_truth_counts,
    guarantee_sample,
    truth_counts,
)
from openclaw_rl.runtime.loop_main import event_lines, loop_config, run_loop_body
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import BASELINE_META, GROUP_QUIET_S, SIGNAL_META, Store
from openclaw_rl.types import JudgeResult, Turn

log = logging.getLogger("openclaw_rl.judge")

#: Seconds between polls of an idle store.
POLL_INTERVAL_S = 0.2

#: Least lease a judge takes on a turn. A lease must outlast the slowest judgement that is still
#: alive: if it runs out first, another judge takes the turn and the first one's API calls are
#: wasted (safe — its save is refused — but paid for twice). The cost of a long lease is small: it
#: only delays a turn whose judge died *and* is not restarted under the same id (a restarted one
#: frees its leases at once). With the default API settings one call may take
#: timeout 60 s × (1 + 3 retries) = 240 s, and a judgement is two such phases in a row (votes and
#: hint votes together, then teacher log-probs): 480 s, plus a quarter for retry back-off and local
#: work = 600 s. Slower ``[api]`` settings lengthen the lease (:func:`lease_seconds`).
JUDGE_LEASE_S = 600.0


def lease_seconds(cfg: Config) -> float:
    """The lease a judge takes per turn: :data:`JUDGE_LEASE_S`, or more when ``[api]`` lets a call
    take longer: 2.5 × ``timeout_sec × (max_retries + 1)`` (two phases at their full retry budget,
    plus a quarter of headroom)."""
    api = cfg.api
    return max(JUDGE_LEASE_S, 2.5 * api.timeout_sec * (api.max_retries + 1))


class JudgeLoop:
    """Polls the store and judges turns; never on the request path."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        judge: Judge | None = None,
        worker_id: str = "judge-0",
        lease_s: float | None = None,
        group_quiet_s: float = GROUP_QUIET_S,
    ):
        """``worker_id`` names this judge in the store's leases; it must be unique among the judges
        running at one time and stable across restarts of the same judge (its old leases are freed
        at start). ``lease_s`` defaults to :func:`lease_seconds`. ``group_quiet_s``: how long a group
        with unfinished members waits before it is made from the members that finished."""
        if not worker_id or not worker_id.strip():
            raise ValueError("JudgeLoop: worker_id must be a non-empty name, e.g. 'judge-0'")
        self.cfg = cfg
        self.store = store
        self._judge = judge
        self.worker_id = worker_id
        self.lease_s = lease_seconds(cfg) if lease_s is None else lease_s
        if self.lease_s <= 0:
            raise ValueError(f"JudgeLoop: lease_s must be > 0, got {self.lease_s}")
        self._released = False
        # the run's judged turns, shown in the [rollout] lines: counted from the store, so a restarted
        # run goes on from where it was, as the progress line's counters do
        self.step = store.counters().judged
        self.failures = 0
        self.taken_over = 0  # judgements dropped because another judge had taken the turn over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.group_quiet_s = group_quiet_s
        self.baseline = RunningBaseline.from_dict(
            store.get_meta(BASELINE_META), cfg.training.baseline_momentum
        )

    @property
    def judge(self) -> Judge:
        """The judge, built on first use (the minilm head trains at set-up)."""
        if self._judge is None:
            self._judge = make_judge(self.cfg)
        return self._judge

    def start_line(self) -> str:
        p = self.cfg.prm_service
        return (
            f"[prm_service] backend={p.backend}, vote_count={p.vote_count}, "
            f"extract_instruction={str(p.extract_instruction).lower()}"
        )

    # ------------------------------------------------------------------ one round
    async def _judge_one(self, turn: Turn) -> JudgeResult:
        try:
            result = await self.judge.judge(turn, await self._earlier_hints(turn))
        except Exception as exc:  # a bug or bad turn must not kill the loop; the turn is retried
            log.exception("[prm_service] judging turn %s raised", turn.key)
            result = JudgeResult(error=f"judge raised {type(exc).__name__}: {exc}")
        grouped = await asyncio.to_thread(self.store.session_group, turn.session_id) is not None
        samples = []
        if result.ok and not grouped:  # a group's samples are made when the whole group is judged
            samples = build_samples(
                turn, result, self.cfg.training, self.baseline, self.cfg.env_service.reward
            )
        applied = await asyncio.to_thread(
            self.store.save_judgement,
            turn,
            result,
            samples,
            self.cfg.prm_service.retry_interval_sec,
            self.worker_id,
        )
        if applied and result.ok:
            hinted = int(result.hint is not None and result.teacher_logprobs is not None)
            counts: dict[str, float] = {"judged": 1, "hinted": hinted}
            if not grouped:  # a group's turns are compared with each other once it is complete
                counts.update(truth_counts([turn], {turn.turn_index: result}))
            await asyncio.to_thread(self.store.add_to_meta, SIGNAL_META, counts)
            if samples and not grouped:
                await asyncio.to_thread(self.store.set_meta, BASELINE_META, self.baseline.to_dict())
        if not applied:
            # Our lease ran out and another judge took the turn (or already saved it): its result
            # stands, ours is dropped so that the turn is judged — and trained on — once.
            self.taken_over += 1
            log.warning(
                "[prm_service] %s: turn %s was taken over by another judge after this one's lease "
                "(%gs) ran out; dropping this judgement",
                self.worker_id,
                turn.key,
                self.lease_s,
            )
            return result
        if result.ok:
            self.step += 1
            log.info(
                "[rollout] step=%d reward=%d instruction_extracted=%s",
                self.step,
                result.score,
                str(result.hint is not None).lower(),
            )
            if result.teacher_logprobs is not None:
                log.info(
                    "[opd] token_level_advantage applied, teacher_context_len=%d", result.teacher_context_len
                )
            if result.votes and all(v.score is None for v in result.votes):
                # the rule (no valid vote gives 0) stands; a judge model that never writes a
                # readable answer must not pass for one that finds no evidence
                log.warning(
                    "[prm_service] turn %s: none of its %d votes had a readable answer (scored 0); "
                    "the first said %r: is [prm_service] model one that follows the judge prompt?",
                    turn.key,
                    len(result.votes),
                    shortened(" ".join(result.votes[0].raw.split()), 120),
                )
        else:
            self.failures += 1
            self.last_error = result.error
            log.warning(
                "[prm_service] judging turn %s failed, will retry in %gs: %s",
                turn.key,
                self.cfg.prm_service.retry_interval_sec,
                result.error,
            )
        return result

    async def _earlier_hints(self, turn: Turn) -> list[str]:
        """What ``turn``'s user asked for in earlier replies, for the teacher (``hint_memory``);
        none when OPD is off or the turn's next state is not the user's."""
        memory = self.cfg.prm_service.hint_memory
        state = turn.next_state
        if memory == 0 or not self.cfg.training.opd_enabled or state is None or state.role != "user":
            return []
        return await asyncio.to_thread(self.store.recent_user_hints, turn.user, memory)

    def _guarantees(self) -> int:
        done = 0
        for sid in self.store.sessions_needing_guarantee():
            turns, results = self.store.judged_turns(sid)
            sample = guarantee_sample(turns, results, self.cfg.training)
            if not self.store.apply_guarantee(sid, sample):
                continue  # another judge applied it first
            done += 1
            if sample is not None:
                log.info(
                    "[prm_service] session %s: at-least-one sample kept (turn %d)", sid, sample.turn_index
                )
        return done

    def _groups(self) -> int:
        """Make the samples of every group whose members are all done and judged."""
        done = 0
        closed = self.store.close_quiet_groups(self.group_quiet_s)
        if closed:
            log.info(
                "[prm_service] %d episode(s) quiet for %.0fs closed: their judged turns count",
                closed,
                self.group_quiet_s,
            )
        for group_id in self.store.groups_ready(self.group_quiet_s):
            episodes = []
            for sid, outcome in self.store.group_episodes(group_id):
                turns, results = self.store.judged_turns(sid)
                episodes.append(Episode(sid, [t for t in turns if t.turn_index in results], results, outcome))
            samples, stats = group_samples(
                group_id, episodes, self.cfg.training, self.cfg.env_service.reward, self.baseline
            )
            if not self.store.apply_group(group_id, samples):
                continue  # another judge made them first
            done += 1
            self.store.add_to_meta(
                SIGNAL_META,
                {
                    "groups": 1,
                    "groups_zero_advantage": int(stats.zero_advantage),
                    "group_reward_mean_sum": stats.reward_mean,
                    "group_reward_spread_sum": stats.reward_spread,
                    **group_truth_counts(episodes),
                },
            )
            log.info(
                "[prm_service] group %s: %d episodes, reward mean=%.3f spread=%.3f, %d samples%s",
                group_id,
                stats.episodes,
                stats.reward_mean,
                stats.reward_spread,
                len(samples),
                " (all advantages zero)" if stats.zero_advantage else "",
            )
        return done

    def release_stale_claims(self) -> int:
        """Free the leases an earlier run under this ``worker_id`` left (done once, at start)."""
        freed = self.store.release_claims(self.worker_id)
        self._released = True
        if freed:
            log.info(
                "[prm_service] %s: freed %d turn(s) left leased by its previous run", self.worker_id, freed
            )
        return freed

    async def run_once(self) -> list[JudgeResult]:
        """Lease and judge one batch of due turns (up to ``num_workers`` at once), apply guarantees.

        The results include judgements dropped because another judge had taken their turn over
        (counted in :attr:`taken_over`)."""
        if not self._released:
            await asyncio.to_thread(self.release_stale_claims)
        turns = await asyncio.to_thread(
            self.store.claim_turns, self.worker_id, self.cfg.prm_service.num_workers, self.lease_s
        )
        results = list(await asyncio.gather(*(self._judge_one(t) for t in turns))) if turns else []
        await asyncio.to_thread(self._guarantees)
        await asyncio.to_thread(self._groups)
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
                try:
                    results = await self.run_once()
                except sqlite3.OperationalError as exc:
                    # The store stayed locked past its busy timeout (another process holding a long
                    # write): the leased turns come back when their lease ends, so wait and go on
                    # rather than end the service.
                    log.warning("[prm_service] the store is busy (%s); retrying", exc)
                    await asyncio.to_thread(self._stop.wait, self.cfg.prm_service.retry_interval_sec)
                    continue
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
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.run()), name="judge-service", daemon=True
        )
        self._thread.start()

    def stop_soon(self) -> None:
        """Ask the loop to finish its current round and return (safe from a signal handler)."""
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the loop to finish its current round and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def main(config_path: str, worker_id: str = "judge-0") -> int:
    """Run the judge service as its own process until interrupted."""
    event_lines()
    cfg = loop_config(config_path)

    def body() -> int:
        store = Store(RunDir.of(cfg).store, create=not launched_by_launcher())
        loop = JudgeLoop(cfg, store, worker_id=worker_id)
        # Ctrl-C / SIGTERM end the loop after its current round, like the other loops: a
        # KeyboardInterrupt raised mid-round would cancel it while store calls run on threads.
        signal.signal(signal.SIGINT, lambda *_: loop.stop_soon())
        signal.signal(signal.SIGTERM, lambda *_: loop.stop_soon())
        try:
            asyncio.run(loop.run())
        finally:
            store.close()
        return 0

    return run_loop_body("prm_service", body, cfg.log_dir)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m openclaw_rl.judge.loop", description="run the judge loop")
    ap.add_argument("--config", required=True, help="path to config.toml")
    ap.add_argument(
        "--worker-id",
        default="judge-0",
        help="this judge's name in the store's turn leases; unique per judge running at once, "
        "the same across restarts (default judge-0)",
    )
    args = ap.parse_args()
    raise SystemExit(main(args.config, args.worker_id))
