"""Does the agent learn? Held-out personalisation before and after training, per method, in one run.

For each run this starts the real main job — launcher, policy service, environment workers playing
a persona, embedded judge, LoRA trainer, weight swaps, the live evaluator — from the base model for a
fixed number of updates, then scores the final policy on held-out GSM8K problems (never used for
training) with the persona's fixed scorer. The base score of each persona is measured once, by the
same scorer on the same problems, in the same invocation.

    .venv/bin/python bench/learning.py [--updates 16] [--batch 4] [--chat-n 32] \
        [--arms combined,binary,opd,combined-lockstep] [--seeds 42,7,1] [--teacher-seeds 42,7,1]

A run is ``method[-lockstep]:seed[@persona]`` (``--runs`` lists them by hand); ``<method>-lockstep``
runs the same method with ``async_mode = false`` (serving paused while the trainer trains), the
baseline the asynchronous run with ``max_staleness = 2 x weight_sync_interval`` is compared with.
``default:seed`` runs the shipped default, ``configs/local.toml``, exactly as ``make run`` runs it
(only its seed, log_dir and port changed; the options above do not touch it, ``--set`` does): what
a user sees in their first ``make run``, e.g. ``--runs default:42,default:7 --max-minutes 45``.
``--set [SECTION.]KEY=VALUE`` changes one config key of every run, e.g. top-K distillation:
``--set prm_service.teacher_topk=16 --set topk_distill=true``.
Prints a row per run (base, trained, change, sessions to learn, wall time, samples trained, trained
samples per hour) and, per arm, the mean change over its seeds with its spread and its worst seed.
"Sessions to learn" is the conversations the run had when its live evaluation first reached the
base + 0.15 and stayed there (``-``: never within the run). "loop" is the share of the trained
policy's held-out replies that say one thing over and over; they meet no wish (docs/envs.md).
``--report DIR --rescore`` scores a kept work directory's base and final policies again with the
current scorer (``--max-tokens`` as the runs had it, for directories from before it was saved).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _args import kept_work_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import PACKAGED_DATA, Config, load_config  # noqa: E402
from openclaw_rl.launcher.eval_loop import sessions_to_learn  # noqa: E402
from openclaw_rl.launcher.evaluate import EvalSizes, evaluate  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402
from openclaw_rl.runtime.metrics import read_metrics  # noqa: E402
from openclaw_rl.runtime.ports import free_port  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402

METHODS = {
    "combined": {"opd_enabled": True, "binary_rl_weight": 1.0, "opd_weight": 1.0},
    "binary": {"opd_enabled": False, "binary_rl_weight": 1.0, "opd_weight": 1.0},
    "opd": {"opd_enabled": True, "binary_rl_weight": 0.0, "opd_weight": 1.0},
}


@dataclass(frozen=True)
class Row:
    """One run's result."""

    run: str
    arm: str  # method[-lockstep]@persona: what the seeds of one arm share
    seed: int
    base: float
    trained: float
    wall_s: float
    samples: int
    sessions_to_learn: int | None
    judge_agreement: float | None
    updates: int = 0
    looping: float | None = None  # share of the trained policy's held-out replies that loop

    @property
    def change(self) -> float:
        return self.trained - self.base

    @property
    def per_hour(self) -> float:
        return self.samples / self.wall_s * 3600


def parse_run(run: str) -> tuple[str, str, int, str]:
    """``method[-lockstep]:seed[@persona]`` -> (name, method, seed, persona)."""
    spec, _, persona = run.partition("@")
    name, _, seed = spec.partition(":")
    method = name.removesuffix("-lockstep")
    if name == DEFAULT and seed.isdigit() and persona in ("", "student"):
        return name, name, int(seed), "student"  # the persona configs/local.toml plays
    if method not in METHODS or not seed.isdigit() or persona not in ("", "student", "teacher"):
        raise SystemExit(
            f"bad run {run!r}: write method:seed[@persona] with method one of {sorted(METHODS)} "
            "(optionally + -lockstep) and persona student or teacher, e.g. combined:42@teacher, "
            f"or {DEFAULT}:seed for configs/local.toml as make run runs it"
        )
    return name, method, int(seed), persona or "student"


#: The run kind that plays the shipped default config unchanged, and that config.
DEFAULT = "default"
DEFAULT_CONFIG = ROOT / "configs" / "local.toml"


