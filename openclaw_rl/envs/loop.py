"""The environment service: ``num_envs`` workers drive episodes against the policy service over HTTP.

Why over HTTP: the policy service learns from whatever talks to it; the environment service is just
one more client, exactly like OpenClaw or any OpenAI SDK user. Each request is a
real ``POST /v1/chat/completions`` with the session headers:

* ``X-Session-Id`` — one id per episode, so every turn of the episode lands in one session;
* ``X-Turn-Type: main`` — environment turns are main-line turns;
* ``X-Session-Done: true`` — on the episode's last request;
* ``Authorization: Bearer <key>`` — when ``[policy_service] api_key`` is set;
* ``X-Episode-Group`` / ``X-Episode-Group-Size`` — the group the episode is played in (below);
* ``X-Episode-Outcome`` — on the closing request of a terminal / tool_call / gui episode when
  ``[env_service] reward`` is ``outcome`` or ``both``: +1 solved, -1 not (or the environment's own
  ``info["outcome"]`` in [-1, 1]).

Groups: with ``group_size = G`` a worker draws a task (type, persona, seed) and plays it G times at
once, one thread and one environment instance per member, all reset with the same seed; the judge
loop then takes each member's rewards relative to the group's (``judge/sample_rules.py``). Episodes
in flight = ``num_envs x group_size``. Episodes played alone (G = 1) in judge mode carry no group
header: their turns are compared with a running baseline instead.

An episode: reset the environment, then repeatedly send the conversation, apply the reply to the
environment, and append the environment's next state (user / tool / terminal message). When the
episode ends, one closing request carries the final next state with ``X-Session-Done: true`` —
that is how the policy service learns the next state of the episode's last acting turn; the reply
to the closing request itself is the session's last turn and is never trained on.

``state_capture = false``: each episode is a single request sent with ``X-Session-Done: true`` and
the environment's next state is never sent back, so no turn gets a next state and nothing is
learned (config validation warns about it).

Back-pressure: before a worker starts a new episode (or group) it asks ``backlog()`` how many
samples wait for the trainer, adds the samples the episodes in flight may still add, and waits
while that is ``max_ready_samples`` or more (default twice the training batch). Rollouts far ahead
of the trainer would only go stale and be dropped, and on a shared CPU they take the cores the
trainer needs. The launcher's env loop reads the run's store; the trainer takes the newest policy
version's samples first (``Store.claim_samples``).

Faults: a policy service that is down, overloaded (429) or failing (5xx) makes the worker wait with
exponential backoff and retry the same request — workers never die of it. A request the service
refuses (other 4xx) ends that episode with an error in its stats. An exception inside an
environment is logged, the environment is rebuilt, and the worker goes on.

Episode stats (:class:`EpisodeStats`) go to ``on_episode`` callbacks and to the :attr:`EnvLoop.episodes`
queue for the launcher / benchmarks to consume.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from openclaw_rl.config import OUTCOME_REWARDS, Config, Persona
from openclaw_rl.envs.base import (
    Env,
    EnvContractError,
    EnvUnavailable,
    checked_reset,
    checked_step,
    import_env_modules,
    make,
)
from openclaw_rl.runtime.chat_stream import add_tool_call_deltas, read_error, tool_calls_in_order
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.secrets import without_key
from openclaw_rl.runtime.store import Store

log = logging.getLogger("openclaw_rl.env_service")

#: A safety net for an environment that never ends its episodes (its own bug): the loop ends one
#: after this many steps. The built-in environments end theirs within tens.
MAX_EPISODE_STEPS = 200


class PolicyRequestError(RuntimeError):
    """The policy service refused a request (a 4xx other than 429); ends the episode, not the worker.
    ``status``: the HTTP status, or None for a reply that was not the stream it should have been;
    ``code``: the error body's ``code``, when it had one."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def too_long(self) -> bool:
        """400 ``context_length_exceeded``: the conversation outgrew the policy's window."""
        return self.status == 400 and self.code == "context_length_exceeded"

    @property
    def refused_key(self) -> bool:
        """401 / 403: the service does not take this run's key; every next episode would meet it too."""
        return self.status in (401, 403)


