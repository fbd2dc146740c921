"""Judge accuracy and throughput on two held-out labelled sets, before and after, side by side.

Held-out sets (never trained on; the script checks that no line — compared case- and
punctuation-insensitively — is shared with the training lines in ``openclaw_rl/judge/data``):

* **old** — the 67 cases below (chat, terminal, tool calls), written separately from the training lines;
* **new** — ``bench/data/judge_heldout_v2.jsonl``: 244 cases over every role the judge sees (user,
  tool, environment incl. GUI pages, system), each with a ``kind`` (correction, redirect, praise,
  off_topic, silent_success, shell_error, traceback, http_error, test_summary, page_change, ...),
  written before the training lines were read or grown.

It prints, in one run, the embedded ``minilm`` judge's accuracy per role with ``vote_count`` 1 and 3
on both sets for

* **before** — the judge as of each commit in ``BEFORE_COMMITS`` (its ``minilm.py``, its
  ``evidence.py`` when it had one, and its training data, read with ``git show``): 4657cd5, the
  classifier only; f94c555, evidence rules + the English all-MiniLM-L6-v2 classifier;
* **after** — the current judge (evidence rules, then the classifier on multilingual USE embeddings),

then per-kind accuracy on the new set, how much the evidence rules decide, how close the held-out
cases come to a training line (MiniLM cosine), and judged turns per second. With ``--local`` it
adds the ``local`` LLM judge (SmolLM2-135M-Instruct by default; ``--local-model DIR``) for comparison.

Usage::

    .venv/bin/python bench/judge.py [--repeats 5] [--local] [--local-model DIR] [--threads 2]
        [--json FILE] | tee bench/results/judge.txt
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import Config, PrmServiceConfig  # noqa: E402
from openclaw_rl.judge.evidence import read_evidence  # noqa: E402
from openclaw_rl.judge.minilm import load_examples  # noqa: E402
from openclaw_rl.types import NextState  # noqa: E402

#: Earlier judges: before the evidence rules / new recipe / grown training data (classifier only),
#: and the English MiniLM judge with evidence rules that the multilingual encoder replaced.
BEFORE_COMMITS = {
    "4657cd5d36f4": "classifier only",
    "f94c55549a30": "MiniLM + evidence",
}
BEFORE_COMMIT = next(iter(BEFORE_COMMITS))  # the oldest (kept for callers of the single-commit era)
NEW_SET = ROOT / "bench" / "data" / "judge_heldout_v2.jsonl"
ROLES = ("user", "tool", "environment", "system")

# The old held-out set: (style, role, response, next_state, expected score)
CASES: list[tuple[str, str, str, str, int]] = [
    # ---------------------------------------------------------------- chat: positive
    (
        "chat",
        "user",
        "Natalia sold 48 clips in April and half as many in May, so 72 in total.",
        "Yes, 72 is what I got too. Can we do the next one?",
        1,
    ),
    (
        "chat",
        "user",
        "Here is a friendlier version of your email to the landlord.",
        "This is great, I'm sending it now. Thanks a lot!",
        1,
    ),
    (
        "chat",
        "user",
        "The function now handles empty lists by returning 0.",
        "works now, appreciate it. could you also add type hints?",
        1,
    ),
    (
        "chat",
        "user",
        "Your meeting is scheduled for Tuesday at 10am.",
        "perfect, and put a reminder the day before please",
        1,
    ),
    (
        "chat",
        "user",
        "Photosynthesis turns light, water and CO2 into sugar and oxygen.",
        "oh that makes sense now. what about respiration?",
        1,
    ),
    (
        "chat",
        "user",
        "I've drafted the cover letter in a warm, plain style.",
        "that reads like me, nice. ok now the thank-you note",
        1,
    ),
    (
        "chat",
        "user",
        "Half of 350 is 175, minus 40 leaves 135 dollars.",
        "right on. I'll move to question 5",
        1,
    ),
    (
        "chat",
        "user",
        "Sure — the train takes 2.5 hours, so you arrive at 4:30pm.",
        "great thanks, that helps me plan",
        1,
    ),
    (
        "chat",
        "user",
        "Renamed the variables to snake_case throughout.",
        "looks clean. thanks, can you commit it?",
        1,
    ),
    ("chat", "user", "Here's the recipe scaled to 6 servings.", "exactly what I wanted, cheers!", 1),
    ("chat", "user", "The answer is 9 pencils left.", "correct, well done! next question please", 1),
    (
        "chat",
        "user",
        "I summarised the article in two short paragraphs.",
        "much clearer than the original, thank you",
        1,
    ),
    # ---------------------------------------------------------------- chat: negative
    (
        "chat",
        "user",
        "**Step 1:** Multiply 12 by 4.\n**Step 2:** Add 7.\n**Answer: 55**",
        "you sound like a textbook. drop the bold and the numbered steps, just talk to me",
        -1,
    ),
    (
        "chat",
        "user",
        "1. Open the app\n2. Tap settings\n3. Choose privacy",
        "ugh lists again. can you write this as normal sentences?",
        -1,
    ),
    ("chat", "user", "The total cost is $45.", "no, that's off — you forgot the tax, it should be more", -1),
    (
        "chat",
        "user",
        "Here's a 600-word overview of the French Revolution...",
        "way too much, I need like two sentences",
        -1,
    ),
    (
        "chat",
        "user",
        "Dear Sir or Madam, I hereby wish to inform you...",
        "too stiff. sound like a normal person please",
        -1,
    ),
    (
        "chat",
        "user",
        "She has 14 marbles left.",
        "that's not it. re-read it: she gives away a third, not 3",
        -1,
    ),
    ("chat", "user", "Sure! 😊 Here you go! 🎉", "please cut the emojis", -1),
    ("chat", "user", "In JavaScript you can use Array.map for that.", "I'm writing Rust though, not JS", -1),
    ("chat", "user", "The capital of Australia is Sydney.", "wrong. it's Canberra", -1),
    (
        "chat",
        "user",
        "Here is the table of results you asked for.",
        "let me say it differently: I want just the biggest number, nothing else",
        -1,
    ),
    (
        "chat",
        "user",
        "I apologize for the confusion! Let me try again. I apologize...",
        "enough apologising, just fix the answer",
        -1,
    ),
    (
        "chat",
        "user",
        "# Summary\n## Key points\n- point one",
        "no headings, it's a text message to my mom",
        -1,
    ),
    ("chat", "user", "The recipe needs 3 cups of flour.", "that doesn't match what I asked. do it again", -1),
    ("chat", "user", "Here's the code in Java.", "I said Go. redo it in Go", -1),
    # ---------------------------------------------------------------- chat: neutral
    ("chat", "user", "The answer is 35 minutes.", "btw do you know any good pizza places?", 0),
    ("chat", "user", "Sure, here is the poem.", "hmm ok", 0),
    ("chat", "user", "That function returns a list.", "gotta run, talk later", 0),
    ("chat", "user", "Paris is the capital of France.", "what's your name?", 0),
    ("chat", "user", "Here is the schedule.", "hang on, someone's at the door", 0),
    ("chat", "user", "The sum is 12.", "random question — is a tomato a fruit?", 0),
    # ---------------------------------------------------------------- terminal: positive
    (
        "terminal",
        "tool",
        "ls -la /var/log",
        "total 48\ndrwxr-xr-x  2 root root 4096 syslog\n[exit code 0]",
        1,
    ),
    ("terminal", "tool", "python3 solve.py", "answer: 156\n[exit code 0]", 1),
    ("terminal", "tool", "pytest tests/test_io.py", "===== 14 passed in 1.02s =====\n[exit code 0]", 1),
    (
        "terminal",
        "tool",
        "git status",
        "On branch main\nnothing to commit, working tree clean\n[exit code 0]",
        1,
    ),
    ("terminal", "tool", "du -sh data", "1.3G\tdata\n[exit code 0]", 1),
    ("terminal", "tool", "node build.js", "Build complete: dist/app.js (42 kB)\n[exit code 0]", 1),
    ("terminal", "tool", "head -n 2 users.csv", "id,name\n1,Ana\n[exit code 0]", 1),
    ("terminal", "tool", "cp a.txt b.txt && echo copied", "copied\n[exit code 0]", 1),
    # ---------------------------------------------------------------- terminal: negative
    ("terminal", "tool", "pyton3 solve.py", "bash: pyton3: command not found\n[exit code 127]", -1),
    (
        "terminal",
        "tool",
        "python3 solve.py",
        "Traceback (most recent call last):\n  File \"solve.py\", line 9\nNameError: name 'totl' is not defined\n[exit code 1]",
        -1,
    ),
    (
        "terminal",
        "tool",
        "pytest",
        "E   AssertionError: expected 5, got 4\n===== 1 failed, 9 passed =====\n[exit code 1]",
        -1,
    ),
    ("terminal", "tool", "cat config.yml", "cat: config.yml: No such file or directory\n[exit code 1]", -1),
    ("terminal", "tool", "gcc main.c", "main.c:12:5: error: unknown type name 'strin'\n[exit code 1]", -1),
    (
        "terminal",
        "tool",
        "chmod 777 /root",
        "chmod: changing permissions of '/root': Operation not permitted\n[exit code 1]",
        -1,
    ),
    (
        "terminal",
        "tool",
        "ssh build@host",
        "ssh: connect to host host port 22: Connection timed out\n[exit code 255]",
        -1,
    ),
    (
        "terminal",
        "tool",
        "pip install nump",
        "ERROR: No matching distribution found for nump\n[exit code 1]",
        -1,
    ),
    (
        "terminal",
        "tool",
        "tar xf backup.tar",
        "tar: backup.tar: Cannot open: No such file or directory\n[exit code 2]",
        -1,
    ),
    # ---------------------------------------------------------------- terminal: neutral
    # A silent success: relabelled 0 -> +1 (empty output with exit 0 is progress; docs/judge.md).
    ("terminal", "tool", "sleep 2", "[exit code 0]", 1),
    # ---------------------------------------------------------------- tool calls: positive
    ("tool_call", "tool", "get_weather(city='Oslo')", '{"city": "Oslo", "temp_c": -3, "sky": "snow"}', 1),
    ("tool_call", "tool", "calculator(expression='17*23')", '{"value": 391}', 1),
    (
        "tool_call",
        "tool",
        "send_message(to='tom', text='running late')",
        '{"delivered": true, "id": "m_771"}',
        1,
    ),
    (
        "tool_call",
        "tool",
        "create_event(title='Dentist', date='2025-03-04')",
        '{"event_id": 5521, "status": "created"}',
        1,
    ),
    ("tool_call", "tool", "read_file(path='notes.md')", '"# Notes\\n- buy milk\\n- call Ana"', 1),
    (
        "tool_call",
        "tool",
        "search_flights(from='LIS', to='BER')",
        '{"flights": [{"no": "TP540", "price": 129}]}',
        1,
    ),
    ("tool_call", "tool", "write_file(path='out.txt', content='hi')", "wrote 2 bytes to out.txt", 1),
    (
        "tool_call",
        "tool",
        "convert_currency(amount=10, to='JPY')",
        '{"amount": 1612.4, "currency": "JPY"}',
        1,
    ),
    # ---------------------------------------------------------------- tool calls: negative
    ("tool_call", "tool", "get_weather(town='Oslo')", 'Error: unexpected keyword argument "town"', -1),
    ("tool_call", "tool", "calculator(expression='17*/23')", "SyntaxError: invalid syntax at position 3", -1),
    (
        "tool_call",
        "tool",
        "read_file(path='/secret/keys')",
        "PermissionError: access to /secret/keys is not allowed",
        -1,
    ),
    ("tool_call", "tool", "send_mesage(to='tom')", '{"error": "no such tool: send_mesage"}', -1),
    (
        "tool_call",
        "tool",
        "create_event(date='next tuesday')",
        '{"error": "date: expected ISO 8601 format"}',
        -1,
    ),
    (
        "tool_call",
        "tool",
        "fetch_url(url='http://intranet/x')",
        "ConnectionError: Max retries exceeded with url: /x",
        -1,
    ),
    (
        "tool_call",
        "tool",
        "db_query(sql='SELEC * FROM t')",
        'sqlite3.OperationalError: near "SELEC": syntax error',
        -1,
    ),
    (
        "tool_call",
        "tool",
        "divide(a=4, b=0)",
        "Traceback (most recent call last):\nZeroDivisionError: float division by zero",
        -1,
    ),
    # ---------------------------------------------------------------- tool calls: neutral
    ("tool_call", "tool", "start_export(table='orders')", '{"job": "exp-12", "state": "queued"}', 0),
]


def load_new_set(path: Path = NEW_SET) -> list[dict]:
    """The new held-out set: ``{"role", "next_state", "label", "kind", "style"}`` per line."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for n, r in enumerate(rows, 1):
        if (
            r.get("role") not in ROLES
            or r.get("label") not in (1, -1, 0)
            or not r.get("next_state")
            or not r.get("kind")
        ):
            raise SystemExit(f"{path}:{n}: needs role, next_state, label (1/-1/0) and kind")
    return rows


