"""Can the hinted teacher teach it? Per preference of a persona, what the teacher writes with the hint.

On-policy distillation pulls the policy towards the tokens its teacher — the same base model with
the hindsight hint appended to the prompt — prefers. A wish the hinted teacher does not itself
follow has nothing to pull towards, however many updates run. For every preference of a persona
this takes the user's complaints about it, turns each into the hint the embedded judge extracts
(``extract_hint``), appends it the way the teacher does (``hinted_messages``), and scores the
teacher's greedy reply to held-out problems with that preference's own check, against the same
model's reply without a hint:

    .venv/bin/python bench/teacher_hints.py [--personas student,analyst,teacher] [--n 16] [--max-tokens 64]
        [--placement user|system]

A preference whose hinted rate is no higher than its plain rate is one OPD cannot teach on this
model (docs/training.md, "What the student learns"); Binary RL still can, if some attempts meet it.

``--earlier 0,2,4`` measures ``[prm_service] hint_memory`` instead: the persona's whole score of the
teacher's greedy replies when it reads the hint of a complaint about this reply (two of the wishes
the plain reply missed, as the simulated user complains) after K hints drawn from complaints about
other problems' replies, as the store would give them; two draws of the complaints per K.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.config import Config, HintPlacement, build_config  # noqa: E402
from openclaw_rl.envs.base import make  # noqa: E402
from openclaw_rl.envs.chat import (  # noqa: E402
    PERSONAS,
    Persona,
    personalization_score,
    preference_report,
    redo_complaint,
    redo_request,
)
from openclaw_rl.envs.loop import PolicyClient, env_kwargs_for  # noqa: E402
from openclaw_rl.judge.hindsight import mask_unseen_figures, seen_text, with_earlier_hints  # noqa: E402
from openclaw_rl.judge.minilm import extract_hint  # noqa: E402
from openclaw_rl.judge.teacher import hinted_messages  # noqa: E402
from openclaw_rl.launcher.evaluate import private_service_config  # noqa: E402
from openclaw_rl.policy.server import PolicyService  # noqa: E402


def greedy_replies(client: PolicyClient, prompts: list[list[dict[str, Any]]], max_tokens: int) -> list[str]:
    """The policy service's greedy reply to each chat prompt, eight requests at a time (the engine
    batches them, as the held-out evaluation does)."""

    def one(messages: list[dict[str, Any]]) -> str:
        reply = client.complete(
            messages, f"hints-{uuid.uuid4().hex[:12]}", done=True, max_tokens=max_tokens, temperature=0.0
        )
        if reply is None:
            raise RuntimeError("the policy service stopped")
        return str(reply["content"] or "")

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, prompts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--personas", default="student,analyst,teacher")
    ap.add_argument("--n", type=int, default=16, help="held-out problems per persona")
    ap.add_argument("--max-tokens", type=int, default=64, help="as bench/learning.py trains and scores")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--hint-facts", choices=("keep", "mask"), default="keep", help="as [prm_service] hint_facts"
    )
    ap.add_argument(
        "--placement",
        choices=get_args(HintPlacement),
        default="user",
        help="where the teacher reads the hint, as [prm_service] hint_placement",
    )
    ap.add_argument(
        "--earlier",
        default="",
        help="comma-separated counts of the user's earlier hints the teacher reads (hint_memory), e.g. 0,2,4",
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    cfg = build_config({"policy_service": {"model": args.model}})
    # A private embedded service, as the held-out evaluation scores with: the plain rates here are
    # the evaluation's own base rates (same engine, same greedy decoding), on fewer problems.
    scfg = private_service_config(cfg, tempfile.mkdtemp(prefix="ocl-hints-"))
    service = PolicyService(scfg)
    client = PolicyClient.from_config(scfg, service.start(), threading.Event())
    try:
        if args.earlier:
            report_memory(client, cfg, args, [int(k) for k in args.earlier.split(",")])
        else:
            report_hints(client, cfg, args)
    finally:
        client.close()
        service.stop()
        shutil.rmtree(scfg.global_.log_dir, ignore_errors=True)
    print(f"({(time.monotonic() - t0) / 60:.1f} min)")
    return 0


def held_out(
    client: PolicyClient, cfg: Config, persona_name: str, args: argparse.Namespace
) -> tuple[list[tuple[list[dict[str, Any]], dict[str, Any]]], list[str]]:
    """The persona's first ``args.n`` held-out problems as ``(messages, context)``, and the plain
    model's greedy reply to each."""
    env = make("chat", persona=persona_name, **{**env_kwargs_for(cfg, "chat", "eval"), "max_turns": 1})
    episodes = []
    for i in range(args.n):
        _obs, info = env.reset(seed=i, options={"item": i})
        episodes.append((info["messages"], dict(env.context)))  # type: ignore[attr-defined]
    return episodes, greedy_replies(client, [m for m, _ in episodes], args.max_tokens)


