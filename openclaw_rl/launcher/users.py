"""``openclaw-rl users``: add a user (their key, shown once) and list everyone the run knows.

    openclaw-rl users add NAME --config F     prints NAME's key once; the store keeps a salted digest
    openclaw-rl users list --config F         per user: turns, judged, samples, updates, adapter, ...

Both work while the run is serving: the store is the one the policy service reads keys from, so a
new key works at once, without a restart (docs/users.md).
"""

from __future__ import annotations

import sys

from openclaw_rl.config import Config
from openclaw_rl.launcher.status import existing_store
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store
from openclaw_rl.runtime.users import UserError, UserStats, adapter_meta, check_user_name, issue_key


def users_add(cfg: Config, name: str) -> int:
    """Register ``name`` and print their key (the only time it is shown)."""
    try:
        check_user_name(name, where="NAME")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = Store(RunDir.of(cfg).store)
    try:
        key = issue_key()
        store.add_user(name, key)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"user {name} added. Their key (shown only now; the run keeps only a digest of it):")
    print(key.text)
    print(f"Clients send it as: Authorization: Bearer {key.text[:12]}...")
    return 0


def _row(s: UserStats) -> list[str]:
    rate = "-" if s.positive_rate is None else f"{s.positive_rate:.2f}"
    return [
        s.name,
        "yes" if s.has_key else "no",
        str(s.turns),
        str(s.judged),
        str(s.samples),
        str(s.updates),
        s.adapter_version,
        rate,
        f"+{s.feedback_up}/-{s.feedback_down}",
    ]


HEADER = ["user", "key", "turns", "judged", "samples", "updates", "adapter", "positive@50", "feedback"]


def user_table(cfg: Config, store: Store) -> list[UserStats]:
    """Every user's :class:`UserStats`; in shared mode everyone's adapter is the shared policy, in
    per_user mode their own (``base`` until their first one is served)."""
    version = store.counters().policy_version

    def adapter(name: str) -> str:
        if cfg.users.mode == "shared":
            return f"shared v{version}"
        own = store.get_meta(adapter_meta(name))
        return f"v{own}" if own is not None else "base"

    return [store.user_stats(n, adapter(n)) for n in store.user_names()]


def users_list(cfg: Config) -> int:
    """Print one line per user (``positive@50``: share of +1 among their last 50 judged turns)."""
    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        rows = [_row(s) for s in user_table(cfg, store)]
    finally:
        store.close()
    if not rows:
        print("no users yet: add one with `openclaw-rl users add NAME --config F`")
        return 0
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
    for line in [HEADER, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0