def held_out_sets() -> dict[str, list[dict]]:
    old = [{"role": c[1], "next_state": c[3], "label": c[4], "kind": c[0], "response": c[2]} for c in CASES]
    return {"old": old, "new": load_new_set()}


def normalize(text: str) -> str:
    """Case-, whitespace- and punctuation-insensitive form used for the disjointness check."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def overlap(training: list[str], sets: dict[str, list[dict]]) -> list[str]:
    """Held-out next states that also appear (normalized) among the training lines."""
    train = {normalize(t) for t in training}
    return [c["next_state"] for cases in sets.values() for c in cases if normalize(c["next_state"]) in train]


def check_held_out(sets: dict[str, list[dict]]) -> None:
    """Fail loudly if a held-out case also appears in the training data."""
    shared = overlap([e.next_state for e in load_examples()], sets)
    if shared:
        raise SystemExit(f"held-out cases overlap the training data: {shared}")


# ------------------------------------------------------------------------------ the "before" judge
def _git_show(path: str, commit: str = BEFORE_COMMIT) -> str:
    return subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def before_factory(commit: str = BEFORE_COMMIT) -> Callable[[Config], object] | None:
    """A factory for the judge as of ``commit`` (its minilm.py, its evidence.py if it had one, and its
    training lines), or None when git or the commit is not available."""
    try:
        source = _git_show("openclaw_rl/judge/minilm.py", commit)
        try:
            evidence_source = _git_show("openclaw_rl/judge/evidence.py", commit)
        except subprocess.CalledProcessError:
            evidence_source = None
        names = subprocess.run(
            ["git", "ls-tree", "--name-only", commit, "openclaw_rl/judge/data/"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        tmp = Path(tempfile.mkdtemp(prefix="judge_before_"))
        paths = []
        for name in names:
            if name.endswith(".jsonl"):
                paths.append(tmp / Path(name).name)
                paths[-1].write_text(_git_show(name, commit))
    except (OSError, subprocess.CalledProcessError):
        return None
    if evidence_source is not None:  # that commit's evidence rules, not today's
        ev_name = f"openclaw_rl.judge._evidence_{commit[:7]}"
        ev_mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(ev_name, loader=None))
        sys.modules[ev_name] = ev_mod
        exec(compile(evidence_source, f"{commit[:7]}:openclaw_rl/judge/evidence.py", "exec"), ev_mod.__dict__)
        source = source.replace("from openclaw_rl.judge.evidence import", f"from {ev_name} import")
    spec = importlib.util.spec_from_loader(f"openclaw_rl.judge._minilm_{commit[:7]}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    exec(compile(source, f"{commit[:7]}:openclaw_rl/judge/minilm.py", "exec"), mod.__dict__)
    examples = mod.load_examples(paths)
    mod.load_examples = lambda paths=None: examples  # its StateClassifier trains on its own lines
    mod.BEFORE_TRAINING_LINES = len(examples)
    return lambda cfg: mod.MiniLMJudge(cfg)


def after_factory(cfg: Config) -> object:
    from openclaw_rl.judge import make_judge

    return make_judge(cfg)


# ------------------------------------------------------------------------------ running
async def run_judge(
    make: Callable[[Config], object], cfg: Config, votes: int, cases: list[dict], seed: int = 42
) -> tuple[list[int | None], float, int]:
    """Judge every case with ``votes`` votes: (scores, seconds, hints kept)."""
    cfg = cfg.model_copy(
        update={
            "prm_service": cfg.prm_service.model_copy(update={"vote_count": votes}),
            "global_": cfg.global_.model_copy(update={"seed": seed}),
        }
    )
    judge = make(cfg)
    await judge.score("warm-up", NextState(role="user", content="warm-up"))
    start = time.perf_counter()
    scores: list[int | None] = []
    hints = 0
    for c in cases:
        result = await judge.score(
            c.get("response", "(previous assistant action)"),
            NextState(role=c["role"], content=c["next_state"]),
        )
        scores.append(None if result.error else result.score)
        hints += result.hint is not None
    elapsed = time.perf_counter() - start
    await judge.close()
    return scores, elapsed, hints


def accuracy(
    scores: list[int | None], cases: list[dict], key: str | None = None, value: str | None = None
) -> float | None:
    pairs = [(s, c["label"]) for s, c in zip(scores, cases, strict=True) if key is None or c[key] == value]
    return sum(s == e for s, e in pairs) / len(pairs) if pairs else None


def sign_errors(scores: list[int | None], cases: list[dict]) -> int:
    """Cases judged with the opposite sign (+1 for a -1 case or the reverse): worse than a 0."""
    return sum(1 for s, c in zip(scores, cases, strict=True) if s is not None and s * c["label"] == -1)


def fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:5.2f}"


def mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def near_duplicates(sets: dict[str, list[dict]], threshold: float = 0.9) -> dict[str, int]:
    """How many held-out cases have a training line with MiniLM cosine >= ``threshold``."""
    from openclaw_rl.judge.minilm import Embedder

    emb = Embedder()
    train = emb.encode([e.next_state for e in load_examples()])
    out = {}
    for name, cases in sets.items():
        sims = emb.encode([c["next_state"] for c in cases]) @ train.T
        out[name] = int((sims.max(dim=1).values >= threshold).sum())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local", action="store_true", help="also run the local LLM judge (slow on a CPU)")
    ap.add_argument(
        "--skip-local", action="store_true", help=argparse.SUPPRESS
    )  # the old default; now a no-op
    ap.add_argument("--local-model", default="smollm2-135m-instruct", help="model for the local backend")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="runs per figure with different vote-sampling seeds; figures are their mean",
    )
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--no-before", action="store_true", help="skip the earlier judges (only 'after')")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    sets = held_out_sets()
    check_held_out(sets)
    figures: dict[str, object] = {}
    for name, cases in sets.items():
        labels = Counter(c["label"] for c in cases)
        roles = Counter(c["role"] for c in cases)
        base = max(labels.values()) / len(cases)
        print(
            f"held-out {name}: {len(cases)} cases, roles {dict(roles)}, labels {dict(labels)}, "
            f"majority-class rate {base:.2f}"
        )
        figures[f"{name}_cases"] = len(cases)
    print(f"training lines: {len(load_examples())} now; no held-out case shares a line with them")
    dups = near_duplicates(sets)
    print(f"held-out cases with a training line at MiniLM cosine >= 0.9: {dups}")
    for name, cases in sets.items():
        ev = [read_evidence(c["role"], c["next_state"]) for c in cases]
        decided = [(e.score, c["label"]) for e, c in zip(ev, cases, strict=True) if e.decisive]
        right = sum(s == lab for s, lab in decided)
        print(f"evidence rules decide {len(decided)}/{len(cases)} of held-out {name} ({right} of them right)")
    print()

    rows: list[tuple[str, Callable[[Config], object], Config]] = []
    for commit in () if args.no_before else BEFORE_COMMITS:
        before = before_factory(commit)
        if before is None:
            print(f"before: commit {commit[:7]} not available (no git history); skipped")
        else:
            rows.append(
                (f"before ({commit[:7]})", before, Config(prm_service=PrmServiceConfig(backend="minilm")))
            )
    rows.append(("after", after_factory, Config(prm_service=PrmServiceConfig(backend="minilm"))))
    if args.local:
        # Evaluative accuracy only: generating hints with an LLM on a CPU would dominate the run.
        rows.append(
            (
                "local LLM",
                after_factory,
                Config(
                    prm_service=PrmServiceConfig(
                        backend="local", model=args.local_model, extract_instruction=False
                    )
                ),
            )
        )

    print(
        f"accuracy per role; each figure is the mean of {args.repeats} runs with different vote-sampling "
        f"seeds (range of 'all' in brackets); sign errors = +1 for a -1 case or the reverse, mean per run"
    )
    header = (
        f"{'judge':18s} {'votes':>5s} | {'set':4s} {'all':>5s} {'(range)':>11s} "
        + " ".join(f"{r[:5]:>5s}" for r in ROLES)
        + f" {'sign-errors':>11s} {'turns/s':>8s}"
    )
    print(header)
    print("-" * len(header))
    per_kind: dict[str, dict[str, float | None]] = defaultdict(dict)
    for label, make, cfg in rows:
        t0 = time.perf_counter()
        for votes in (1, 3):
            for name, cases in sets.items():
                runs = [
                    asyncio.run(run_judge(make, cfg, votes, cases, seed=42 + k)) for k in range(args.repeats)
                ]
                accs = [accuracy(r[0], cases) for r in runs]
                acc = mean(accs)
                roles = {r: mean([accuracy(run[0], cases, "role", r) for run in runs]) for r in ROLES}
                signs = mean([sign_errors(r[0], cases) for r in runs])
                rate = len(cases) * len(runs) / sum(r[1] for r in runs)
                spread = f"({min(accs):.2f}-{max(accs):.2f})"
                print(
                    f"{label:18s} {votes:5d} | {name:4s} {fmt(acc)} {spread:>11s} "
                    + " ".join(fmt(roles[r]) for r in ROLES)
                    + f" {signs:11.1f} {rate:8.1f}",
                    flush=True,
                )
                figures[f"{label}_v{votes}_{name}"] = {
                    "accuracy": acc,
                    "accuracy_runs": accs,
                    "per_role": roles,
                    "turns_per_s": rate,
                    "sign_errors": signs,
                    "hints": mean([r[2] for r in runs]),
                }
                if name == "new" and votes == 3:
                    for kind in sorted({c["kind"] for c in cases}):
                        per_kind[kind][label] = mean([accuracy(r[0], cases, "kind", kind) for r in runs])
        print(
            f"{label:18s} wall time incl. model load / head set-up: {time.perf_counter() - t0:.1f}s",
            flush=True,
        )

    print(f"\nnew held-out set, accuracy per kind (vote_count 3, mean of {args.repeats} runs):")
    labels = [r[0] for r in rows]
    counts = Counter(c["kind"] for c in sets["new"])
    print(f"{'kind':18s} {'n':>3s} " + " ".join(f"{lab[:18]:>18s}" for lab in labels))
    for kind in sorted(per_kind):
        print(
            f"{kind:18s} {counts[kind]:3d} "
            + " ".join(f"{fmt(per_kind[kind].get(lab)):>18s}" for lab in labels)
        )
    figures["per_kind_new_v3"] = per_kind
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