def toml_text(sections: dict[str, dict[str, Any]]) -> str:
    """A config file's text from its sections (scalars and flat lists: all a run config holds)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str | Path):
            return json.dumps(str(v))  # a JSON string is a valid TOML basic string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"no TOML form for {type(v).__name__} {v!r}")

    return "".join(
        f"[{name}]\n" + "".join(f"{key} = {value(v)}\n" for key, v in keys.items()) + "\n"
        for name, keys in sections.items()
    )


def default_config(work: Path, label: str, seed: int, overrides: list[tuple[str, str, Any]]) -> str:
    """``configs/local.toml`` as ``make run`` runs it, with this run's seed, log_dir and a free port,
    and the ``--set`` overrides."""
    sections = tomllib.loads(DEFAULT_CONFIG.read_text())
    sections["global"].update(seed=seed, log_dir=str(work / label))
    sections["policy_service"]["port"] = free_port()
    return toml_text(with_overrides(sections, overrides))


def default_note() -> str:
    """The report's words for the ``default`` runs: what the shipped config trains."""
    tc = load_config(DEFAULT_CONFIG).training
    return (
        f"; {DEFAULT}: {DEFAULT_CONFIG.relative_to(ROOT)} as it is ({tc.max_steps} updates of batch "
        f"{tc.batch_size}, lr {tc.lr:g}, before --set)"
    )


def chat_run_sections(
    args: argparse.Namespace, model: str, personas: list[str], data: str
) -> dict[str, dict[str, Any]]:
    """The serving, environment and judge sections of a bench run: simulated chat users playing
    ``personas`` on ``data``, the embedded judge with 3 votes, on a free port."""
    return {
        "policy_service": {
            "model": model,
            "port": free_port(),
            "max_concurrent": 8,
            "weight_sync_interval": args.sync,
            "max_tokens_default": args.max_tokens,
        },
        "env_service": {
            "num_envs": args.num_envs,
            "group_size": args.group_size,
            "interaction_types": ["chat"],
            "personas": personas,
            "max_turns": 3,
            "data_path": data,
        },
        "prm_service": {"backend": "minilm", "vote_count": 3},
    }


