"""Engine replicas on a Ray cluster behind the one policy endpoint (``[policy_service] num_engines``).

One engine decodes one batch at a time; past a point, more users need more engines. With
``num_engines = N`` (cluster mode), the policy service process keeps everything it owns — the HTTP
routes, sessions, next states, recording into the store — and only the *decoding* moves into N
:class:`EngineReplica` Ray actors, spread over the nodes, each reserving ``engine_num_cpus`` /
``engine_num_gpus`` and running the ordinary :class:`~openclaw_rl.policy.transformers_engine.TransformersEngine`
with its continuous batching. :class:`ReplicatedEngine` is the router: it is an
:class:`~openclaw_rl.policy.engine.Engine` like any other, so serving does not know the difference.

Routing — why sessions stick. A session's turns go to the replica that served its first turn:

* each turn's prompt extends the previous one, so a replica that keeps prefix state (KV reuse, as
  SGLang's radix cache does) serves the session far cheaper than a cold one;
* during a weight swap replicas apply the new version at slightly different moments; keeping a
  session on one replica means its turns never step back to an older version mid-conversation.

A *new* session goes to the replica with the fewest requests in flight (ties: fewest sessions),
so load spreads as sessions arrive. The affinity table is bounded (least recently used sessions are
forgotten first; a forgotten session is simply placed again).

Faults. Replicas are created with ``max_restarts=-1``: when one dies (its node lost, OOM), Ray starts
it again on a live node. A request that finds its replica dead *before any token came back* is sent
to another replica and its session moves there (``failovers`` counts these); one that dies mid-answer
fails with a 503, which the serving layer records as a next state only, as for any engine error. A
restarted replica comes back with the base weights, so it is given the current weights again before
it takes new sessions.

Weight swaps go to every live replica at once (each applies them at its own step boundary, as the
local engine does); the path must be readable on every node (a shared filesystem, like the store).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.policy.engine import Delta, Engine, Final, GenRequest
from openclaw_rl.policy.protocol import APIError
from openclaw_rl.policy.transformers_engine import TransformersEngine
from openclaw_rl.policy.weights import WeightLoadError

log = logging.getLogger("openclaw_rl.policy")

#: Sessions whose replica is remembered; older ones are forgotten first (and placed again if they return).
MAX_AFFINITY = 100_000
#: Seconds between pings of a replica that died, until Ray has restarted it.
REVIVE_PING_S = 1.0
#: How long start() waits for every replica to load its model.
READY_TIMEOUT_S = 600.0


class EngineReplica:
    """One engine inside a Ray actor (an async actor: ``generate`` streams from its event loop).

    The streaming call the router makes::

        refs = replica.generate.options(num_returns="streaming").remote(req)
        async for ref in refs:
            event = await ref          # a Delta, then a Final
    """

    def __init__(self, cfg: Config, index: int):
        local = cfg.model_copy(deep=True)
        local.policy_service.num_engines = 1
        self.index = index
        self.engine = TransformersEngine(local)
        self.engine.start()
        self.sessions: OrderedDict[str, int] = OrderedDict()  # session id -> requests served here
        self.requests = 0

    async def ready(self) -> dict[str, Any]:
        """Answers once the model is loaded; says where the replica runs and what it serves."""
        import ray

        return {
            "index": self.index,
            "node": ray.get_runtime_context().get_node_id(),
            "policy_version": self.engine.policy_version,
            "requests": self.requests,
            "decoding": self.engine.active_count,  # rows in its running batch now
            "cancelled": self.engine.cancelled_rows,  # rows dropped because their client went away
        }

    async def generate(self, req: GenRequest) -> AsyncGenerator[Delta | Final, None]:
        """Stream one generation's events (``req.prompt_ids`` already set by the router)."""
        self.requests += 1
        if req.session_id is not None:
            self.sessions[req.session_id] = self.sessions.get(req.session_id, 0) + 1
            self.sessions.move_to_end(req.session_id)
            if len(self.sessions) > MAX_AFFINITY:
                self.sessions.popitem(last=False)
        async for event in self.engine.generate(req):
            yield event

    async def served_sessions(self) -> dict[str, int]:
        """Session id → requests this replica generated for it (observability and tests)."""
        return dict(self.sessions)

    async def swap_weights(self, path: str, version: int) -> int:
        """Apply the weights at ``path`` as ``version`` at the next step boundary (blocking off-loop)."""
        await asyncio.to_thread(self.engine.swap_weights, path, version)
        return version

    async def stop(self) -> None:
        """Finish in-flight requests and end the engine thread."""
        await asyncio.to_thread(self.engine.stop)