def report_hints(client: PolicyClient, cfg: Config, args: argparse.Namespace) -> None:
    """Print, per preference of each persona, its rate without and with the judge's hint."""
    print(f"{'persona / preference':<34}{'plain':>7}{'hinted':>8}{'lift':>7}   hint (the first problem's)")
    for persona_name in args.personas.split(","):
        persona = PERSONAS[persona_name]
        lifts: list[float] = []
        episodes, plain = held_out(client, cfg, persona_name, args)
        for pref in persona.preferences:
            # the problems take the complaints and leads in turn, as a user's complaints vary; each is
            # filled in with its own problem (the student's name, the answer), as the user writes it
            hints = [
                extract_hint(
                    "user",
                    redo_request(
                        persona.redo_leads[i % len(persona.redo_leads)],
                        [pref.complaints[i % len(pref.complaints)].format(**ctx)],
                    ),
                )
                for i, (_, ctx) in enumerate(episodes)
            ]
            if not any(hints):
                print(
                    f"{persona_name + ' / ' + pref.name:<34}   (the judge extracts no hint from its complaints)"
                )
                continue
            if args.hint_facts == "mask":  # as the judge does with [prm_service] hint_facts = "mask"
                hints = [
                    mask_unseen_figures(h, seen_text(m, r)) if h else h
                    for h, (m, _), r in zip(hints, episodes, plain, strict=True)
                ]
            prompts = [
                hinted_messages(m, h, args.placement) if h else m
                for (m, _), h in zip(episodes, hints, strict=True)
            ]
            hinted = greedy_replies(client, prompts, args.max_tokens)
            before = sum(bool(pref.check(r, c)) for r, (_, c) in zip(plain, episodes, strict=True)) / args.n
            after = sum(bool(pref.check(r, c)) for r, (_, c) in zip(hinted, episodes, strict=True)) / args.n
            lifts.append(after - before)
            print(
                f"{persona_name + ' / ' + pref.name:<34}{before:>7.2f}{after:>8.2f}{after - before:>+7.2f}   "
                f"{next(h for h in hints if h)!r}"
            )
        gain = hinted_gain(lifts, len(persona.preferences))
        print(f"{persona_name + ' / hinted gain':<34}{'':>15}{gain:>+7.3f}")
    print(
        "\n(hinted gain: how far the persona's score would rise were the policy to write, for every wish at "
        "once, what the teacher writes when hinted about that wish alone: the positive lifts summed over "
        "the persona's wishes, divided by their number. Not a bound on what OPD learns: repeated updates "
        "can take a wish past the teacher's own rate, and did, docs/training.md)"
    )
    print(
        f"(n={args.n} held-out problems per persona, greedy, {args.max_tokens} tokens, model {args.model}; "
        f"plain: the rate without a hint; hinted: with the hint the embedded judge extracts from each "
        f"complaint about the preference, hint_facts = {args.hint_facts}, hint_placement = {args.placement}; served by the embedded engine)"
    )


def complaint_hint(rng: random.Random, persona: Persona, reply: str, ctx: dict[str, Any]) -> str | None:
    """The hint the embedded judge draws from the persona's complaint about ``reply``: two of the
    wishes it missed (any two if it missed none), as ``ChatEnv`` complains."""
    report = preference_report(persona, reply, ctx)
    missed = [p for p in persona.preferences if not report[p.name]] or list(persona.preferences)
    return extract_hint("user", redo_complaint(rng, persona, missed, ctx)[1])


def mean_score(persona: Persona, replies: list[str], episodes: list[tuple[Any, dict[str, Any]]]) -> float:
    """The persona's mean score of ``replies``, one per episode."""
    return sum(
        personalization_score(persona, r, c) for r, (_, c) in zip(replies, episodes, strict=True)
    ) / len(replies)


def report_memory(client: PolicyClient, cfg: Config, args: argparse.Namespace, counts: list[int]) -> None:
    """Print, per persona, the score of the teacher's replies with K earlier hints beside this turn's."""
    print(f"{'persona':<10}{'draw':>5}" + "".join(f"{'K=' + str(k):>8}" for k in counts) + f"{'plain':>8}")
    for persona_name in args.personas.split(","):
        persona = PERSONAS[persona_name]
        episodes, plain = held_out(client, cfg, persona_name, args)

        for draw in range(2):
            rng = random.Random(draw)
            now = [complaint_hint(rng, persona, r, c) for r, (_, c) in zip(plain, episodes, strict=True)]
            # what the store would hold: hints from complaints about other problems' replies
            pool = []
            for _ in range(4 * max(counts)):
                i = rng.randrange(args.n)
                if hint := complaint_hint(rng, persona, plain[i], episodes[i][1]):
                    pool.append(hint)
            row = []
            for k in counts:
                prompts = []
                for (messages, _), hint, reply in zip(episodes, now, plain, strict=True):
                    if not hint:
                        prompts.append(messages)
                        continue
                    earlier = list(dict.fromkeys(h for h in rng.sample(pool, len(pool)) if h != hint))[:k]
                    seen = seen_text(messages, reply)
                    prompts.append(
                        hinted_messages(messages, with_earlier_hints(hint, earlier, seen), args.placement)
                    )
                row.append(mean_score(persona, greedy_replies(client, prompts, args.max_tokens), episodes))
            print(
                f"{persona_name:<10}{draw:>5}"
                + "".join(f"{v:>8.3f}" for v in row)
                + f"{mean_score(persona, plain, episodes):>8.3f}"
            )
    print(
        f"\n(the persona's score of the teacher's greedy replies, n={args.n} held-out problems, "
        f"{args.max_tokens} tokens; K: how many of the user's earlier hints it read before this turn's "
        f"(hint_memory); plain: no hint; draw: which draw of the complaints)"
    )


def hinted_gain(lifts: list[float], n_wishes: int) -> float:
    """The persona's score gain were the policy to write what the hinted teacher writes, every wish at once.

    A wish the hinted teacher meets no more often than the plain model gives OPD nothing to pull
    towards (its lift counts as 0); the others count with their lift. The score is the share of wishes
    met, so the gain is the positive lifts averaged over the persona's wishes. It is a first-order
    reading of the teacher, not a bound: OPD's per-token pushes, update after update, can take a wish
    past the teacher's own one-shot rate.
    """
    if n_wishes <= 0:
        raise ValueError(f"a persona has at least one wish, got {n_wishes}")
    return sum(max(0.0, lift) for lift in lifts) / n_wishes


if __name__ == "__main__":
    sys.exit(main())