def write_config(work: Path, run: str, args: argparse.Namespace) -> Path:
    """The config of one run, ``method[-lockstep]:seed[@persona]`` or ``default:seed``."""
    name, method, seed, persona = parse_run(run)
    if method == DEFAULT:
        path = work / f"{run_label(run)}.toml"
        path.write_text(default_config(work, run_label(run), seed, args.set))
        return path
    m = METHODS[method]
    data = args.data if args.data in PACKAGED_DATA else Path(args.data).resolve()
    label = run_label(run)
    path = work / f"{label}.toml"
    settings = {
        "lr": args.lr,
        "batch_size": args.batch,
        "mini_batch_size": max(1, args.batch // 2),
        "micro_batch_tokens": 1024,
        "checkpoint_interval": args.updates,
        "max_steps": args.updates,
        "max_staleness": 2 * args.sync,
        "eval_interval": args.sync if args.live_n else 0,
        "eval_size": max(1, args.live_n),
        **m,
    }
    sections: dict[str, dict[str, Any]] = {
        "global": {
            "run_name": label,
            "seed": seed,
            "log_dir": str(work / label),
            "async_mode": not name.endswith("-lockstep"),
        },
        **chat_run_sections(args, args.model, [persona], str(data)),
        "training": settings,
    }
    path.write_text(toml_text(with_overrides(sections, args.set)))
    return path


def add_set_option(ap: argparse.ArgumentParser, help_text: str) -> None:
    """``--set [SECTION.]KEY=VALUE`` (repeatable) on ``ap``: config overrides of every run, parsed by
    :func:`setting_override` into ``args.set``."""
    ap.add_argument(
        "--set",
        type=setting_override,
        action="append",
        default=[],
        metavar="[SECTION.]KEY=VALUE",
        help=help_text,
    )


def setting_override(text: str) -> tuple[str, str, Any]:
    """``--set [SECTION.]KEY=VALUE`` -> (section, key, value); the section is ``training`` unless
    named. Integers, numbers and true / false are taken as such, anything else as a string."""
    name, sep, value = text.partition("=")
    section, dot, key = name.strip().rpartition(".")
    section, key, value = (section if dot else "training"), key.strip(), value.strip()
    field = Config.model_fields.get("global_" if section == "global" else section)
    keys = getattr(field.annotation, "model_fields", {}) if field is not None else {}
    if not sep or key not in keys:
        raise argparse.ArgumentTypeError(
            f"--set wants [SECTION.]KEY=VALUE naming a config key (SECTION defaults to training), got {text!r}"
        )
    parsed: Any = value
    if value in ("true", "false"):
        parsed = value == "true"
    else:
        for kind in (int, float):
            try:
                parsed = kind(value)
                break
            except ValueError:
                continue
    return section, key, parsed


def with_overrides(
    sections: dict[str, dict[str, Any]], overrides: list[tuple[str, str, Any]]
) -> dict[str, dict[str, Any]]:
    """``sections`` with the ``--set`` values written over them (they win over everything else)."""
    for section, key, value in overrides:
        sections.setdefault(section, {})[key] = value
    return sections


def score(
    config: Path, checkpoint: Path | None, n: int, max_tokens: int, persona: str | None = None
) -> float:
    """Held-out personalisation of the base model or an exported policy: for ``persona``, or the
    run's one persona."""
    return float(score_detail(config, checkpoint, n, max_tokens, persona)["personalization"])


def score_detail(
    config: Path, checkpoint: Path | None, n: int, max_tokens: int, persona: str | None = None
) -> dict[str, Any]:
    """:func:`score` with the evaluation's whole summary of the persona: ``personalization``,
    ``preferences`` (each wish's rate) and ``looping`` (the share of replies that loop)."""
    cfg = load_config(config)
    ecfg = cfg.model_copy(deep=True)
    ecfg.users.mode = "shared"  # the checkpoint given is what is scored, whoever trained it
    if persona is not None:
        ecfg.env_service.personas = [persona]  # type: ignore[list-item]
    ecfg.policy_service.port = 0
    ecfg.global_.log_dir = tempfile.mkdtemp(prefix="ocl-eval-")
    service = PolicyService(ecfg)
    try:
        url = service.start()
        if checkpoint is not None:
            service.swap_weights(checkpoint, 1)
        # Problems are sent 8 at a time (the engine batches them); greedy, so the score does not
        # depend on the order.
        summary = evaluate(
            ecfg, url, EvalSizes(chat=n, terminal=0, tool_call=0, max_tokens=max_tokens), concurrency=8
        )
    finally:
        service.stop()
        shutil.rmtree(ecfg.global_.log_dir, ignore_errors=True)
    (scored,) = ecfg.env_service.personas
    return dict(summary["chat"][scored])


#: Judged turns without a single sample to train, as a multiple of the samples the run's updates take
#: (updates x batch), after which a run stops: the policy never changed, so more rollouts of it only
#: repeat what was seen (Binary RL on a persona the base never satisfies: every group all -1).
IDLE_TURNS_FACTOR = 2
#: How often a running job's store is read for that check (seconds).
POLL_S = 15.0


def _idle(store_path: Path, budget: int) -> int | None:
    """The judged turns when the run has judged ``budget`` or more of them and made no sample."""
    if not store_path.is_file():
        return None
    store = Store(store_path)
    try:
        c = store.counters()
    finally:
        store.close()
    made = c.samples_ready + c.samples_claimed + c.samples_trained + c.samples_dropped
    return c.judged if c.judged >= budget and made == 0 else None


def train(config: Path, log_file: Path, max_minutes: float | None = None) -> tuple[float, int]:
    """Run the main job to max_steps, or stop it (SIGTERM: the trainer ends with a checkpoint)
    after ``max_minutes`` or once it has judged ``IDLE_TURNS_FACTOR`` x its updates' samples in
    turns without making one sample; returns (wall seconds, samples trained)."""
    start = time.monotonic()
    cfg = load_config(config)
    budget = IDLE_TURNS_FACTOR * (cfg.training.max_steps or 0) * cfg.training.batch_size
    with log_file.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "openclaw_rl.launch", "--config", str(config)],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        why = None
        while proc.poll() is None and why is None:
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if max_minutes is not None and time.monotonic() - start > max_minutes * 60:
                    why = f"stopped after {max_minutes:g} min: the time cap of one run"
                elif budget and (judged := _idle(cfg.log_dir / "store.sqlite", budget)) is not None:
                    why = (
                        f"stopped after {judged} judged turns with no sample to train ({IDLE_TURNS_FACTOR} x "
                        "its updates x batch): its policy never changed"
                    )
        if why is not None:
            proc.send_signal(signal.SIGTERM)  # the launcher stops its loops; the trainer checkpoints
            proc.wait(timeout=300)
            print(f"  ({why})", flush=True)
        elif proc.returncode != 0:
            raise SystemExit(f"training run failed (exit {proc.returncode}); see {log_file}")
    store = Store(cfg.log_dir / "store.sqlite")
    trained = store.counters().samples_trained
    store.close()
    return time.monotonic() - start, trained


