"""``openclaw-rl eval``: the fixed held-out set, per interaction type, through the policy's HTTP API.

What is measured:

* **chat** — personalisation score (fraction of the persona's preferences met, 0..1) of the
  policy's *first* reply to each held-out GSM8K problem, for each persona in
  ``[env_service] personas``. The problems are the last ``eval_size`` items of the data
  (:func:`openclaw_rl.envs.data.split_gsm8k`), which training episodes never draw.
* **terminal** — task success rate on the held-out tasks (:data:`terminal.EVAL_TASKS`), full
  episodes of up to ``max_turns`` commands in the sandbox.
* **tool_call** — task success rate on held-out GSM8K problems and held-out lookup tasks.

The policy is served by an in-process :class:`~openclaw_rl.policy.server.PolicyService` on a free
loopback port with its *own temporary store*: evaluation turns must never become training data.
``checkpoint`` (a LoRA adapter or full model directory) is loaded into it before the first request.
Sampling is greedy (temperature 0), so a run is repeatable.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.envs.base import make
from openclaw_rl.envs.chat import looping, report_score
from openclaw_rl.envs.loop import PolicyClient, PolicyRequestError, env_kwargs_for
from openclaw_rl.envs.terminal import EVAL_TASKS
from openclaw_rl.runtime.rundir import POLICY_META
from openclaw_rl.trainer.checkpoint import STATE_FILE

log = logging.getLogger("openclaw_rl.eval")


@dataclass(frozen=True)
class EvalSizes:
    """How many held-out items each part runs; the defaults finish in a few minutes on 2 CPU cores."""

    chat: int = 4  # problems per persona
    terminal: int = 3  # of the len(EVAL_TASKS) held-out tasks
    tool_call: int = 2  # one GSM8K problem, one lookup
    max_tokens: int = 128


def exported_version(folder: Path) -> int:
    """The policy version an exported folder says it is (its :data:`POLICY_META`, else a
    ``v000006`` name), so an evaluation is labelled with it; 1 for weights from elsewhere."""
    try:
        meta = json.loads((folder / POLICY_META).read_text(encoding="utf-8"))
        return int(meta["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    name = folder.name
    return int(name[1:]) if name.startswith("v") and name[1:].isdigit() and int(name[1:]) > 0 else 1


def _client(url: str, cfg: Config, stop: threading.Event) -> PolicyClient:
    return PolicyClient.from_config(cfg, url, stop, backoff_max_sec=2.0)


def _episode(client: PolicyClient, env: Any, reset_kw: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """One full episode; returns the env's final info plus the first reply."""
    _obs, info = env.reset(**reset_kw)
    messages = [dict(m) for m in info.get("messages", [])]
    tools = info.get("tools")
    sid = f"eval-{uuid.uuid4().hex[:12]}"
    first: str | None = None
    turns = 0
    while True:
        reply = client.complete(
            messages, sid, done=False, tools=tools, max_tokens=max_tokens, temperature=0.0
        )
        if reply is None:
            raise RuntimeError("evaluation stopped")
        first = reply["content"] if first is None else first
        messages.append(reply)
        _obs, reward, term, trunc, info = env.step(reply if reply.get("tool_calls") else reply["content"])
        turns += 1
        messages.extend(info.get("messages", []))
        if term or trunc:
            return {**info, "first_reply": first, "turns": turns, "reward": reward}


def _chat_reports(
    cfg: Config, client: PolicyClient, persona: str, sizes: EvalSizes, concurrency: int
) -> list[tuple[dict[str, bool], str]]:
    """Which preferences of the persona the greedy first reply to each of the first ``sizes.chat``
    held-out problems meets, with the reply, in problem order (each problem gets its own
    environment, so requests may overlap)."""
    kwargs = {**env_kwargs_for(cfg, "chat", "eval"), "max_turns": 1}
    first = make("chat", persona=persona, **kwargs)
    items = first.items  # type: ignore[attr-defined]
    n = min(sizes.chat, len(items))

    def one(i: int) -> tuple[dict[str, bool], str]:
        # reset(seed, item) alone decides the episode, so a fresh env per problem asks the same
        # question as reusing one; fresh ones let problems run at once
        env = first if concurrency <= 1 else make("chat", persona=persona, **{**kwargs, "items": items})
        _obs, info = env.reset(seed=i, options={"item": i})
        reply = client.complete(
            info["messages"],
            f"eval-{uuid.uuid4().hex[:12]}",
            done=True,
            max_tokens=sizes.max_tokens,
            temperature=0.0,
        )
        if reply is None:
            raise RuntimeError("evaluation stopped")
        text = reply["content"] or ""
        return env.report(text), text  # type: ignore[attr-defined]

    if concurrency <= 1 or n <= 1:
        return [one(i) for i in range(n)]
    with ThreadPoolExecutor(max_workers=min(concurrency, n), thread_name_prefix="eval-chat") as pool:
        return list(pool.map(one, range(n)))


