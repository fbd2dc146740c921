"""Is there a graded reward in the next state? The judge's verdict and its confidence, against the truth.

Binary RL learns only from groups whose attempts got different rewards. On a persona the base model
never fully satisfies, every attempt's next state is a complaint and every majority vote is -1. A
graded reward would rank the attempts anyway; the obvious candidate is the judge's own confidence,
its expected score ``p(+1) - p(-1)``. This reads the turns of finished runs (``bench/learning.py
--keep DIR``), in which the simulated users sent their truth (the persona's preference score) with
each next state, and compares, for every pair of attempts of one group at the same turn whose truth
differs, whether the majority score and the expected score order the pair as the truth does.

    .venv/bin/python bench/reward_signal.py DIR [DIR ...]

A graded reward worth training on orders far more than half of the pairs it decides the right way.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from _args import existing_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import load_config  # noqa: E402
from openclaw_rl.judge.minilm import MiniLMJudge  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402
from openclaw_rl.types import NextState  # noqa: E402


@dataclass(frozen=True)
class Attempt:
    """One judged turn of a group member: its majority score, its truth and its next state."""

    score: int
    truth: float
    state: NextState


@dataclass
class Tally:
    """Pairs with different truth a signal ordered (``decided``) and ordered as the truth does."""

    decided: int = 0
    right: int = 0

    def add(self, a: float, b: float, truth_a: float, truth_b: float) -> None:
        if abs(a - b) <= 1e-6:
            return
        self.decided += 1
        self.right += int((a > b) == (truth_a > truth_b))

    def __str__(self) -> str:
        share = f"{self.right / self.decided:.2f}" if self.decided else "-"
        return f"{self.decided:>8}{self.right:>8}{share:>8}"


def group_attempts(store: Store) -> dict[tuple[str, int], list[Attempt]]:
    """The judged main turns with a truth of every group's finished members, by (group, turn index)."""
    groups: dict[tuple[str, int], list[Attempt]] = {}
    for group in store.group_ids():
        for session_id, _outcome in store.group_episodes(group):
            turns, results = store.judged_turns(session_id)
            for turn in turns:
                state = turn.next_state
                if turn.turn_type != "main" or turn.turn_index not in results or state is None:
                    continue
                if state.truth is not None:
                    attempt = Attempt(results[turn.turn_index].score, state.truth, state)
                    groups.setdefault((group, turn.turn_index), []).append(attempt)
    return groups


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=existing_dir, help="work directories of bench/learning.py --keep")
    args = ap.parse_args()
    print(f"{'run':<36}{'signal':<10}{'decided':>8}{'right':>8}{'share':>8}   corr(signal, truth)")
    for work in map(Path, args.dirs):
        for conf in sorted(work.glob("*.toml")):
            cfg = load_config(conf)
            path = cfg.log_dir / "store.sqlite"
            if not path.is_file():
                continue
            store = Store(path)
            try:
                attempts = group_attempts(store)
            finally:
                store.close()
            judge = MiniLMJudge(cfg)
            majority, expected = Tally(), Tally()
            xs: list[float] = []
            ms: list[float] = []
            ts: list[float] = []
            for members in attempts.values():
                conf_scores = []
                for m in members:
                    p = judge.distribution(m.state)
                    conf_scores.append(p.get(1, 0.0) - p.get(-1, 0.0))
                xs += conf_scores
                ms += [float(m.score) for m in members]
                ts += [m.truth for m in members]
                for (a, ea), (b, eb) in itertools.combinations(zip(members, conf_scores, strict=True), 2):
                    if abs(a.truth - b.truth) <= 1e-9:
                        continue
                    majority.add(a.score, b.score, a.truth, b.truth)
                    expected.add(ea, eb, a.truth, b.truth)
            for name, tally, values in (("majority", majority, ms), ("expected", expected, xs)):
                corr = _corr(values, ts)
                print(
                    f"{conf.stem:<36}{name:<10}{tally}   {'-' if corr is None else f'{corr:+.2f}'} (n={len(ts)})"
                )
    return 0


def _corr(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


if __name__ == "__main__":
    sys.exit(main())
