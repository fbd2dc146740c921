"""Store benchmark: how many turns per second the durable store carries through its three hot writes.

Every served turn is one ``record_turn`` commit (the policy service), every judged turn one
``claim_turns`` + one ``save_judgement`` commit (each judge), every trained sample one share of a
``claim_samples`` + ``commit_checkpoint`` (the trainer). Each commit is durable (WAL,
``synchronous=FULL``), so the store has a ceiling in turns/s that no number of GPUs raises; this
script measures it on this machine's disk, with realistic turn sizes (``--prompt`` / ``--response``
tokens, a chat of a few messages).

Phases, timed side by side in one run:

1. ``record``: one process records ``--turns`` turns, each attaching the previous one's next state;
2. ``judge x1``: one judge process claims and saves all ready turns, one at a time;
3. ``judge x2``: the same number of turns, recorded afresh, judged by two processes at once
   (the lease keeps them disjoint) — the ratio to ``judge x1`` is what a second judge adds on the
   store side (SQLite serialises writers, so expect ≤ 1×: judges scale by overlapping their model
   calls, not their commits);
4. ``train``: the trainer claims all samples in batches of 32 and commits a checkpoint after each.

    .venv/bin/python bench/store.py
    .venv/bin/python bench/store.py --turns 2000 --prompt 1024 --response 256
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from _args import positive_int

from openclaw_rl.config import TrainingConfig
from openclaw_rl.judge.sample_rules import build_samples
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import JudgeResult, NextState, Turn


def make_turn(session: str, index: int, prompt: int, response: int) -> Turn:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "word " * (prompt // 2)},
    ]
    return Turn(
        session_id=session,
        turn_index=index,
        messages=messages,
        prompt_ids=list(range(prompt)),
        response_ids=list(range(response)),
        response_logprobs=[-0.5] * response,
        response_text="token " * response,
    )


def record(path: Path, tag: str, n: int, prompt: int, response: int) -> float:
    """Record ``n`` turns in sessions of 4 turns plus a closing turn; returns seconds."""
    store = Store(path)
    start = time.perf_counter()
    for i in range(n):
        sid, idx = f"{tag}-{i // 4}", i % 4
        state = NextState(role="user", content="thanks, next") if idx else None
        store.record_turn(make_turn(sid, idx, prompt, response), next_state_for_previous=state)
        if idx == 3:  # the closing request carries turn 3's next state
            store.record_turn(
                make_turn(sid, 4, prompt, response),
                next_state_for_previous=NextState(role="user", content="bye"),
            )
            store.close_session(sid)
    store.close()
    return time.perf_counter() - start


def judge(path: str, worker: str, start_at: float) -> int:
    """Claim and save turns one at a time until none is due; returns how many this judge saved."""
    store = Store(Path(path))
    training = TrainingConfig()
    while time.time() < start_at:
        time.sleep(0.001)
    done = 0
    while True:
        turns = store.claim_turns(worker, 1, lease_s=600)
        if not turns:
            break
        result = JudgeResult(score=1)
        if store.save_judgement(turns[0], result, build_samples(turns[0], result, training), worker=worker):
            done += 1
    store.close()
    return done


def judge_phase(path: Path, judges: int) -> tuple[float, int]:
    start_at = time.time() + 1.0  # every process opens its store first, then all start together
    with mp.get_context("spawn").Pool(judges) as pool:
        results = [pool.apply_async(judge, (str(path), f"judge-{j}", start_at)) for j in range(judges)]
        counts = [r.get(timeout=3600) for r in results]
        return time.time() - start_at, sum(counts)


def train(path: Path) -> tuple[float, int]:
    store = Store(path)
    start = time.perf_counter()
    step = trained = 0
    while True:
        step += 1
        batch = store.claim_samples(32, step=step, current_version=step - 1)
        if not batch:
            break
        store.commit_checkpoint(step, step)
        trained += len(batch)
    store.close()
    return time.perf_counter() - start, trained


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=positive_int, default=1000)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens per turn")
    ap.add_argument("--response", type=int, default=256, help="response tokens per turn")
    args = ap.parse_args()
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite"
        rows.append(
            (
                "record",
                args.turns + args.turns // 4,
                record(path, "a", args.turns, args.prompt, args.response),
            )
        )
        secs, n1 = judge_phase(path, 1)
        rows.append(("judge x1", n1, secs))
        record(path, "b", args.turns, args.prompt, args.response)
        secs, n2 = judge_phase(path, 2)
        rows.append(("judge x2", n2, secs))
        secs, trained = train(path)
        rows.append(("train", trained, secs))
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
    print(
        f"\nturns={args.turns} prompt={args.prompt} response={args.response} tokens; store {size_mb:.0f} MB"
    )
    print(f"{'phase':>9} {'items':>7} {'seconds':>8} {'items/s':>8}")
    for name, n, secs in rows:
        print(f"{name:>9} {n:>7} {secs:>8.2f} {n / secs:>8.1f}")
    rate = {name: n / secs for name, n, secs in rows}
    print(f"\njudge x2 / judge x1 (store side of a second judge): {rate['judge x2'] / rate['judge x1']:.2f}x")
    slowest = min(rate, key=rate.get)
    print(f"store ceiling on this disk: ~{rate[slowest]:.0f} turns/s (the slowest hot write: {slowest})")


if __name__ == "__main__":
    main()