def private_service_config(cfg: Config, log_dir: str) -> Config:
    """A copy of ``cfg`` for a private in-process policy service: loopback, a free port, one embedded
    engine, and ``log_dir`` (a temporary directory) for its store, so evaluation traffic never
    reaches the training store."""
    ecfg = cfg.model_copy(deep=True)
    ecfg.policy_service.host = "127.0.0.1"
    ecfg.policy_service.port = 0
    ecfg.policy_service.num_engines = 1
    ecfg.global_.log_dir = log_dir
    return ecfg


def evaluate(
    cfg: Config,
    base_url: str,
    sizes: EvalSizes = EvalSizes(),
    stop: threading.Event | None = None,
    verbose: bool = True,
    concurrency: int = 1,
) -> dict[str, Any]:
    """Run the held-out set against the policy at ``base_url``; return the summary dict.

    ``stop``: set it to end the evaluation after the request in flight (it then raises
    ``RuntimeError("evaluation stopped")``). ``verbose``: print one line per part.
    ``concurrency``: chat problems of one persona sent at once (the engine batches them; 1 = one
    after another).
    """
    stop = stop if stop is not None else threading.Event()
    client = _client(base_url, cfg, stop)
    types = [t for t in cfg.env_service.interaction_types if t in ("chat", "terminal", "tool_call")]
    summary: dict[str, Any] = {}
    try:
        if "chat" in types and sizes.chat > 0:
            summary["chat"] = {}
            for persona in cfg.env_service.personas:
                replies = _chat_reports(cfg, client, persona, sizes, concurrency)
                reports = [r for r, _ in replies]
                n = len(reports)
                scores = [report_score(r) for r in reports]
                # per preference: the share of replies that meet it, so a run shows which of the
                # user's wishes it learned (the score is their mean)
                wishes = list(reports[0]) if reports else []
                met = {name: sum(r[name] for r in reports) / n for name in wishes}
                summary["chat"][persona] = {
                    "n": n,
                    "personalization": sum(scores) / max(1, n),
                    "scores": scores,
                    "preferences": met,
                    # replies that say one thing over and over, which meet no wish (envs/chat.py)
                    "looping": sum(looping(text) for _, text in replies) / max(1, n),
                }
                if verbose:
                    print(
                        f"[eval] chat persona={persona} n={n} "
                        f"personalization={summary['chat'][persona]['personalization']:.3f} "
                        f"({', '.join(f'{name} {rate:.2f}' for name, rate in met.items())}; "
                        f"looping {summary['chat'][persona]['looping']:.2f})",
                        flush=True,
                    )
        if "terminal" in types and sizes.terminal > 0:
            names = list(EVAL_TASKS)[: sizes.terminal]
            results = {}
            for name in names:
                env = make("terminal", **{**env_kwargs_for(cfg, "terminal", "eval"), "task": name})
                try:
                    results[name] = bool(_episode(client, env, {"seed": 0}, sizes.max_tokens).get("success"))
                finally:
                    env.close()
            rate = sum(results.values()) / max(1, len(results))
            summary["terminal"] = {"n": len(results), "success_rate": rate, "tasks": results}
            if verbose:
                print(f"[eval] terminal n={len(results)} success_rate={rate:.3f}", flush=True)
        if "tool_call" in types and sizes.tool_call > 0:
            env = make("tool_call", **env_kwargs_for(cfg, "tool_call", "eval"))
            outcomes = []
            try:
                for i in range(sizes.tool_call):
                    kind = "gsm8k" if i % 2 == 0 else "lookup"
                    opts: dict[str, Any] = {"kind": kind}
                    if kind == "gsm8k":
                        opts["item"] = (i // 2) % len(env.items)  # type: ignore[attr-defined]
                    out = _episode(client, env, {"seed": 10_000 + i, "options": opts}, sizes.max_tokens)
                    outcomes.append(
                        {"kind": kind, "success": bool(out.get("success")), "turns": out["turns"]}
                    )
            finally:
                env.close()
            rate = sum(o["success"] for o in outcomes) / max(1, len(outcomes))
            summary["tool_call"] = {"n": len(outcomes), "success_rate": rate, "episodes": outcomes}
            if verbose:
                print(f"[eval] tool_call n={len(outcomes)} success_rate={rate:.3f}", flush=True)
    finally:
        client.close()
    return summary


def eval_command(
    cfg: Config, checkpoint: str | None, sizes: EvalSizes | None = None, out: str | None = None
) -> int:
    """``openclaw-rl eval``: serve the policy (base or ``checkpoint``) in-process and evaluate it.

    Prints one line per part and a JSON summary; writes it to ``out`` (default
    ``<log_dir>/eval/eval-<time>.json``). Returns the process exit code.
    """
    from openclaw_rl.policy.server import PolicyService

    sizes = sizes or EvalSizes()
    if checkpoint is not None:
        policy, problem = _policy_folder(Path(checkpoint))
        if problem:
            print(f"[eval] error: --checkpoint {checkpoint}: {problem}", flush=True)
            return 2
        if policy != Path(checkpoint):
            print(
                f"[eval] note: {checkpoint} is a training checkpoint; evaluating its policy, {policy}",
                flush=True,
            )
        checkpoint = str(policy)
    target = Path(out) if out else Path(cfg.global_.log_dir) / "eval" / f"eval-{int(time.time())}.json"
    try:  # checked before the model loads: an evaluation is minutes of work to lose at the end
        target.parent.mkdir(parents=True, exist_ok=True)
        problem = None
        if target.is_dir():
            problem = "it is a directory"
        elif target.exists() and not os.access(target, os.W_OK):
            problem = "it is not writable"
        elif not os.access(target.parent, os.W_OK):
            problem = "its folder is not writable"
    except (FileExistsError, NotADirectoryError):  # mkdir met a file where a folder should be
        problem = "a part of its path is a file, not a folder"
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        print(f"[eval] error: cannot write the summary to {target}: {problem}", flush=True)
        return 2
    tmp = tempfile.TemporaryDirectory(prefix="openclaw_eval_")
    # A private port and store: evaluation traffic never reaches the training store.
    ecfg = private_service_config(cfg, tmp.name)
    started = time.monotonic()
    service = PolicyService(ecfg)
    try:
        url = service.start()
        version = 0
        said = ""
        if checkpoint is not None:
            version = service.swap_weights(checkpoint, exported_version(Path(checkpoint)))
            if (Path(checkpoint).parent / STATE_FILE).is_file():
                said = " (a checkpoint's count of updates that changed the weights, not a published version)"
        types = cfg.env_service.interaction_types
        asked_for = {"chat": sizes.chat, "terminal": sizes.terminal, "tool_call": sizes.tool_call}
        print(
            f"[eval] policy={checkpoint or cfg.policy_service.model} version={version}{said} sizes="
            + " ".join(
                f"{part}:{n}{'/persona' if part == 'chat' else ''}"
                for part, n in asked_for.items()
                if part in types
            ),
            flush=True,
        )
        for part, asked, held_out in (
            ("chat", sizes.chat, cfg.env_service.eval_size),
            ("terminal", sizes.terminal, len(EVAL_TASKS)),
        ):
            if asked > held_out:
                print(
                    f"[eval] note: {part} asks for {asked} but {held_out} held-out "
                    f"{'problems' if part == 'chat' else 'tasks'} exist; all {held_out} are run",
                    flush=True,
                )
        skipped = [p for p, n in asked_for.items() if n > 0 and p not in types]
        if skipped:
            print(
                f"[eval] note: {', '.join(skipped)} not evaluated: not in [env_service] interaction_types "
                f"({', '.join(types)})",
                flush=True,
            )
        summary = evaluate(ecfg, url, sizes)
    except (PolicyRequestError, RuntimeError, OSError, ValueError) as exc:
        print(f"[eval] error: {exc}", flush=True)
        return 1
    finally:
        service.stop()
        tmp.cleanup()
    summary = {
        "checkpoint": checkpoint,
        "policy_model": cfg.policy_service.model,
        "elapsed_s": round(time.monotonic() - started, 1),
        **summary,
    }
    text = json.dumps(summary, indent=2)
    print(text, flush=True)
    target.write_text(text + "\n")
    print(f"[eval] summary written to {target}", flush=True)
    return 0


def _policy_folder(path: Path) -> tuple[Path, str | None]:
    """The folder of weights ``--checkpoint`` names: an exported policy (a LoRA adapter or a full
    model), or the ``policy/`` inside a training checkpoint; else what is wrong with it."""
    if not path.is_dir():
        return path, "not a directory (give an exported policy, e.g. <log_dir>/policy/v000001)"
    for folder in (path, path / "policy"):
        if (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
            return folder, None
    return path, (
        "holds no policy (no adapter_config.json or config.json, nor a policy/ folder with one); give "
        "an exported policy, e.g. <log_dir>/policy/v000001"
    )