def final_policy(config: Path) -> Path | None:
    """The policy of the run's last checkpoint; None when it never trained (the base is scored)."""
    cfg = load_config(config)
    ckpt = cfg.log_dir / "checkpoints"
    if not (ckpt / "latest").is_file():
        return None
    return ckpt / (ckpt / "latest").read_text().strip() / "policy"


def updates_done(config: Path) -> int:
    """How many updates the run made (fewer than max_steps when its time cap stopped it)."""
    rows = read_metrics(load_config(config).log_dir, kind="train")
    return max((int(r["step"]) for r in rows), default=0)


def run_agreement(config: Path) -> float | None:
    """The run's judge-persona agreement: of its turns judged +-1, the share the persona agreed with."""
    rows = read_metrics(load_config(config).log_dir, kind="train")
    pairs = [r["judge_agreement"] for r in rows if isinstance(r.get("judge_agreement"), int | float)]
    return statistics.fmean(pairs) if pairs else None


#: The per-update metrics the health table averages, with the question each one answers (the
#: candidate causes of weak learning of docs/training.md "What the checks showed").
HEALTH = (
    ("zero_adv_group_frac", "zero-adv", "groups whose rewards were all equal: the RL part said nothing"),
    ("rl_scale", "rl_scale", "factor on the RL part that balances it against the OPD part"),
    ("judge_agreement", "agree", "judge-persona agreement on the turns scored +-1 (0.5 = noise)"),
    ("teacher_minus_rollout", "t-r", "mean teacher - rollout log-prob on hinted tokens (OPD's push)"),
    ("opd_abs_mean", "|opd|", "mean |teacher - rollout| per token: the OPD term's scale"),
    ("staleness_mean", "stale", "policy versions between a trained sample's rollout and the update"),
    ("kl", "kl", "KL to the base policy at the last update (drift)"),
    (
        "repeat_frac",
        "repeat",
        "share of the last update's response 8-token runs that repeat an earlier run (loops)",
    ),
    ("stop_frac", "stop", "share of the last update's responses that ended by themselves, not at max_tokens"),
    ("wide_pass_frac", "wide", "share of passes the trainer ran on every core"),
)


#: HEALTH metrics the table takes from the last update rather than the mean over updates.
LAST_UPDATE = ("kl", "repeat_frac", "stop_frac")


def health(config: Path) -> dict[str, float | None]:
    """A run's signal health: each HEALTH metric averaged over its updates (``kl``, ``repeat_frac``
    and ``stop_frac``: the last update's, where drift, loops and a policy that stopped stopping
    show), entropy at its first and last update, and its updates' mean length in seconds."""
    rows = read_metrics(load_config(config).log_dir, kind="train")
    out: dict[str, float | None] = {}
    for key, _, _ in HEALTH:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        out[key] = (values[-1] if key in LAST_UPDATE else statistics.fmean(values)) if values else None
    entropy = [float(r["entropy"]) for r in rows if isinstance(r.get("entropy"), int | float)]
    out["entropy_first"] = entropy[0] if entropy else None
    out["entropy_last"] = entropy[-1] if entropy else None
    times = [float(r["time"]) for r in rows if isinstance(r.get("time"), int | float)]
    out["s_per_update"] = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return out


def health_report(work: Path, rows: list[Row]) -> None:
    """The signal-health table of every run of ``rows`` whose directory is under ``work``."""
    cols = [*((key, label) for key, label, _ in HEALTH), ("entropy_first", "H0"), ("entropy_last", "H1")]
    cols.append(("s_per_update", "s/upd"))
    print(f"\n{'signal health':<30}" + "".join(f"{label:>9}" for _, label in cols))
    for r in rows:
        conf = work / f"{run_label(r.run)}.toml"
        if not conf.is_file():
            continue
        h = health(conf)
        cells = ("-" if h[key] is None else f"{h[key]:.3f}" for key, _ in cols)
        print(f"{r.run:<30}" + "".join(f"{c:>9}" for c in cells))
    print(
        "("
        + "; ".join(f"{label}: {why}" for _, label, why in HEALTH)
        + "; H0 / H1: entropy at the first / last update)"
    )


def run_label(run: str) -> str:
    """The file and directory name of a run in the work directory."""
    name, _method, seed, persona = parse_run(run)
    return f"{name}-s{seed}-{persona}"


