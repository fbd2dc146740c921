"""Does the judge read the simulated users right? The judge on the personas' own replies.

Binary RL learns from the judge's reading of the next state; in simulated runs the persona's reply
is the next state, and the persona itself knows whether it was satisfied. This plays real
:class:`~openclaw_rl.envs.chat.ChatEnv` episodes (student and teacher) with a fixed pool of
responses, from ones that break every preference to ones that meet them all, takes the user's
actual reply to each, and has the embedded judge (``[prm_service]`` of the config, ``vote_count``
3) score it. It prints, per persona and per kind of reply (redo, correction, thanks, goodbye), how
often the judge's sign matches the truth (redo / correction: -1; thanks / goodbye: +1), and the
share of complaints the judge scored +1: each one of those is a push toward what the user
complained about.

    .venv/bin/python bench/persona_replies.py [--config configs/local.toml] [--episodes 60]

``--runs DIR [DIR ...]`` reads instead the next states of finished learning runs (``bench/learning.py
--keep DIR``): the replies the personas actually sent to a training policy, with the truth they sent
beside each. Every distinct complaint (truth below 1) is judged again by the judge of ``--config``
and set against the score the run's own judge gave it then: the complaints judged +1, then and now.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from pathlib import Path

from _args import existing_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reward_signal import group_attempts  # noqa: E402

from openclaw_rl.config import Config, load_config  # noqa: E402
from openclaw_rl.envs.chat import ChatEnv  # noqa: E402
from openclaw_rl.envs.loop import SIMULATED_PREFIX  # noqa: E402
from openclaw_rl.judge import make_judge  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402
from openclaw_rl.types import NextState  # noqa: E402

#: Responses from worst to best for the student (markdown + assistant voice ... the student's own).
STUDENT_RESPONSES = (
    "Sure! Here's the solution:\n\n**Step 1:** Let's add the numbers.\n1. 12 + 8 = 20\n\nHope this helps!",
    "Let's solve this step by step. First we add 12 and 8 to get 20. So the answer is 20.",
    "I added 12 and 8 and got 20, then you divide by 2 to get 10.",
    "I added 12 and 8 and got 20. Then I divided by 2 and got 10.",
    "I added the two numbers and got 20, then I divided by 2.\nSo the answer is {answer}.",
)
#: The same for the teacher (curt and vague ... specific, friendly, named, with a next step).
TEACHER_RESPONSES = (
    "Wrong.",
    "Certainly! Here is a comment: the answer is not correct.",
    "{student}, your answer is not correct; the correct answer is {answer}.",
    "Great effort, {student}! Your answer is correct: it is {answer}. Next time, double-check the units.",
)


def kind_of(env: ChatEnv, info: dict, message: str) -> str:
    """What the user's reply is: a redo request, a correction, thanks (satisfied) or a goodbye."""
    if info.get("success") and env.phase == "done":
        return "goodbye"
    if info.get("success"):
        return "thanks"
    if not any(not ok for ok in info.get("preferences", {}).values()):
        return "correction"
    return "redo"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "local.toml"))
    ap.add_argument("--episodes", type=int, default=60, help="episodes per persona")
    ap.add_argument("--show-wrong", action="store_true", help="print the replies the judge read wrong")
    ap.add_argument(
        "--runs", nargs="+", type=existing_dir, help="work directories of bench/learning.py --keep"
    )
    args = ap.parse_args()
    if args.runs:
        return rejudge_runs(load_config(args.config), args.runs, args.show_wrong)
    misread: dict[str, int] = defaultdict(int)
    cfg = load_config(args.config)
    judge = make_judge(cfg)
    rows: dict[tuple[str, str], list[int]] = defaultdict(list)
    for persona, pool in (("student", STUDENT_RESPONSES), ("teacher", TEACHER_RESPONSES)):
        for ep in range(args.episodes):
            env = ChatEnv(persona=persona, split="train", max_turns=4)
            env.reset(seed=1000 + ep)
            # one pass from a random point of the pool upwards: a user who gets better answers
            for k in range(ep % len(pool), len(pool) + 1):
                response = pool[min(k, len(pool) - 1)].format(**env.context)
                message, _r, terminated, truncated, info = env.step(response)
                kind = kind_of(env, info, message)
                expected = 1 if kind in ("thanks", "goodbye") else -1
                result = asyncio.run(judge.score(response, NextState(role="user", content=message)))
                rows[(persona, kind)].append(result.score * expected)
                if result.score * expected < 0:
                    misread[f"{persona} {kind} {expected:+d}: {message}"] += 1
                if terminated or truncated:
                    break
    print(f"judge: [prm_service] backend={cfg.prm_service.backend} vote_count={cfg.prm_service.vote_count}")
    print(f"{'persona':<9}{'reply':<12}{'n':>5}{'right':>8}{'wrong':>8}{'zero':>7}")
    for (persona, kind), signs in sorted(rows.items()):
        n = len(signs)
        right, wrong, zero = (
            sum(f(s) for s in signs) / n for f in (lambda s: s > 0, lambda s: s < 0, lambda s: s == 0)
        )
        print(f"{persona:<9}{kind:<12}{n:>5}{right:>8.2f}{wrong:>8.2f}{zero:>7.2f}")
    complaints = [s for (_, kind), signs in rows.items() if kind in ("redo", "correction") for s in signs]
    pos = sum(s < 0 for s in complaints)
    print(f"\ncomplaints judged +1: {pos} of {len(complaints)} ({pos / max(1, len(complaints)):.2f})")
    if args.show_wrong:
        print("\nread with the wrong sign (times, persona, kind, expected sign: reply):")
        for text, times in sorted(misread.items(), key=lambda kv: -kv[1]):
            print(f"{times:>4}  {text[:200]!r}")
    return 0