class ReplicatedEngine(Engine):
    """The router: ``num_engines`` :class:`EngineReplica` actors behind one :class:`Engine`.

    Usage (the policy service builds it from the config; nothing else changes)::

        engine = ReplicatedEngine(cfg)      # cfg.policy_service.num_engines = 2, cluster mode
        engine.start()                      # joins [global] ray_address, places and loads replicas
        async for event in engine.generate(req): ...
        engine.swap_weights(path, version)  # every replica
        engine.stop()
    """

    backend = "transformers"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.pcfg = cfg.policy_service
        self.n = self.pcfg.num_engines
        self.replicas: list[Any] = []
        self.nodes: list[str] = []
        self.affinity: OrderedDict[str, int] = OrderedDict()
        self.sessions_on = [0] * self.n  # sessions currently remembered per replica
        self.in_flight = [0] * self.n
        self.down: set[int] = set()
        self.failovers = 0
        self._weights: tuple[str, int] | None = None  # the newest swap, re-applied to restarted replicas
        self._reviving: dict[int, asyncio.Task[None]] = {}
        self._ray: Any = None

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Join the cluster, place the replicas (SPREAD over nodes) and wait until all are loaded."""
        from openclaw_rl.runtime.models import load_tokenizer
        from openclaw_rl.runtime.ray_cluster import connect

        self._ray = ray = connect(self.cfg.global_.ray_address)
        self.tokenizer = load_tokenizer(self.pcfg.model)  # prompts are tokenised here, once
        actor = ray.remote(EngineReplica)
        # max_task_retries=0: a generation in flight on a dead replica fails instead of being
        # re-run blindly; the router decides (fail over before the first token, 503 after it).
        self.replicas = [
            actor.options(
                num_cpus=self.pcfg.engine_num_cpus,
                num_gpus=self.pcfg.engine_num_gpus,
                scheduling_strategy="SPREAD",
                max_restarts=-1,
                max_task_retries=0,
                max_concurrency=max(1000, 4 * self.pcfg.max_concurrent),
            ).remote(self.cfg.with_absolute_paths(), i)
            for i in range(self.n)
        ]
        infos = ray.get([r.ready.remote() for r in self.replicas], timeout=READY_TIMEOUT_S)
        self.nodes = [info["node"] for info in infos]
        log.info("[policy_service] %d engine replicas on %d node(s)", self.n, len(set(self.nodes)))

    def stop(self) -> None:
        """Let each replica finish its in-flight requests, then end the actors this engine created."""
        if self._ray is None:
            return
        from ray.exceptions import GetTimeoutError, RayActorError

        live = [r for i, r in enumerate(self.replicas) if i not in self.down]  # a down one may never answer
        try:
            self._ray.get([r.stop.remote() for r in live], timeout=self.pcfg.request_timeout_sec)
        except (RayActorError, GetTimeoutError) as exc:
            log.warning("[policy_service] an engine replica did not stop cleanly: %s", type(exc).__name__)
        for r in self.replicas:
            self._ray.kill(r, no_restart=True)
        self.replicas = []

    @property
    def active_count(self) -> int:
        """Requests generating on the replicas right now."""
        return sum(self.in_flight)

    def stats(self) -> dict[str, Any]:
        """What ``/healthz`` adds for a replicated engine."""
        return {
            "engines": self.n,
            "engines_down": len(self.down),
            "failovers": self.failovers,
            "sessions_per_engine": list(self.sessions_on),
        }

    # -------------------------------------------------------------- routing
    def replica_for(self, session_id: str) -> int:
        """The replica that serves ``session_id``: its own while it lives, else the least loaded."""
        idx = self.affinity.get(session_id)
        if idx is not None and idx not in self.down:
            self.affinity.move_to_end(session_id)
            return idx
        live = [i for i in range(self.n) if i not in self.down] or list(range(self.n))
        new = min(live, key=lambda i: (self.in_flight[i], self.sessions_on[i], i))
        if idx is not None:
            self.sessions_on[idx] -= 1
        elif len(self.affinity) >= MAX_AFFINITY:
            _, old = self.affinity.popitem(last=False)
            self.sessions_on[old] -= 1
        self.affinity[session_id] = new
        self.sessions_on[new] += 1
        return new

    async def generate(self, req: GenRequest) -> AsyncGenerator[Delta | Final, None]:
        from ray.exceptions import RayActorError, RayTaskError

        if req.prompt_ids is None:
            await asyncio.to_thread(self.prepare, req)
        for i in self.down - set(self._reviving):  # e.g. lost during a swap: bring it back
            self._mark_down(i)
        sid = req.session_id or f"anon-{uuid.uuid4().hex}"
        for attempt in range(2):
            i = self.replica_for(sid)
            self.in_flight[i] += 1
            started = finished = False
            stream = self.replicas[i].generate.options(num_returns="streaming").remote(req)
            try:
                async for ref in stream:
                    event = await ref
                    started = True
                    finished = isinstance(event, Final)
                    if isinstance(event, Final) and self._weights and event.policy_version < self._weights[1]:
                        self._mark_down(i)  # restarted silently with the base weights: resync it
                    yield event
                return
            except RayTaskError as exc:
                if isinstance(exc.cause, APIError):
                    raise exc.cause from None
                raise
            except RayActorError as exc:
                self._mark_down(i)
                if started or attempt == 1:
                    raise APIError(
                        503,
                        "the engine replica serving this session stopped mid-response; "
                        "send the request again",
                        type_="server_error",
                    ) from exc
                self.failovers += 1
                log.warning(
                    "[policy_service] engine replica %d is down (%s); session %s moves to another",
                    i,
                    type(exc).__name__,
                    sid,
                )
            finally:
                self.in_flight[i] -= 1
                if not finished:  # its reader went away (the client hung up) or it failed: stop decoding it
                    _cancel(stream)

    def _mark_down(self, i: int) -> None:
        """Take replica ``i`` out of routing until it answers again (with the current weights)."""
        self.down.add(i)
        if i not in self._reviving:
            self._reviving[i] = asyncio.get_running_loop().create_task(self._revive(i))

    async def _revive(self, i: int) -> None:
        """Ping replica ``i`` until Ray has restarted it, give it the newest weights, route to it again."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            while True:
                try:
                    info = await self.replicas[i].ready.remote()
                    if self._weights is not None and info["policy_version"] != self._weights[1]:
                        await self.replicas[i].swap_weights.remote(*self._weights)
                    self.nodes[i] = info["node"]
                    break
                except (RayActorError, RayTaskError) as exc:
                    log.info("[policy_service] engine replica %d not back yet (%s)", i, type(exc).__name__)
                    await asyncio.sleep(REVIVE_PING_S)
            self.down.discard(i)
            log.info("[policy_service] engine replica %d is serving again", i)
        finally:
            self._reviving.pop(i, None)

    # -------------------------------------------------------------- weights
    def swap_weights(self, path: str | Path, version: int) -> None:
        """Apply ``path`` on every live replica; one that is down gets it when it comes back."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        self._weights = (str(path), version)
        live = [i for i in range(self.n) if i not in self.down]
        refs = {i: self.replicas[i].swap_weights.remote(str(path), version) for i in live}
        deadline = time.monotonic() + 2 * self.pcfg.request_timeout_sec
        for i, ref in refs.items():
            try:
                self._ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except RayTaskError as exc:
                raise WeightLoadError(
                    f"engine replica {i} refused the weights at {path}: {exc.cause}"
                ) from None
            except GetTimeoutError:
                raise TimeoutError(
                    f"engine replica {i} did not apply the weights within "
                    f"{2 * self.pcfg.request_timeout_sec:.0f}s"
                ) from None
            except RayActorError:
                log.warning(
                    "[policy_service] engine replica %d died during a swap; it gets version %d when "
                    "it is back",
                    i,
                    version,
                )
                self.down.add(i)  # the next request that reaches it starts its revival
        self._version = version


def _cancel(stream: Any) -> None:
    """Cancel a replica's streaming generation: Ray raises CancelledError inside the actor's
    ``generate``, whose engine then drops the row at its next step."""
    import ray

    try:
        ray.cancel(stream)
    except Exception as exc:  # a replica already gone has nothing left to cancel (Ray raises several kinds)
        log.info("[policy_service] cancelling an abandoned replica generation: %s", exc)