def report(rows: list[Row], args: argparse.Namespace) -> None:
    """The table of the runs so far, then per arm: mean change over its seeds, spread, worst seed."""
    print()
    print(
        f"{'run':<30}{'base':>7}{'trained':>9}{'change':>8}{'loop':>6}{'updates':>8}{'to learn':>9}"
        f"{'agree':>7}{'minutes':>9}{'samples':>9}{'per hour':>10}"
    )
    for r in rows:
        learned = "-" if r.sessions_to_learn is None else str(r.sessions_to_learn)
        agree = "-" if r.judge_agreement is None else f"{r.judge_agreement:.2f}"
        loop = "-" if r.looping is None else f"{r.looping:.2f}"
        print(
            f"{r.run:<30}{r.base:>7.3f}{r.trained:>9.3f}{r.change:>+8.3f}{loop:>6}{r.updates:>8}{learned:>9}"
            f"{agree:>7}{r.wall_s / 60:>9.1f}{r.samples:>9}{r.per_hour:>10.0f}"
        )
    print(f"\n{'arm':<30}{'seeds':>6}{'mean change':>13}{'spread':>8}{'worst':>8}{'per hour':>10}")
    for arm in dict.fromkeys(r.arm for r in rows):
        changes = [r.change for r in rows if r.arm == arm]
        spread = statistics.stdev(changes) if len(changes) > 1 else 0.0
        per_hour = statistics.fmean(r.per_hour for r in rows if r.arm == arm)
        print(
            f"{arm:<30}{len(changes):>6}{statistics.fmean(changes):>+13.3f}{spread:>8.3f}{min(changes):>+8.3f}"
            f"{per_hour:>10.0f}"
        )
    any_default = any(r.arm.startswith(DEFAULT) for r in rows)
    # default runs train the shipped config's size, not --updates / --batch: said only for the others
    size = (
        []
        if all(r.arm.startswith(DEFAULT) for r in rows)
        else [
            f"up to {args.updates} updates of batch {args.batch} per run"
            + (f" (not the {DEFAULT} runs)" if any_default else "")
        ]
    )
    parts = [
        *size,
        *([f"training capped at {args.max_minutes:g} min"] if args.max_minutes else []),
        *(f"{sec}.{key} = {value}" for sec, key, value in args.set),
    ]
    said = ", ".join(parts) + (default_note() if any_default else "")
    print(
        f"\n({said.removeprefix('; ')}" + f"; n={args.chat_n} held-out problems, one "
        f"problem moves a score by {1 / args.chat_n:.3f} at most; spread = sample standard deviation "
        f"over seeds; loop = share of the trained policy's held-out replies that loop, which score 0; agree = mean "
        f"judge-persona agreement per update; live evaluations of {args.live_n} "
        f"problems every {args.sync} updates)",
        flush=True,
    )