def run_complaints(work: Path) -> dict[tuple[str, str], int]:
    """The distinct complaints (next states with a truth below 1) of the runs kept in ``work``
    (``bench/learning.py`` or ``bench/per_user_learning.py``): (persona, text) -> the majority score
    the run's judge gave it (the first time it was judged). In a run of several personas a complaint
    is its simulated user's (``sim-<persona>``)."""
    out: dict[tuple[str, str], int] = {}
    for conf in sorted(work.glob("*.toml")):
        cfg = load_config(conf)
        path = cfg.log_dir / "store.sqlite"
        if not path.is_file():
            continue
        personas = cfg.env_service.personas
        store = Store(path)
        persona_of: dict[str, str] = {}  # group id -> persona: one store read per group, not per turn
        try:
            for (group, _), members in group_attempts(store).items():
                if group not in persona_of:
                    persona_of[group] = personas[0]
                    if len(personas) > 1:
                        session = next((sid for sid, _ in store.group_episodes(group)), "")
                        user = store.session_user(session) or ""
                        persona_of[group] = user.removeprefix(SIMULATED_PREFIX)
                for attempt in members:
                    if attempt.truth < 1:
                        out.setdefault((persona_of[group], attempt.state.content), attempt.score)
        finally:
            store.close()
    return out


def rejudge_runs(cfg: Config, dirs: list[Path], show_wrong: bool) -> int:
    """Print, per persona, the complaints judged +1 by the runs' judge and by ``cfg``'s judge now."""
    judge = make_judge(cfg)
    complaints: dict[tuple[str, str], int] = {}
    for work in dirs:
        for key, score in run_complaints(work).items():
            complaints.setdefault(key, score)
    now = {
        key: asyncio.run(judge.score("", NextState(role="user", content=key[1]))).score for key in complaints
    }
    print(f"judge: [prm_service] backend={cfg.prm_service.backend} vote_count={cfg.prm_service.vote_count}")
    print(f"{'persona':<9}{'complaints':>11}{'+1 then':>9}{'+1 now':>8}")
    for persona in sorted({p for p, _ in complaints}):
        keys = [k for k in complaints if k[0] == persona]
        then = sum(complaints[k] == 1 for k in keys)
        print(f"{persona:<9}{len(keys):>11}{then:>9}{sum(now[k] == 1 for k in keys):>8}")
    if show_wrong:
        print("\ncomplaints judged +1 now:")
        for (persona, text), score in now.items():
            if score == 1:
                print(f"  {persona}: {text[:200]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
