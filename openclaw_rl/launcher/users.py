"""``openclaw-rl users``: add a user (their key, shown once) and list everyone the run knows.

    openclaw-rl users add NAME --config F     prints NAME's key once; the store keeps a salted digest
    openclaw-rl users add NAME --new-key ...  a new key for NAME (lost or leaked); the old one stops working
    openclaw-rl users list --config F         per user: turns, judged, samples, updates, adapter, ...
    openclaw-rl users delete NAME --config F  remove NAME's key, turns, samples, adapters, feedback
    openclaw-rl users export NAME --out DIR --config F   their adapter (PEFT) and turns (JSONL)

Both work while the run is serving: the store is the one the policy service reads keys from, so a
new key works at once, without a restart (docs/users.md).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from openclaw_rl.config import Config
from openclaw_rl.launcher.status import existing_store
from openclaw_rl.runtime.metrics import drop_user_rows
from openclaw_rl.runtime.policy_admin import SERVICE_URL_META, forget_user, service_url
from openclaw_rl.runtime.rundir import RunDir
from openclaw_rl.runtime.store import Store
from openclaw_rl.runtime.users import UserError, UserStats, adapter_meta, check_user_name, issue_key
from openclaw_rl.types import DEFAULT_USER


def _bad_name(name: str) -> bool:
    """Say so (and return True) when ``name`` is no user name."""
    try:
        check_user_name(name, where="NAME")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return True
    return False


def users_add(cfg: Config, name: str, new_key: bool = False) -> int:
    """Register ``name`` and print their key (the only time it is shown); ``new_key``: replace an
    existing user's key, which stops working at once."""
    if _bad_name(name):
        return 2
    if name.lower() == DEFAULT_USER:  # a key for it would own every anonymous request's turns
        print(
            f"error: NAME: {name!r} is reserved: {DEFAULT_USER!r} is the user of every request that "
            "names no one (docs/users.md); pick another name",
            file=sys.stderr,
        )
        return 2
    store = Store(RunDir.of(cfg).store)
    try:
        key = issue_key()
        store.add_user(name, key, replace=new_key)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if new_key:
        print(f"user {name}: new key; the old one no longer works. Their key (shown only now):")
    else:
        print(f"user {name} added. Their key (shown only now; the run keeps only a digest of it):")
    print(key.text)
    print(f"Clients send it as: Authorization: Bearer {key.text}")
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


def users_delete(cfg: Config, name: str, yes: bool = False) -> int:
    """The right to be forgotten: remove everything the run holds about ``name`` and say what.

    ``default`` holds every anonymous turn (and every turn from before users existed): deleting it
    takes ``yes``."""
    if _bad_name(name):
        return 2
    if name == DEFAULT_USER and not yes:
        print(
            f"error: {DEFAULT_USER!r} is every request that names no user, and every turn recorded "
            "before users existed: deleting it removes all of them. Run again with --yes to do that.",
            file=sys.stderr,
        )
        return 2
    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        if name not in store.user_names():
            print(f"error: the run knows no user {name!r}", file=sys.stderr)
            return 1
        counts = store.delete_user(name)
        policy_url = service_url(cfg, store.get_meta(SERVICE_URL_META))
    finally:
        store.close()
    files = 0
    for folder in RunDir.of(cfg).user_folders(name):
        if folder.exists():
            files += sum(1 for p in folder.rglob("*") if p.is_file())
            shutil.rmtree(folder)
    counts["metrics_rows"] = drop_user_rows(RunDir.of(cfg).root, name)
    counts["files"] = files
    compacted = counts.pop("store_compacted")
    print(f"user {name} deleted: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    if not compacted:
        print(
            "warning: another process held the store open for 30 s, so its file was not compacted: "
            f"{name}'s rows are gone, but their old bytes may stay in the file's free pages until "
            "the next users delete (run it again once the run is stopped)",
            file=sys.stderr,
        )
    # A service not reached still records nothing more of a keyed user: their key is gone from the
    # store it checks before writing a turn.
    err = forget_user(cfg, policy_url, name, timeout=5.0)
    print(
        "the running policy service stopped any request of theirs in flight and dropped their adapter from memory"
        if err is None
        else f"{err}; a service running elsewhere records nothing more under their key, and none "
        "loads their adapter again"
    )
    return 0


def _export_problem(cfg: Config, dest: Path) -> str | None:
    """Why ``dest`` cannot take an export, or None."""
    if dest.exists() and not dest.is_dir():
        return "exists and is not a folder"
    root = RunDir.of(cfg).root.resolve()
    where = dest.resolve()
    if where == root or root in where.parents:
        return (
            f"is inside the run's log_dir ({root}); an export there would outlive `users delete`, "
            "so write it elsewhere"
        )
    return None


def _private_copy(src: str, dst: str) -> None:
    """Copy a file readable by its owner only (0600): an adapter is trained on one person's words."""
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600)


def users_export(cfg: Config, name: str, out: str) -> int:
    """``name``'s newest adapter (a PEFT directory, loadable by ``peft``) and their turns as JSONL."""
    dest = Path(out)
    problem = _export_problem(cfg, dest)
    if problem is not None:
        print(f"error: --out {out}: {problem}", file=sys.stderr)
        return 2
    store = existing_store(cfg)
    if store is None:
        return 1
    try:
        if name not in store.user_names():
            print(f"error: the run knows no user {name!r}", file=sys.stderr)
            return 1
        try:
            dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            print(f"error: --out {out}: cannot create the folder ({exc.strerror or exc})", file=sys.stderr)
            return 2
        linked = [p.name for p in (dest / "turns.jsonl", dest / "adapter") if p.is_symlink()]
        if linked:  # a planted link would send a user's words wherever it points
            print(
                f"error: --out {out}: {', '.join(linked)} there is a symbolic link; an export writes real "
                "files: remove it or choose another folder",
                file=sys.stderr,
            )
            return 2
        n = 0
        # written beside, then renamed over: a rename replaces the name, never a file a link points to
        fd, tmp = tempfile.mkstemp(prefix=".turns.", suffix=".jsonl", dir=dest)  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                for turn, status, score in store.user_turns(name):
                    row = {**json.loads(turn.model_dump_json()), "status": status, "score": score}
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
            os.replace(tmp, dest / "turns.jsonl")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)  # a failed export leaves no half file
    finally:
        store.close()
    published = RunDir.of(cfg).read_published_policy(name)
    if (dest / "adapter").exists():  # an earlier export's adapter is not this one
        shutil.rmtree(dest / "adapter")
    if published is not None and published.path.is_dir():
        shutil.copytree(published.path, dest / "adapter", copy_function=_private_copy)
        os.chmod(dest / "adapter", 0o700)
        for sub in (p for p in (dest / "adapter").rglob("*") if p.is_dir()):
            os.chmod(sub, 0o700)
        what = f"adapter v{published.version} in {dest / 'adapter'}"
    elif cfg.users.mode != "per_user":
        shared = RunDir.of(cfg).read_published_policy()
        served = f"the shared policy v{shared.version}" if shared is not None else "the base model"
        what = f'no adapter of their own ([users] mode = "{cfg.users.mode}": everyone is served {served})'
    else:
        what = "no adapter (none trained yet: they are served the base model)"
    print(f"user {name} exported to {dest}: {n} turns in turns.jsonl, {what}")
    return 0