def rescore(work: Path, rows: list[Row], args: argparse.Namespace) -> list[Row]:
    """``rows`` with base and trained scores taken again by the current scorer (each base once per
    persona); the old and new figures of each run are printed as they come."""
    bases: dict[str, float] = {}
    out = []
    for r in rows:
        conf = work / f"{run_label(r.run)}.toml"
        persona = parse_run(r.run)[3]
        if persona not in bases:
            bases[persona] = score(conf, None, args.chat_n, args.max_tokens)
            print(f"base model: held-out {persona} personalisation = {bases[persona]:.3f} (n={args.chat_n})")
        after = score_detail(conf, final_policy(conf), args.chat_n, args.max_tokens)
        trained, looping = float(after["personalization"]), float(after["looping"])
        new = Row(**{**asdict(r), "base": bases[persona], "trained": trained, "looping": looping})
        print(
            f"{r.run}: was {r.base:.3f} -> {r.trained:.3f} ({r.change:+.3f}), now {new.base:.3f} -> "
            f"{new.trained:.3f} ({new.change:+.3f}); looping replies {new.looping:.2f}",
            flush=True,
        )
        out.append(new)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arms", default="combined,binary,opd,combined-lockstep", help="methods, each over --seeds"
    )
    ap.add_argument("--seeds", default="42,7,1", help="seeds of every arm (student persona)")
    ap.add_argument(
        "--teacher-seeds", default="42,7,1", help="seeds of the combined arm on the teacher persona"
    )
    ap.add_argument(
        "--runs", help="instead of arms x seeds: comma-separated method[-lockstep]:seed[@persona]"
    )
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--sync", type=int, default=4, help="weight_sync_interval (and the live eval's interval)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4, help="episodes per task (group-relative advantages)")
    ap.add_argument("--chat-n", type=int, default=32, help="held-out problems scored before and after")
    ap.add_argument(
        "--live-n", type=int, default=8, help="held-out problems of each live evaluation (0 = off)"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default="gsm8k", help="packaged data set name or JSON file")
    ap.add_argument("--keep", help="keep run directories here instead of a temp dir")
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=25.0,
        help="stop a run's training after this long (it is scored with the updates it made); a Binary "
        "RL run on a persona the base never satisfies may get no sample at all and needs the cap",
    )
    add_set_option(
        ap,
        "a setting of every run, over what the options set: a [training] key, e.g. --set opd_reference=proximal, "
        "or SECTION.KEY, e.g. --set prm_service.teacher_topk=8 (repeatable)",
    )
    ap.add_argument(
        "--report",
        metavar="DIR",
        type=kept_work_dir,
        help="print the tables of a kept work directory (--keep) again, run nothing",
    )
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="with --report: score the base and every kept run's final policy again with the current "
        "scorer, on the same problems at the run's --max-tokens (saved from this version on; else give it)",
    )
    args = ap.parse_args()
    if args.report:
        work = Path(args.report)
        saved = json.loads((work / "learning.json").read_text())
        kept = [Row(**r) for r in saved["rows"]]
        args.updates, args.batch, args.chat_n = saved["updates"], saved["batch"], saved["n"]
        args.sync = saved.get("sync", args.sync)
        args.live_n = saved.get("live_n", args.live_n)
        args.max_minutes = saved.get("max_minutes", args.max_minutes)
        args.max_tokens = saved.get("max_tokens", args.max_tokens)
        args.set = [tuple(kv) for kv in saved.get("set", [])]
        if args.rescore:
            kept = rescore(work, kept, args)
        report(kept, args)
        health_report(work, kept)
        return 0
    if args.runs:
        runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    else:
        seeds = [s.strip() for s in args.seeds.split(",") if s.strip()]
        teacher = [s.strip() for s in args.teacher_seeds.split(",") if s.strip()]
        # seed by seed, every arm in turn: a bench stopped early has compared the arms on the same seeds
        runs = [f"{arm}:{seed}" for seed in seeds for arm in args.arms.split(",")]
        runs += [f"combined:{seed}@teacher" for seed in teacher]
    parsed = {r: parse_run(r) for r in runs}

    work = Path(args.keep or tempfile.mkdtemp(prefix="ocl-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    bases: dict[str, float] = {}
    for persona in dict.fromkeys(p for *_, p in parsed.values()):
        first = next(r for r, (*_, p) in parsed.items() if p == persona)
        bases[persona] = score(write_config(work, first, args), None, args.chat_n, args.max_tokens)
        print(
            f"base model: held-out {persona} personalisation = {bases[persona]:.3f} (n={args.chat_n})",
            flush=True,
        )
    rows: list[Row] = []
    for run in runs:
        name, _method, seed, persona = parsed[run]
        conf = write_config(work, run, args)
        wall, trained = train(conf, conf.with_suffix(".log"), args.max_minutes)
        detail = score_detail(conf, final_policy(conf), args.chat_n, args.max_tokens)
        after = float(detail["personalization"])
        learned = sessions_to_learn(load_config(conf).log_dir)
        base = bases[persona]
        done = updates_done(conf)
        rows.append(
            Row(
                run,
                f"{name}@{persona}",
                seed,
                base,
                after,
                wall,
                trained,
                learned,
                run_agreement(conf),
                done,
                float(detail["looping"]),
            )
        )
        print(
            f"{run}: {base:.3f} -> {after:.3f} after {done} updates ({trained} samples, "
            f"{wall / 60:.1f} min, sessions to learn {learned if learned is not None else '-'})",
            flush=True,
        )
        (work / "learning.json").write_text(
            json.dumps(
                {
                    "bases": bases,
                    "updates": args.updates,
                    "batch": args.batch,
                    "n": args.chat_n,
                    "sync": args.sync,
                    "live_n": args.live_n,
                    "max_minutes": args.max_minutes,
                    "max_tokens": args.max_tokens,
                    "set": args.set,
                    "rows": [asdict(r) for r in rows],
                },
                indent=2,
            )
        )
        report(rows, args)  # after every run: a bench stopped early still leaves its table
        health_report(work, rows)
    print(f"total {(time.monotonic() - t0) / 60:.1f} min on {os.cpu_count()} cores; runs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
