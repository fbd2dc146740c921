"""``openclaw-rl users list`` against a user with many ratings: does its time grow with the ratings
(linear), or with their square?

``users list`` reads one ``Store.user_stats`` per user. Its feedback count keeps each response's
latest rating only (a re-rated response counts once). The script times ``user_stats`` for one user
with ``--small`` and with ``--large`` ratings of ``--responses-share`` distinct responses each (many
rated more than once), in one run, and prints the ratio of the two times beside the ratio of the two
sizes: about equal when the read is linear, its square when quadratic.

    .venv/bin/python bench/users_list.py
    .venv/bin/python bench/users_list.py --small 2000 --large 20000
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from openclaw_rl.runtime.store import Store


def timed_stats(ratings: int, share: float, seed: int) -> tuple[float, int, int]:
    """Seconds for one ``user_stats`` of a user with ``ratings`` ratings; and its up / down counts."""
    rng = random.Random(seed)
    responses = max(1, int(ratings * share))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite"
        Store(path).close()  # the real schema and indexes
        with sqlite3.connect(path) as db:  # rows written straight in: the read is what is timed
            db.executemany(
                "INSERT INTO feedback(response_id, user, rating, comment, created_at) VALUES (?, ?, ?, ?, ?)",
                [
                    (f"chatcmpl-{rng.randrange(responses)}", "alice", rng.choice((1, -1)), None, float(i))
                    for i in range(ratings)
                ],
            )
        store = Store(path)
        try:
            start = time.perf_counter()
            stats = store.user_stats("alice", "shared")
            return time.perf_counter() - start, stats.feedback_up, stats.feedback_down
        finally:
            store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=1000, help="ratings of the smaller case")
    ap.add_argument("--large", type=int, default=10000, help="ratings of the larger case")
    ap.add_argument("--responses-share", type=float, default=0.8, help="distinct responses per rating")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    small = timed_stats(args.small, args.responses_share, args.seed)
    large = timed_stats(args.large, args.responses_share, args.seed)
    for n, (seconds, up, down) in ((args.small, small), (args.large, large)):
        print(f"{n:7d} ratings: user_stats {seconds * 1000:8.1f} ms  (counted once each: +{up} / -{down})")
    print(
        f"size ratio {args.large / args.small:.0f}x, time ratio {large[0] / small[0]:.1f}x "
        f"(linear: about the size ratio; quadratic: its square, {(args.large / args.small) ** 2:.0f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
