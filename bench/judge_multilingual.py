"""Embedded judge accuracy on the multilingual / terse / tool-JSON / long-log held-out set.

What it measures: the current ``minilm`` judge (evidence rules, then the embedding classifier, built
exactly as ``bench/judge.py`` builds it) on ``bench/data/judge_heldout_v3.jsonl`` — 263 cases written
without reading the judge's training lines: Chinese and code-switched Chinese-English, Spanish,
German, French and Japanese user replies, terse / emoji / sarcastic English, "negative words with a
positive meaning", corrections inside thanks, tool JSON results that confirm or contradict the
agent's stated action, and 20-60 line build / test / install logs ending in success or failure.

``bench/data/judge_heldout_v4.jsonl`` (``--set``) is a second, smaller set (68 cases) written after
the judge's last change, to check how far the v3 figures carry (docs/judge.md).

Every line has ``lang``, ``style``, ``role``, ``response``, ``next_state`` and ``label`` (+1 / -1 / 0).
A 0 answer counts as wrong when the label is ±1 (and vice versa); an error answer counts as wrong.

It prints accuracy overall and per language, per role and per style (each figure is the mean over
``--repeats`` runs with different vote-sampling seeds, at ``--votes`` votes, 3 by default), the
share of 0 answers and of sign errors (+1 for a -1 case or the reverse), the confusion of label vs
answer (counts summed over the runs), how many cases the evidence rules decide, a disjointness
check against the training lines (exact, case- and punctuation-insensitive; and MiniLM cosine >= 0.9)
and the cases judged wrong in most runs.

Usage::

    .venv/bin/python bench/judge_multilingual.py [--set FILE] [--votes 3] [--repeats 3] [--threads 2]
        | tee bench/results/judge_multilingual_before.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import judge as bench_judge  # noqa: E402  (bench/judge.py: the judge factory and the run loop)

from openclaw_rl.config import Config, PrmServiceConfig  # noqa: E402
from openclaw_rl.judge.evidence import read_evidence  # noqa: E402
from openclaw_rl.judge.minilm import load_examples  # noqa: E402

SET = ROOT / "bench" / "data" / "judge_heldout_v3.jsonl"
KEYS = ("lang", "style", "role", "response", "next_state", "label")
LANG_ORDER = ("zh", "zh-en", "es", "de", "fr", "ja", "en")
ANSWERS = (1, -1, 0, None)  # None: the judge returned an error


def load_set(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in KEYS if k not in row]
        if missing or row["label"] not in (1, -1, 0) or row["role"] not in bench_judge.ROLES:
            raise SystemExit(f"{path}:{n}: needs {', '.join(KEYS)} with label 1/-1/0 (missing {missing})")
        rows.append(row)
    return rows


def judge_version() -> str:
    """HEAD commit, and whether the judge's code or training lines differ from it in the work tree."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "openclaw_rl/judge"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    changed = sorted(line[3:] for line in dirty if line.strip())
    return f"HEAD {head}" + (
        f", uncommitted changes in {', '.join(changed)}" if changed else ", judge files clean"
    )


def fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def group_table(
    title: str, key: str, cases: list[dict], runs: list[list[int | None]], order: tuple[str, ...] = ()
) -> None:
    """One line per value of ``key``: n, label balance, accuracy (mean over runs), 0-rate, sign errors."""
    values = sorted({c[key] for c in cases}, key=lambda v: (order.index(v) if v in order else len(order), v))
    print(f"\n{title}")
    header = (
        f"{key:32s} {'n':>4s} {'+1':>4s} {'-1':>4s} {'0':>3s} | {'acc':>5s} {'acc+1':>5s} {'acc-1':>5s} "
        f"{'zero':>5s} {'sign':>5s}"
    )
    print(header)
    print("-" * len(header))
    for v in (*values, None):
        idx = [i for i, c in enumerate(cases) if v is None or c[key] == v]
        name = "ALL" if v is None else str(v)
        labels = Counter(cases[i]["label"] for i in idx)

        def acc(sub: list[int]) -> float | None:
            if not sub:
                return None
            return sum(run[i] == cases[i]["label"] for run in runs for i in sub) / (len(sub) * len(runs))

        zero = sum(run[i] == 0 for run in runs for i in idx) / (len(idx) * len(runs))
        sign = sum(run[i] is not None and run[i] * cases[i]["label"] == -1 for run in runs for i in idx) / (
            len(idx) * len(runs)
        )
        pos = [i for i in idx if cases[i]["label"] == 1]
        neg = [i for i in idx if cases[i]["label"] == -1]
        print(
            f"{name:32s} {len(idx):4d} {labels[1]:4d} {labels[-1]:4d} {labels[0]:3d} | {fmt(acc(idx))} "
            f"{fmt(acc(pos))} {fmt(acc(neg))} {fmt(zero)} {fmt(sign)}"
        )


