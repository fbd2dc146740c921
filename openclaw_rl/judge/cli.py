"""``openclaw-rl judge``: judge one (response, next state) pair and print one JSON object.

Lets a user check their judge (backend, API key, prompts, votes) before a long run::

    openclaw-rl judge --config config.toml --response "Here is the plan..." \\
        --next-state "no bold please" --role user

prints ``{"score": -1, "votes": [...], "hint": "No bold please.", "timing": {...}, ...}``.
Exit status: 0 on a judgement, 1 when the judge failed (the JSON then carries ``error``).
"""

from __future__ import annotations

import asyncio
import json
import time

from openclaw_rl.config import Config
from openclaw_rl.types import NextState

ROLES = ("user", "tool", "environment")


def judge_command(cfg: Config, response: str, next_state: str, role: str) -> int:
    """Judge one pair with the configured backend and print the result as one JSON object."""
    from openclaw_rl.judge import make_judge

    if role not in ROLES:
        print(json.dumps({"error": f"--role must be one of {', '.join(ROLES)}, got {role!r}"}))
        return 2
    if not next_state.strip():
        print(
            json.dumps(
                {"error": "--next-state is empty: the judge needs the state that followed the response"}
            )
        )
        return 2

    async def go() -> dict:
        t0 = time.perf_counter()
        judge = make_judge(cfg)
        setup = time.perf_counter() - t0
        try:
            result = await judge.score(response, NextState(role=role, content=next_state))
        finally:
            await judge.close()
        return {
            "backend": cfg.prm_service.backend,
            "score": None if result.error else result.score,
            "votes": [v.model_dump() for v in result.votes],
            "hint": result.hint,
            "hint_votes": [v.model_dump() for v in result.hint_votes],
            "error": result.error,
            "timing": {"setup_s": round(setup, 3), "judge_s": round(result.elapsed_s, 3)},
        }

    out = asyncio.run(go())
    print(json.dumps(out, ensure_ascii=False))
    return 0 if out["error"] is None else 1
