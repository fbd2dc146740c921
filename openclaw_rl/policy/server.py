"""The policy service process: engine + HTTP server + store, started in a thread or in the foreground.

``PolicyService(cfg).start()`` runs a real uvicorn server on a background thread (tests, the launcher)
and returns its base URL; ``.run()`` serves in the foreground (``openclaw-rl serve``), where uvicorn
turns SIGTERM / SIGINT into a graceful shutdown: stop accepting, let in-flight requests finish and be
recorded, then the engine stops. ``port = 0`` binds a free port.

Trainer integration: ``.swap_weights(path, version)`` in-process, or ``POST /v1/admin/load_weights``
from another process; both update ``store`` meta ``policy_version``.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn

from openclaw_rl.config import Config, generates_client_key, launched_by_launcher
from openclaw_rl.policy.api_router import build_app
from openclaw_rl.policy.engine import Engine
from openclaw_rl.policy.forward import ForwardEngine
from openclaw_rl.policy.replicas import ReplicatedEngine
from openclaw_rl.policy.serving import Serving
from openclaw_rl.policy.transformers_engine import TransformersEngine
from openclaw_rl.policy.weights import WeightLoadError
from openclaw_rl.runtime.loop_main import event_lines, run_loop_body
from openclaw_rl.runtime.policy_admin import SERVICE_URL_META
from openclaw_rl.runtime.rundir import PublishedPolicy, RunDir
from openclaw_rl.runtime.store import Store

log = logging.getLogger("openclaw_rl.policy")


def build_engine(cfg: Config) -> Engine:
    """The engine named by ``[policy_service] backend`` (the one place that chooses it)."""
    if cfg.policy_service.backend == "transformers":
        if cfg.policy_service.num_engines > 1:
            return ReplicatedEngine(cfg)
        return TransformersEngine(cfg)
    return ForwardEngine(cfg)


class PolicyService:
    """Serve ``cfg.policy_service`` and record into ``store`` (default ``<log_dir>/store.sqlite``)."""

    def __init__(
        self,
        cfg: Config,
        store: Store | None = None,
        engine: Engine | None = None,
        create_store: bool = True,
    ):
        self.cfg = cfg
        self.pcfg = cfg.policy_service
        self._own_store = store is None
        self.store = store if store is not None else Store(RunDir.of(cfg).store, create=create_store)
        self.engine = engine if engine is not None else build_engine(cfg)
        self.serving: Serving | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.url = ""

    # ------------------------------------------------------------------ setup
    def _prepare(self) -> tuple[uvicorn.Server, socket.socket]:
        run = RunDir.of(self.cfg)
        # Decided here, not only in the config: `serve --host 0.0.0.0` changes the host after loading.
        key = run.client_key(self.pcfg)
        self.engine.start()
        self.serving = Serving(self.cfg, self.engine, self.store)
        self._serve_published(run)
        app = build_app(self.serving, key, admin_key=run.admin_key(), weights_root=run.policies)
        sock = socket.socket(socket.AF_INET6 if ":" in self.pcfg.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.pcfg.host, self.pcfg.port))
        sock.listen(2048)
        self._sock = sock
        port = sock.getsockname()[1]
        host = self.pcfg.host
        self.url = f"http://{self.pcfg.connect_host}:{port}"
        self.store.set_meta(SERVICE_URL_META, self.url)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=int(self.pcfg.request_timeout_sec),
            lifespan="on",
        )
        server = uvicorn.Server(config)
        self._server = server
        self._listen_line = (
            f"[policy_service] listening on {host}:{port}, max_concurrent={self.pcfg.max_concurrent}"
        )
        if generates_client_key(self.pcfg):  # the path only: the key itself is never printed
            self._listen_line += (
                f"\n[policy_service] {host} is reachable from other machines and no api_key is set: clients "
                f"must send the generated key in {run.client_key_file} (Authorization: Bearer <key>)"
            )
        return server, sock

    def _serve_published(self, run: RunDir) -> None:
        """Serve what the run's trainer last published, not the base: a (re)started service goes
        on where the run is (the shared policy; in per_user mode every user's newest adapter, loaded
        on their first request). A published folder that cannot be loaded is reported, not fatal."""
        assert self.serving is not None
        published: list[tuple[str | None, PublishedPolicy | None]] = [(None, run.read_published_policy())]
        if self.cfg.users.mode == "per_user":
            published += [(user, run.read_published_policy(user)) for user in run.published_users()]
        for user, policy in published:
            if policy is None:
                continue
            who = f" of user {user}" if user is not None else ""
            # the newest published first; when its folder is gone or damaged, the newest older one
            # that loads (a user who deleted v6 by hand gets v5, not the base under a "v6" label)
            older = [(v, p) for v, p in run.published_versions(user) if v < policy.version]
            served = None
            for version, path in [(policy.version, policy.path), *older]:
                try:
                    self.serving.swap_weights(path, version, user)
                except WeightLoadError as exc:
                    print(f"[policy_service] could not load policy version={version}{who}: {exc}", flush=True)
                    continue
                served = version
                break
            if served is None:
                print(f"[policy_service] serving the base model{who}: no published version loads", flush=True)
            elif served != policy.version:
                print(
                    f"[policy_service] serving policy version={served}{who}, the newest that loads (the "
                    f"published version {policy.version} does not); the trainer's next publication "
                    "replaces it",
                    flush=True,
                )
            elif user is None:
                print(
                    f"[policy_service] serving policy version={policy.version} (the newest published)",
                    flush=True,
                )

    # ------------------------------------------------------------------ background
    def start(self) -> str:
        """Serve on a background thread; return the base URL once it accepts connections."""
        server, sock = self._prepare()
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="policy-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the policy service HTTP server failed to start")
            time.sleep(0.02)
        print(self._listen_line, flush=True)
        return self.url

    def stop(self) -> None:
        """Stop accepting, let in-flight requests finish and be recorded, stop the engine."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=self.pcfg.request_timeout_sec + 10)
            self._thread = None
        self.engine.stop()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._own_store:
            self.store.close()

    # ------------------------------------------------------------------ foreground
    def run(self) -> None:
        """Serve until SIGTERM / SIGINT, then drain in-flight requests, record them, and return."""
        server, sock = self._prepare()
        print(self._listen_line, flush=True)
        # uvicorn turns SIGTERM/SIGINT into a graceful shutdown, then re-raises the signal with the
        # handlers it found installed. Installing these first makes that re-raise a no-op, so the
        # engine is stopped and the process exits 0 after the drain instead of dying on the re-raise.
        previous = {sig: signal.signal(sig, self._note_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            server.run(sockets=[sock])
        finally:
            served = self.serving.served if self.serving else 0
            self.engine.stop()
            sock.close()
            if self._own_store:
                self.store.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            print(
                f"[policy_service] stopped after {served} request(s); the replies in flight were finished "
                "and recorded (but for any whose client had gone away)",
                flush=True,
            )

    def _note_signal(self, sig: int, frame: object) -> None:
        # uvicorn re-raises the signal that stopped it once it has drained; nothing left to do
        log.debug("[policy_service] signal %d re-raised after the graceful shutdown", sig)

    def swap_weights(self, path: str | Path, version: int) -> int:
        """Replace the weights with ``path`` (LoRA adapter or full model dir) as ``version``; in-flight
        requests complete. Returns the new version."""
        if self.serving is None:
            self.engine.swap_weights(path, version)
            self.store.set_meta("policy_version", version)
            return version
        return self.serving.swap_weights(path, version)

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version


def serve_command(cfg: Config, host: str | None, port: int | None) -> int:
    """``openclaw-rl serve --config FILE [--host H] [--port P]``: serve in the foreground."""
    from openclaw_rl.runtime.models import ModelNotFoundError

    if host is not None:
        cfg.policy_service.host = host
    if port is not None:
        pol = cfg.policy_service
        if pol.backend in ("sglang", "vllm") and not pol.engine_url and pol.port:
            # the engine stays where the config puts it (its port + 1, as the config check said):
            # moving this service does not move an engine already running
            pol.engine_url = pol.engine_root
        pol.port = port
    event_lines()

    def body() -> int:
        try:
            # the launcher's server made no store of its own: one missing now was removed under the run
            PolicyService(cfg, create_store=not launched_by_launcher()).run()
        except ModelNotFoundError as exc:
            print(f"[policy_service] error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(
                f"[policy_service] error: cannot listen on {cfg.policy_service.host}:"
                f"{cfg.policy_service.port}: {exc}; stop the process that holds it or set another "
                "[policy_service] port (or --port)",
                file=sys.stderr,
            )
            return 2
        return 0

    return run_loop_body("policy_service", body, cfg.log_dir)