def confusion(cases: list[dict], runs: list[list[int | None]]) -> None:
    counts = Counter((c["label"], run[i]) for run in runs for i, c in enumerate(cases))
    print(f"\nconfusion, label (rows) vs judge answer (columns), counts summed over {len(runs)} runs:")
    print(f"{'label':>6s} " + " ".join(f"{'err' if a is None else f'{a:+d}':>6s}" for a in ANSWERS))
    for lab in (1, -1, 0):
        print(f"{lab:+6d} " + " ".join(f"{counts[(lab, a)]:6d}" for a in ANSWERS))


def short(text: str, width: int = 70) -> str:
    flat = " ⏎ ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", type=Path, default=SET, help="held-out JSONL file")
    ap.add_argument("--votes", type=int, default=3, help="vote_count")
    ap.add_argument("--repeats", type=int, default=3, help="runs with different vote-sampling seeds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-dups", action="store_true", help="skip the MiniLM near-duplicate check")
    ap.add_argument(
        "--hide-cases",
        action="store_true",
        help="print how many cases were judged wrong, not which (keeps a held-out set unseen)",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    cases = load_set(args.set)
    try:
        shown = args.set.relative_to(ROOT)
    except ValueError:
        shown = args.set
    labels = Counter(c["label"] for c in cases)
    print(f"judge code: {judge_version()}")
    print(
        f"held-out {shown}: {len(cases)} cases, labels {dict(labels)}, "
        f"majority-class rate {max(labels.values()) / len(cases):.2f}"
    )
    print(f"langs {dict(Counter(c['lang'] for c in cases))}")
    print(f"roles {dict(Counter(c['role'] for c in cases))}")

    training = load_examples()
    shared = bench_judge.overlap([e.next_state for e in training], {"v3": cases})
    print(
        f"training lines: {len(training)}; held-out next states equal to one (normalized): {len(shared)}"
        + (f" {shared}" if shared else "")
        + (
            " (emoji-only states normalize to '', like '{}')"
            if any(not bench_judge.normalize(s) for s in shared)
            else ""
        )
    )
    if not args.no_dups:
        dups = bench_judge.near_duplicates({"v3": cases})
        print(f"held-out cases with a training line at MiniLM cosine >= 0.9: {dups['v3']}")
    ev = [read_evidence(c["role"], c["next_state"]) for c in cases]
    decided = [(e.score, c["label"]) for e, c in zip(ev, cases, strict=True) if e.decisive]
    print(
        f"evidence rules decide {len(decided)}/{len(cases)} ({sum(s == lab for s, lab in decided)} of them right)"
    )

    cfg = Config(prm_service=PrmServiceConfig(backend="minilm"))
    runs, seconds = [], 0.0
    for k in range(args.repeats):
        scores, elapsed, _ = asyncio.run(
            bench_judge.run_judge(bench_judge.after_factory, cfg, args.votes, cases, seed=42 + k)
        )
        runs.append(scores)
        seconds += elapsed
    accs = [sum(s == c["label"] for s, c in zip(run, cases, strict=True)) / len(cases) for run in runs]
    print(
        f"\nminilm judge, vote_count {args.votes}, {args.repeats} runs (seeds 42..{41 + args.repeats}): "
        f"accuracy {sum(accs) / len(accs):.3f} (runs {', '.join(f'{a:.3f}' for a in accs)}), "
        f"{len(cases) * len(runs) / seconds:.1f} turns/s"
    )
    print(
        "acc = accuracy (0 counts as wrong for a ±1 label); acc+1 / acc-1 = on the +1 / -1 cases; "
        "zero = share of 0 answers; sign = share answered with the opposite sign"
    )

    group_table("per language", "lang", cases, runs, LANG_ORDER)
    group_table("per role", "role", cases, runs, bench_judge.ROLES)
    group_table("per style", "style", cases, runs)
    confusion(cases, runs)

    wrong = [(sum(run[i] != c["label"] for run in runs), i) for i, c in enumerate(cases)]
    wrong = [(w, i) for w, i in wrong if w * 2 > len(runs)]
    print(
        f"\ncases judged wrong in most runs: {len(wrong)}/{len(cases)} "
        "(label -> answers per run; lang, role, style; next state)"
    )
    if args.hide_cases:
        print("  (not listed: --hide-cases keeps this set held out for the next change)")
        return 0
    for _, i in wrong:
        c = cases[i]
        answers = "/".join("err" if run[i] is None else f"{run[i]:+d}" for run in runs)
        print(
            f"  {c['label']:+d} -> {answers:9s} {c['lang']:5s} {c['role']:11s} {c['style'][:24]:24s} "
            f"{short(c['next_state'])}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
