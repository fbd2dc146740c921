"""Session stitching benchmark: the time to find the session of a request that sends no session id.

A client that sends no ``X-Session-Id`` is continued by its conversation's prefix
(:mod:`openclaw_rl.policy.sessions`): every prefix of the request that ends with an assistant
message is a candidate, each looked up by its key. An agent's request of n messages has about n/2
candidates. Hashed prefix by prefix, the keys cost n² (a 20,000-message body held the service for a
minute); hashed in one pass (:func:`~openclaw_rl.policy.sessions.prefix_digests`), n.

Both are timed side by side in one run, on the same messages, for each ``--messages`` size, and the
keys are checked equal; then ``SessionManager.assign`` as serving calls it (keys plus the store
lookup of the longest remembered prefix), against a store that remembers the conversation's
second-newest prefix, so the lookup finds it.

    .venv/bin/python bench/stitching.py
    .venv/bin/python bench/stitching.py --messages 100,2000,20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _args import positive_ints

from openclaw_rl.policy.protocol import ChatMessage
from openclaw_rl.policy.sessions import SessionManager, canonical, digest, prefix_digests
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import Turn


def conversation(n: int) -> list[ChatMessage]:
    """n alternating user / assistant messages of a few words, ending with the user's."""
    roles = ["user", "assistant"]
    msgs = [
        ChatMessage(role=roles[i % 2], content=f"message {i}: some words of a turn") for i in range(n - 1)
    ]
    return [*msgs, ChatMessage(role="user", content="and the newest question")]


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=positive_ints, default=[100, 1000, 5000], help="request sizes")
    args = ap.parse_args()
    print(f"{'messages':>9} {'per prefix s':>13} {'one pass s':>11} {'ratio':>7} {'assign s':>9}")
    for n in args.messages:
        msgs = conversation(n)
        items = [canonical(m.role, m.text, m.tool_calls) for m in msgs]
        ends = [e for e in range(n, 0, -1) if msgs[e - 1].role == "assistant"]
        one = prefix_digests(items, ends)
        assert one == [digest(items[:e]) for e in ends[:50]] + one[50:]  # spot check before timing
        repeat = 3 if n <= 5000 else 1
        slow = timed(lambda: [digest(items[:e]) for e in ends], repeat)  # noqa: B023
        fast = timed(lambda: prefix_digests(items, ends), repeat)  # noqa: B023
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "store.sqlite")
            sm = SessionManager(store)
            remembered = msgs[: ends[1]]  # the conversation a turn ago: what a stored session would hold
            key = SessionManager.prefix_key(remembered[:-1], remembered[-1].text, None)
            store.record_turn(
                Turn(
                    session_id="s",
                    turn_index=0,
                    messages=[],
                    prompt_ids=[1],
                    response_ids=[2],
                    response_logprobs=[-0.1],
                ),
                prefix_digest=key,
            )
            assign = timed(lambda: sm.assign(msgs, None, None, False), 1)  # noqa: B023
            assert sm.assign(msgs, None, None, False).session_id == "s"  # it found the stored session
            store.close()
        print(f"{n:>9} {slow:>13.3f} {fast:>11.4f} {slow / fast:>6.0f}x {assign:>9.3f}")


if __name__ == "__main__":
    main()
