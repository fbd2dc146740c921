"""Turning votes into one verdict, shared by every backend.

* :func:`majority` — the most common valid score wins; a tie between the top scores, or no valid
  vote at all, gives 0.
* :func:`select_hint` — the longest positive hint of more than 10 characters, or None.
* :func:`sample_from_distribution` — backends that produce a probability distribution over the
  scores (the local LLM, the embedding classifier) draw ``vote_count`` independent votes from it at
  the configured temperature, so ``vote_count`` keeps its meaning for them too.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from openclaw_rl.judge.prompts import MAX_HINT_CHARS, MIN_HINT_CHARS
from openclaw_rl.types import Vote


def majority(votes: list[Vote], reward_space: list[int]) -> int:
    """Majority score over the valid votes; ties and all-invalid give 0.

    A vote whose score is None or outside ``reward_space`` is invalid and not counted.
    """
    counts = Counter(v.score for v in votes if v.score is not None and v.score in reward_space)
    if not counts:
        return 0
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return int(ranked[0][0])


def select_hint(votes: list[Vote]) -> str | None:
    """The longest hint among +1 hint votes, if longer than ``MIN_HINT_CHARS`` characters and no
    longer than ``MAX_HINT_CHARS`` (a hint is 1-3 sentences; pages of text are not one, and the
    teacher would read them all)."""
    hints = [v.hint.strip() for v in votes if v.score == 1 and v.hint]
    hints = [h for h in hints if MIN_HINT_CHARS < len(h) <= MAX_HINT_CHARS]
    return max(hints, key=len) if hints else None


def tempered(probs: dict[int, float], temperature: float) -> dict[int, float]:
    """``p_i^(1/T)`` renormalised; T = 0 puts all mass on the most likely score."""
    if not probs:
        raise ValueError("empty distribution")
    if temperature <= 0:
        best = max(probs, key=lambda k: probs[k])
        return {k: (1.0 if k == best else 0.0) for k in probs}
    logs = {k: math.log(max(p, 1e-12)) / temperature for k, p in probs.items()}
    top = max(logs.values())
    exp = {k: math.exp(v - top) for k, v in logs.items()}
    total = sum(exp.values())
    return {k: v / total for k, v in exp.items()}


def restrict(probs: dict[int, float], reward_space: list[int]) -> dict[int, float]:
    """Keep only scores in ``reward_space`` and renormalise (uniform if nothing is left)."""
    kept = {k: p for k, p in probs.items() if k in reward_space}
    total = sum(kept.values())
    if total <= 0:
        return {k: 1.0 / len(reward_space) for k in reward_space}
    return {k: p / total for k, p in kept.items()}


def sample_from_distribution(
    probs: dict[int, float], n: int, temperature: float, rng: random.Random, describe: str = ""
) -> list[Vote]:
    """``n`` independent votes drawn from ``probs`` tempered at ``temperature``.

    Each vote's ``raw`` records the distribution it was drawn from, so a stored judgement shows
    why it came out as it did.
    """
    dist = tempered(probs, temperature)
    keys = sorted(dist)
    shown = " ".join(f"p({k:+d})={probs[k]:.3f}" for k in sorted(probs))
    votes = []
    for _ in range(n):
        score = rng.choices(keys, weights=[dist[k] for k in keys])[0]
        votes.append(Vote(raw=f"{describe}{shown} T={temperature:g} -> sampled {score:+d}", score=score))
    return votes