@dataclass
class EpisodeStats:
    """The outcome of one episode, for logs, metrics and benchmarks."""

    worker: int
    interaction_type: str
    session_id: str
    success: bool
    reward: float
    turns: int
    elapsed_s: float
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def as_messages(observation: Any, info: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages an environment's ``reset`` / ``step`` adds to the conversation: its
    ``info["messages"]`` when it gives them (the built-in ones do, with system prompts and tool
    results), else the observation itself, as a list of messages or as the text of one message from
    the user (tool and environment output included: a tool message needs a call id)."""
    if "messages" in info:
        return [_encodable(m) for m in info["messages"]]
    if isinstance(observation, list):
        return [_encodable(m) for m in observation]
    return [{"role": "user", "content": _encodable(str(observation))}]


#: Lone surrogates: how Python spells bytes a file name or a program's output held that are not
#: UTF-8 (``os.listdir`` on ``bad\xff.txt``); no JSON request can carry them.
_SURROGATES = re.compile("[\ud800-\udfff]")


def _encodable(value: Any) -> Any:
    """``value`` (a message, or any text in it) with each lone surrogate shown as U+FFFD, the way
    the terminal shows bytes that are not UTF-8; otherwise the episode died in the HTTP client."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, dict):
        return {k: _encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    return value


def env_kwargs_for(
    cfg: Config, interaction_type: str, split: Literal["train", "eval"] = "train"
) -> dict[str, Any]:
    """The ``make()`` keyword arguments an interaction type gets from the config."""
    es = cfg.env_service
    kw: dict[str, Any] = {"max_turns": es.max_turns}
    if interaction_type in ("chat", "tool_call"):
        kw.update(split=split, data_path=es.data_path, eval_size=es.eval_size, config_source=cfg.source)
    elif interaction_type == "terminal":
        kw.update(split=split)
    return kw


class PolicyClient:
    """A plain HTTP client of the policy service's ``/v1/chat/completions`` with session headers."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        timeout_sec: float,
        stop_event: threading.Event,
        backoff_max_sec: float = 10.0,
    ):
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
        self.model = model
        self.stop_event = stop_event
        self.backoff_max = backoff_max_sec
        self._key = api_key or ""
        headers = {"X-Turn-Type": "main"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_sec, connect=5.0))
        self.retries = 0

    @classmethod
    def from_config(
        cls, cfg: Config, base_url: str, stop_event: threading.Event, backoff_max_sec: float = 10.0
    ) -> PolicyClient:
        """A client of the policy service at ``base_url`` with the config's model, key and timeout."""
        pol = cfg.policy_service
        key = RunDir.of(cfg).client_key(pol)  # api_key, or the key a public, keyless service generated
        return cls(base_url, pol.model, key, pol.request_timeout_sec, stop_event, backoff_max_sec)

    def complete(
        self,
        messages: list[dict[str, Any]],
        session_id: str,
        done: bool,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        extra_headers: dict[str, str] | None = None,
        user: str | None = None,
    ) -> dict[str, Any] | None:
        """The assistant message of one completion; None when the service is stopping. ``user``:
        the OpenAI ``user`` field (a simulated user, per_user mode).

        The reply is streamed, so that :attr:`stop_event` ends a request in flight within a token:
        the stream is closed, the service stops generating it and records nothing of it (a stop no
        longer waits up to ``request_timeout_sec`` for a long reply nobody will read).

        Unreachable / 429 / 5xx: wait and retry (backoff up to ``backoff_max_sec``) until it answers
        or :attr:`stop_event` is set. Other 4xx: :class:`PolicyRequestError`.
        """
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        if tools:
            body["tools"] = tools
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        if top_p is not None:
            body["top_p"] = top_p
        if user is not None:
            body["user"] = user
        headers = {
            "X-Session-Id": session_id,
            "X-Session-Done": "true" if done else "false",
            **(extra_headers or {}),
        }
        delay = 0.5
        warned = False
        while not self.stop_event.is_set():
            try:
                with self.http.stream("POST", self.url, json=body, headers=headers) as resp:
                    if resp.status_code == 200:
                        reply = _streamed_message(resp, self.stop_event)
                        if warned and reply is not None:
                            log.info("[env_service] policy service is back at %s", self.url)
                        return reply
                    # masked before it is cut, so no piece of the key is left
                    detail = without_key(resp.read().decode("utf-8", "replace"), self._key)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__} ({exc})"
            except _StreamFailed as exc:
                problem = str(exc)
            else:
                if resp.status_code != 429 and resp.status_code < 500:
                    raise PolicyRequestError(
                        f"policy service answered {resp.status_code}: {detail[:300]}",
                        resp.status_code,
                        read_error(detail).code,
                    )
                problem = f"HTTP {resp.status_code}"
            self.retries += 1
            if not warned:
                log.warning(
                    "[env_service] policy service at %s not available (%s); retrying with backoff",
                    self.url,
                    problem,
                )
                warned = True
            self.stop_event.wait(delay)
            delay = min(delay * 2, self.backoff_max)
        return None

    def close(self) -> None:
        self.http.close()


class _StreamFailed(Exception):
    """The service reported an error in the middle of a streamed reply (retried like a 5xx)."""


def _streamed_message(resp: httpx.Response, stop_event: threading.Event) -> dict[str, Any] | None:
    """The assistant message a chat-completions SSE stream adds up to; None if ``stop_event`` was
    set before it ended (the caller's ``with`` then closes the stream, which cancels it)."""
    if not resp.headers.get("content-type", "").startswith("text/event-stream"):
        raise PolicyRequestError(
            f"policy service answered a streamed request with {resp.headers.get('content-type')!r}, "
            "not an event stream: is the policy URL this service's?"
        )
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for line in resp.iter_lines():
        if stop_event.is_set():
            return None
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
            if "error" in chunk:
                raise _StreamFailed(f"error mid-stream: {str(chunk['error'])[:300]}")
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                add_tool_call_deltas(calls, delta.get("tool_calls"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PolicyRequestError(
                f"policy service sent a malformed stream chunk ({exc}): {data[:300]}"
            ) from None
    out: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        out["tool_calls"] = tool_calls_in_order(calls)
    return out


class EnvLoop:
    """``[env_service]`` in local mode: worker threads that drive episodes through the policy API.

    Usage::

        svc = EnvLoop(cfg, base_url="http://127.0.0.1:30000", on_episode=print)
        svc.start()          # returns at once; workers run on threads
        ...
        svc.stop()           # cancels the request in flight, closes envs

    ``run()`` does the same in the foreground until ``stop()`` (another thread or Ctrl-C) or until
    ``max_episodes`` episodes are done.
    """

    def __init__(
        self,
        cfg: Config,
        base_url: str | None = None,
        on_episode: Callable[[EpisodeStats], None] | None = None,
        max_episodes: int | None = None,
        max_tokens: int | None = None,
        final_max_tokens: int = 8,
        temperature: float | None = None,
        env_overrides: dict[str, dict[str, Any]] | None = None,
        backoff_max_sec: float = 10.0,
        backlog: Callable[[], int] | None = None,
    ):
        es = cfg.env_service
        if es.mode != "local":
            raise ValueError(
                f'[env_service] mode = {es.mode!r}: only "local" is built; the cluster mode is not'
            )
        if not es.interaction_types:
            raise ValueError(
                "[env_service] interaction_types is empty: name at least one of "
                "chat, terminal, gui, tool_call"
            )
        import_env_modules(es.env_modules, cfg.source)  # environments of the user's own, by name
        self.cfg = cfg
        pol = cfg.policy_service
        self.base_url = base_url or pol.local_url
        self.callbacks: list[Callable[[EpisodeStats], None]] = [on_episode] if on_episode else []
        self.episodes: queue.Queue[EpisodeStats] = queue.Queue()
        self.max_episodes = max_episodes
        self.max_tokens = max_tokens
        self.final_max_tokens = final_max_tokens
        # Rollouts sample like a deployed agent would: a small model at temperature 1 with no
        # nucleus cut mostly emits noise, and noise teaches the trainer nothing.
        self.temperature = es.temperature if temperature is None else temperature
        self.top_p = es.top_p
        self.env_overrides = env_overrides or {}
        self.backoff_max = backoff_max_sec
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.clients: list[PolicyClient] = []
        self._count_lock = threading.Lock()
        self.started_episodes = 0
        self.finished_episodes = 0
        self.disabled_types: set[str] = set()
        self._refused_streak: dict[int, int] = {}  # worker -> episodes in a row refused at once
        self.backlog = backlog
        limit = es.max_ready_samples
        self.max_backlog = 2 * cfg.training.batch_size if limit is None else limit
        self._backlog_lock = threading.Lock()
        self.backlog_waits = 0
        self.in_flight = 0  # episodes started and not finished (reserved by _wait_for_trainer)
        self._finished_turns = 0  # turns of the finished episodes: their mean sizes what is in flight

    @property
    def start_line(self) -> str:
        es = self.cfg.env_service
        return (
            f"[env_service] mode={es.mode}, num_envs={es.num_envs}, types=[{', '.join(es.interaction_types)}]"
        )

    # ---- lifecycle ----

    def start(self) -> None:
        """Print the start line and launch ``num_envs`` worker threads."""
        print(self.start_line, flush=True)
        if not self.cfg.env_service.state_capture:
            log.warning(
                "[env_service] state_capture = false: next states are not sent back; nothing is learned"
            )
        for i in range(self.cfg.env_service.num_envs):
            client = PolicyClient.from_config(self.cfg, self.base_url, self.stop_event, self.backoff_max)
            self.clients.append(client)
            t = threading.Thread(target=self._worker, args=(i, client), name=f"env-worker-{i}", daemon=True)
            self.threads.append(t)
            t.start()

    def run(self) -> None:
        """Start and block until :meth:`stop` is called or ``max_episodes`` are done."""
        self.start()
        try:
            while not self.stop_event.is_set() and any(t.is_alive() for t in self.threads):
                self.stop_event.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self, timeout: float | None = None) -> None:
        """Ask workers to finish; join them (a request in flight is cancelled at its next token)."""
        self.stop_event.set()
        wait = timeout if timeout is not None else self.cfg.policy_service.request_timeout_sec + 5
        for t in self.threads:
            t.join(timeout=wait)
        for c in self.clients:
            c.close()
        self.threads, self.clients = [], []

    def wait_episodes(self, n: int, timeout: float) -> list[EpisodeStats]:
        """Collect ``n`` episode stats from :attr:`episodes` (fewer if ``timeout`` passes)."""
        out: list[EpisodeStats] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                out.append(self.episodes.get(timeout=min(left, 0.5)))
            except queue.Empty:
                continue
        return out

    # ---- workers ----

    def _claim_episodes(self, n: int) -> int:
        """Claim up to ``n`` episodes of the ``max_episodes`` budget; returns how many."""
        with self._count_lock:
            if self.max_episodes is not None:
                n = min(n, self.max_episodes - self.started_episodes)
            n = max(n, 0)
            self.started_episodes += n
            return n

    def _make_env(self, itype: str, seed: int, persona: str | None = None) -> Env | None:
        kw = env_kwargs_for(self.cfg, itype)
        if itype == "chat":
            kw["persona"] = persona or self.cfg.env_service.personas[0]
            if self.cfg.env_service.user_mode == "llm":
                from openclaw_rl.envs.chat import make_user_writer

                kw.update(user_mode="llm", user_writer=make_user_writer(self.cfg))
        kw.update(self.env_overrides.get(itype, {}))
        try:
            return make(itype, seed=seed, **kw)
        except (KeyError, ImportError, EnvUnavailable) as exc:
            self._disable(itype, exc)
            return None

    def _disable(self, itype: str, why: BaseException) -> None:
        """Drop an interaction type that cannot run here (gui without its browser, a sandbox that
        cannot be built), with one error line, rather than fail every episode of it forever."""
        with self._count_lock:
            first = itype not in self.disabled_types
            self.disabled_types.add(itype)
        if first:
            log.error("[env_service] interaction type %r is unavailable (%s); skipping it", itype, why)

    def _worker(self, index: int, client: PolicyClient) -> None:
        rng = random.Random(self.cfg.global_.seed * 1000 + index)
        group_size = self.cfg.env_service.group_size
        # One env per (type, persona, group member), kept and reused; members share the worker's
        # client (httpx clients are thread-safe) and run on a small pool of threads.
        envs: dict[tuple[str, int], Env] = {}
        pool = (
            ThreadPoolExecutor(group_size, thread_name_prefix=f"env-worker-{index}-member")
            if group_size > 1
            else None
        )
        try:
            while not self.stop_event.is_set():
                types = [t for t in self.cfg.env_service.interaction_types if t not in self.disabled_types]
                if not types:
                    log.error("[env_service] worker %d: no interaction type is available; stopping", index)
                    return
                if not self._wait_for_trainer(group_size):
                    return
                try:
                    if not self._play_group(index, client, rng, envs, pool, types):
                        return
                except Exception:  # a bug outside an episode ends this group, not the worker
                    log.exception("[env_service] worker %d: a group of episodes failed", index)
                    self.stop_event.wait(1.0)  # not a tight loop of failures
                finally:
                    self._release(group_size)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
            for env in envs.values():
                try:
                    env.close()
                except Exception:  # closing is best effort; log and go on
                    log.exception("[env_service] worker %d: closing an environment failed", index)

    def _play_group(
        self,
        index: int,
        client: PolicyClient,
        rng: random.Random,
        envs: dict[tuple[str, int], Env],
        pool: ThreadPoolExecutor | None,
        types: Sequence[str],
    ) -> bool:
        """Play one group of episodes on one task; False when the worker should stop."""
        size = self._claim_episodes(self.cfg.env_service.group_size)
        if not size:
            return False
        itype = rng.choice(types)
        # chat: the persona is drawn per group
        persona = rng.choice(self.cfg.env_service.personas) if itype == "chat" else None
        key = f"{itype}:{persona}" if persona else itype
        members: list[Env] = []
        for j in range(size):
            env = envs.get((key, j))
            if env is None:
                env = self._make_env(itype, rng.randrange(1 << 30), persona)
                if env is None:
                    break
                envs[(key, j)] = env
            members.append(env)
        if len(members) < size:
            with self._count_lock:
                self.started_episodes -= size
            return True
        seed = rng.randrange(1 << 30)  # the same task for every member of the group
        group = group_headers(self.cfg, itype, index, size)
        if pool is None:
            outcomes = [self._episode(index, itype, members[0], client, seed, group=group)]
        else:
            greedy = self.cfg.env_service.greedy_member
            futures = [
                pool.submit(
                    self._episode,
                    index,
                    itype,
                    env,
                    client,
                    seed,
                    group=group,
                    temperature=0.0 if greedy and j == 0 else None,
                )
                for j, env in enumerate(members)
            ]
            outcomes = [f.result() for f in futures]
        for j, stats in enumerate(outcomes):
            if stats is None:
                continue
            if stats.error and stats.details.get("env_failed"):
                envs.pop((key, j), None)
                try:
                    members[j].close()
                except Exception:  # a failed env may fail to close too; the worker goes on
                    log.exception(
                        "[env_service] worker %d: closing a failed %s environment failed", index, itype
                    )
            self._report(stats)
        return not any(stats is None for stats in outcomes)  # None: stopping mid-episode

    def _after_refusal(self, index: int) -> None:
        """An episode refused at its first request: the next one would most likely be refused the
        same way (an environment whose messages the service cannot take), so wait, twice as long
        each time in a row, up to ``backoff_max`` seconds; an episode that gets going resets it."""
        with self._count_lock:
            streak = self._refused_streak.get(index, 0) + 1
            self._refused_streak[index] = streak
        wait = min(self.backoff_max, 0.5 * 2 ** (streak - 1))
        if streak > 1:
            log.warning(
                "[env_service] worker %d: %d episodes in a row refused at their first request; "
                "waiting %.1f s",
                index,
                streak,
                wait,
            )
            self.stop_event.wait(wait)

    def _wait_for_trainer(self, episodes: int) -> bool:
        """Wait while the samples waiting for the trainer, with those the episodes in flight will
        still add, reach ``max_ready_samples``; then reserve ``episodes`` in flight (given back by
        :meth:`_release`). False if stopping.

        Why count what is in flight: a group of 4 three-turn chats adds 12 samples, more than a
        backlog of 8 allows, and a second worker that looked only at the store started its own
        group meanwhile. The trainer takes the newest samples first, so rollouts beyond what it
        consumes are never trained: in 16-update runs they were 104 of 168 samples, and their
        decoding took the cores the trainer could have borrowed."""
        if self.backlog is None or self.max_backlog <= 0:
            with self._count_lock:
                self.in_flight += episodes
            return not self.stop_event.is_set()
        said = False
        while not self.stop_event.is_set():
            with self._backlog_lock:  # one store handle shared by the workers; check and reserve at once
                waiting = self.backlog()
                with self._count_lock:
                    waiting += self._samples_in_flight()
                    if waiting < self.max_backlog:
                        self.in_flight += episodes
                        return True
            if not said:
                with self._count_lock:
                    self.backlog_waits += 1
                log.debug(
                    "[env_service] %d samples wait for the trainer (limit %d); new episodes wait",
                    waiting,
                    self.max_backlog,
                )
                said = True
            self.stop_event.wait(1.0)
        return False

    def _samples_in_flight(self) -> int:
        """Samples the episodes in flight may still add: a finished episode's mean number of turns
        each (``max_turns`` before any has finished). Those already in the store count twice: the
        estimate errs towards fewer rollouts, never towards ones that are never trained. Called
        with ``_count_lock`` held."""
        finished = self.finished_episodes
        per_episode = self._finished_turns / finished if finished else self.cfg.env_service.max_turns
        return math.ceil(self.in_flight * per_episode)

    def _release(self, episodes: int) -> None:
        with self._count_lock:
            self.in_flight -= episodes

    def _report(self, stats: EpisodeStats) -> None:
        with self._count_lock:
            self.finished_episodes += 1
            self._finished_turns += stats.turns
        self.episodes.put(stats)
        for fn in self.callbacks:
            try:
                fn(stats)
            except Exception:  # a faulty hook must not kill a worker
                log.exception("[env_service] on_episode callback failed")

    def _episode(
        self,
        index: int,
        itype: str,
        env: Env,
        client: PolicyClient,
        seed: int,
        session_id: str | None = None,
        group: dict[str, str] | None = None,
        temperature: float | None = None,
    ) -> EpisodeStats | None:
        """Play one episode; ``temperature`` overrides the rollout temperature (a greedy member)."""
        session_id = session_id or f"env-{itype}-w{index}-{uuid.uuid4().hex[:12]}"
        temperature = self.temperature if temperature is None else temperature
        capture = self.cfg.env_service.state_capture
        start = time.monotonic()
        turns = 0
        reward = 0.0
        info: dict[str, Any] = {}

        def stats(success: bool, error: str | None = None, **details: Any) -> EpisodeStats:
            keep: dict[str, Any] = {
                k: info[k] for k in ("task", "persona", "kind", "score", "preferences") if k in info
            }
            if group:
                keep["group"] = group["X-Episode-Group"]
            return EpisodeStats(
                index,
                itype,
                session_id,
                success,
                reward,
                turns,
                time.monotonic() - start,
                error,
                {**keep, **details},
            )

        try:
            obs, info = checked_reset(itype, env.reset(seed=seed))
        except EnvUnavailable as exc:  # found only when an episode starts (a sandbox is made then)
            self._disable(itype, exc)
            return stats(False, f"unavailable: {exc}", env_failed=True)
        except EnvContractError as exc:  # its message names the environment and the value
            log.warning("[env_service] worker %d: %s", index, exc)
            return stats(False, f"reset failed: {exc}", env_failed=True)
        except Exception as exc:  # an env bug ends this episode, not the worker
            log.exception("[env_service] worker %d: %s reset failed", index, itype)
            return stats(False, f"reset failed: {exc}", env_failed=True)
        messages = [dict(m) for m in as_messages(obs, info)]
        tools = info.get("tools")
        headers = dict(group or {})
        user = simulated_user(self.cfg, info)

        window_full = False

        def ask(done: bool, max_tokens: int | None, extra: dict[str, str]) -> dict[str, Any] | None:
            """One request of the episode; a conversation longer than the policy's window loses
            its oldest steps first, as an agent compacts (the task and the newest exchange stay).
            Once the window has been met, each step drops one exchange before it asks: a step adds
            about one, so the next request is not another refusal."""
            nonlocal window_full
            if window_full:
                drop_oldest_exchange(messages)
            while True:
                try:
                    return client.complete(
                        messages,
                        session_id,
                        done=done,
                        tools=tools,
                        max_tokens=max_tokens,
                        temperature=temperature,
                        top_p=self.top_p,
                        extra_headers=extra,
                        user=user,
                    )
                except PolicyRequestError as exc:
                    if not (exc.too_long and drop_oldest_exchange(messages)):
                        raise
                    window_full = True

        while True:
            try:
                reply = ask(not capture, self.max_tokens, headers)
            except PolicyRequestError as exc:
                log.warning("[env_service] worker %d: %s", index, exc)
                refused = stats(False, str(exc))  # the wait below is not the episode's time
                if exc.refused_key:
                    # Not a burst of failed episodes (each builds a sandbox or a browser): wait, as
                    # for a service that is down, until a restart with the right key or a stop.
                    log.warning(
                        "[env_service] worker %d: the policy service refuses this run's key "
                        "([policy_service] api_key); waiting %.0f s before the next episode",
                        index,
                        self.backoff_max,
                    )
                    self.stop_event.wait(self.backoff_max)
                elif turns == 0:
                    self._after_refusal(index)
                return refused
            if reply is None:
                return None
            messages.append(reply)
            try:
                action: str | dict[str, Any] = reply if reply.get("tool_calls") else reply["content"]
                obs, reward, terminated, truncated, info = checked_step(itype, env.step(action))
            except EnvContractError as exc:
                log.warning("[env_service] worker %d: %s", index, exc)
                return stats(False, f"step failed: {exc}", env_failed=True)
            except Exception as exc:  # as above
                log.exception("[env_service] worker %d: %s step failed", index, itype)
                return stats(False, f"step failed: {exc}", env_failed=True)
            turns += 1
            if turns >= MAX_EPISODE_STEPS and not (terminated or truncated):
                return stats(
                    False,
                    f"environment {itype!r} did not end its episode within {MAX_EPISODE_STEPS} steps",
                    env_failed=True,
                )
            if turns == 1:
                with self._count_lock:
                    self._refused_streak.pop(index, None)  # the service takes this worker's requests
            if not capture:
                # The session was closed with this request; the next state is never sent back.
                return stats(bool(info.get("success")), None, state_captured=False)
            messages.extend(as_messages(obs, info))
            # The next request carries this turn's next state, and with it the truth it scores.
            headers = {**(group or {}), **truth_header(info)}
            if terminated or truncated:
                closing_headers = dict(headers)
                if group and reports_outcome(self.cfg, itype):
                    closing_headers["X-Episode-Outcome"] = str(episode_outcome(info))
                try:
                    closing = ask(True, self.final_max_tokens, closing_headers)
                except PolicyRequestError as exc:
                    return stats(bool(info.get("success")), f"closing request refused: {exc}")
                if closing is None:
                    return None
                return stats(bool(info.get("success")), None, truncated=truncated)


def drop_oldest_exchange(messages: list[dict[str, Any]]) -> bool:
    """Drop the oldest exchange (an assistant message and the observations after it) that is not
    the newest, keeping the system messages and the task (the first user message); False when only
    the newest exchange is left. A GUI page or a terminal's output adds hundreds of tokens a step:
    an episode longer than the policy's window goes on with its older steps left out."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    head += 1  # the task
    starts = [i for i in range(head, len(messages)) if messages[i].get("role") == "assistant"]
    if len(starts) < 2:
        return False
    del messages[starts[0] : starts[1]]
    return True


#: The user name a chat persona talks as in per_user mode: ``sim-<persona>``.
SIMULATED_PREFIX = "sim-"


def simulated_user(cfg: Config, info: dict[str, Any]) -> str | None:
    """In per_user mode each chat persona is a user of its own (``sim-<persona>``), so a run shows
    whether each one's adapter learns that user; None otherwise (everyone is the default user)."""
    if cfg.users.mode != "per_user" or not isinstance(info.get("persona"), str):
        return None
    return f"{SIMULATED_PREFIX}{info['persona']}"


def simulated_persona(cfg: Config, user: str) -> Persona | None:
    """The chat persona behind a simulated user's name (None for a real user or an unknown persona)."""
    if not user.startswith(SIMULATED_PREFIX):
        return None
    name = user.removeprefix(SIMULATED_PREFIX)
    return next((p for p in cfg.env_service.personas if p == name), None)


def truth_header(info: dict[str, Any]) -> dict[str, str]:
    """``X-Turn-Truth`` for the request after a step: the environment's own score (0..1) of the
    response it just saw (a chat persona's preference score, ``info["score"]``), which the judge
    never sees and the trainer compares the judge's verdicts with; empty when the env has none."""
    score = info.get("score")
    if isinstance(score, int | float) and not isinstance(score, bool) and 0.0 <= score <= 1.0:
        return {"X-Turn-Truth": f"{float(score):.6g}"}
    return {}


def reports_outcome(cfg: Config, itype: str) -> bool:
    """Whether episodes of ``itype`` send their verified outcome (chat never has one)."""
    return itype != "chat" and cfg.env_service.reward in OUTCOME_REWARDS and cfg.env_service.state_capture


def group_headers(cfg: Config, itype: str, worker: int, size: int) -> dict[str, str] | None:
    """The headers of a new group of ``size`` episodes, or None when its episode is played alone
    and judged turn by turn (no outcome, nobody to compare with)."""
    if size < 2 and not reports_outcome(cfg, itype):
        return None
    return {
        "X-Episode-Group": f"grp-{itype}-w{worker}-{uuid.uuid4().hex[:12]}",
        "X-Episode-Group-Size": str(size),
    }


def episode_outcome(info: dict[str, Any]) -> float:
    """An episode's verified outcome in [-1, 1]: the environment's own ``info["outcome"]`` when it
    gives one, else +1 for ``info["success"]`` and -1 without it."""
    value = info.get("outcome")
    if isinstance(value, int | float) and not isinstance(value, bool) and -1 <= value <= 1:
        return float(value)
    return 1.0 if info.get("success") else -1.0


def store_backlog(store: Store) -> Callable[[], int]:
    """The back-pressure count of a run's store: every sample waiting for the trainer, of whatever
    version. With the episodes in flight counted too (:meth:`EnvLoop._wait_for_trainer`) the queue
    stays short, so the trainer takes each sample within a version or two of its rollout; counting
    only the version serving now made every publish start new rollouts while the older ones were
    left untrained (docs/training.md "Only what will be trained is rolled out")."""
    return store.ready_count


def main(argv: list[str] | None = None) -> int:
    """``python -m openclaw_rl.envs.loop --config FILE [--policy-url URL]``: the launcher's env loop."""
    import argparse
    import signal

    from openclaw_rl.runtime.loop_main import event_lines, loop_config, run_loop_body

    ap = argparse.ArgumentParser(
        prog="python -m openclaw_rl.envs.loop", description="run environment workers"
    )
    ap.add_argument("--config", required=True)
    ap.add_argument("--policy-url", default=None, help="policy service root (default: from the config)")
    args = ap.parse_args(argv)
    event_lines()
    cfg = loop_config(args.config)

    def body() -> int:
        store = Store(RunDir.of(cfg).store)  # the run's store: how many samples wait for the trainer
        service = EnvLoop(cfg, base_url=args.policy_url, backlog=store_backlog(store))
        # SIGTERM from the launcher: cancel the request in flight, then exit.
        signal.signal(signal.SIGTERM, lambda *_: service.stop_event.set())
        try:
            service.run()
        finally:
            store.close()
        return 0

    return run_loop_body("env_service", body, cfg.log_dir)


if __name__ == "__main__":
    raise SystemExit(main())
