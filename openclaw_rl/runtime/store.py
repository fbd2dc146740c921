"""The durable store: the single source of truth between serving, judging and training.

One SQLite file (``<log_dir>/store.sqlite``) in WAL mode with ``synchronous=FULL``: every state
change is committed before the caller acts on it, so ``kill -9`` of any process at any moment loses
no recorded turn and no judged sample. Several processes may open the same file; SQLite serialises
writers and each method is one short transaction.

Lifecycle of a main turn (``turns.status``)::

    open ──next state arrives──▶ ready ──judge ok──▶ judged      (sample rows created atomically)
      │                            └──judge error──▶ failed ──retry later──▶ judged
      └──session done, no next state──▶ closed   (not trained, unless the at-least-one rule applies)

Several judges (threads, processes, Ray actors) may work on one store at once. A judge takes turns
with :meth:`Store.claim_turns`, which puts a *lease* on each (``claimed_by`` = the judge's stable
worker id, ``lease_until``) inside one ``BEGIN IMMEDIATE`` transaction, so two judges never get the
same turn while the lease holds. The status stays ``ready`` / ``failed`` while a turn is leased —
counters, ``status`` and the at-least-one rule see an unjudged turn, which it is. A lease that runs
out (the judge hung or died) makes the turn claimable again; the slow judge's late
:meth:`Store.save_judgement` is then refused (it no longer holds the turn), so a turn is never saved
twice and its samples are never inserted twice. A judge that restarts under the same worker id
frees its previous incarnation's leases at once (:meth:`Store.release_claims`) instead of waiting
for them to run out.

Lifecycle of a sample (``samples.status``)::

    ready ──trainer claims for step S──▶ claimed(S) ──checkpoint at step ≥ S──▶ trained
      └──older than max_staleness──▶ dropped           claimed(S > checkpoint) ──restart──▶ ready

A sample counts as trained only once a checkpoint that includes its update is on disk; after a
crash, claims newer than the last checkpoint go back to ``ready``, so no sample is lost and none is
trained twice into the surviving weights.

Usage::

    store = Store(Path("logs/run/store.sqlite"))
    store.record_turn(turn, next_state_for_previous=NextState(role="user", content="thanks!"))
    for turn in store.claim_turns("judge-0", limit=8, lease_s=600): ...
    store.save_judgement(turn, result, samples, worker="judge-0")   # False: another judge took it over
    batch = store.claim_samples(32, step=1, current_version=0, max_staleness=None)
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from openclaw_rl.runtime.users import (
    Feedback,
    FeedbackOutcome,
    IssuedKey,
    UserError,
    UserStats,
    adapter_meta,
)
from openclaw_rl.types import DEFAULT_USER, EpisodeTag, JudgeResult, NextState, Sample, Turn, hint_words

#: What a recorded sample is: waiting, in an update, trained, or too stale to train (samples.status).
SampleStatus = Literal["ready", "claimed", "trained", "dropped"]
SAMPLE_STATUSES: tuple[str, ...] = get_args(SampleStatus)

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id   TEXT PRIMARY KEY,
    created_at   REAL NOT NULL,
    done         INTEGER NOT NULL DEFAULT 0,
    guaranteed   INTEGER NOT NULL DEFAULT 0,
    group_id     TEXT,
    group_size   INTEGER,
    outcome      REAL,
    grouped      INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS turns (
    session_id     TEXT NOT NULL,
    turn_index     INTEGER NOT NULL,
    turn_type      TEXT NOT NULL,
    status         TEXT NOT NULL,
    data           TEXT NOT NULL,
    judge          TEXT,
    score          INTEGER,
    judge_attempts INTEGER NOT NULL DEFAULT 0,
    retry_at       REAL NOT NULL DEFAULT 0,
    error          TEXT,
    updated_at     REAL NOT NULL,
    claimed_by     TEXT,
    lease_until    REAL,
    PRIMARY KEY (session_id, turn_index)
);
CREATE INDEX IF NOT EXISTS turns_status ON turns(status, retry_at);
CREATE TABLE IF NOT EXISTS samples (
    sample_id      TEXT PRIMARY KEY,
    session_id     TEXT NOT NULL,
    turn_index     INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    reward         REAL,
    status         TEXT NOT NULL,
    step           INTEGER,
    data           TEXT NOT NULL,
    created_at     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_status ON samples(status, created_at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prefixes (
    digest      TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    created_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS prefixes_session ON prefixes(session_id, created_at);
CREATE TABLE IF NOT EXISTS users (
    name        TEXT PRIMARY KEY,
    key_id      TEXT UNIQUE,
    key_salt    TEXT,
    key_digest  TEXT,
    created_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    response_id TEXT NOT NULL,
    user        TEXT NOT NULL,
    rating      INTEGER NOT NULL,
    comment     TEXT,
    created_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_user ON feedback(user);
CREATE TABLE IF NOT EXISTS chains (
    response_id TEXT PRIMARY KEY,
    user        TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    messages    TEXT NOT NULL,
    created_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS chains_user ON chains(user);
"""

#: Indexes on columns that :data:`COLUMNS_ADDED` may add to an old file: created after the migration.
INDEXES_AFTER_MIGRATION = """
CREATE INDEX IF NOT EXISTS turns_response ON turns(response_id);
CREATE INDEX IF NOT EXISTS sessions_user ON sessions(user);
CREATE INDEX IF NOT EXISTS samples_user ON samples(user, status);
"""

#: Columns added after the first release: a store file written by an older version gets them on open
#: (``ALTER TABLE ... ADD COLUMN``), so a run can resume on its old store.
COLUMNS_ADDED = {
    "turns": {"claimed_by": "TEXT", "lease_until": "REAL", "response_id": "TEXT"},
    "sessions": {
        "group_id": "TEXT",
        "group_size": "INTEGER",
        "outcome": "REAL",
        "grouped": "INTEGER NOT NULL DEFAULT 0",
        "user": f"TEXT NOT NULL DEFAULT '{DEFAULT_USER}'",
    },
    "samples": {"user": f"TEXT NOT NULL DEFAULT '{DEFAULT_USER}'"},
    "chains": {"response": "TEXT"},
}

#: The lease holder a feedback puts on a turn it reopens: already expired, so any judge may claim the
#: turn at once, yet not ``None``, so a judge still working on the turn's old next state cannot
#: save its (now stale) judgement.
FEEDBACK_LEASE = "feedback"

#: Meta keys: the judge's running reward baseline, and its signal-health counters (judged / hinted
#: turns, groups, zero-advantage groups, sums of group reward means and spreads) that the training
#: loop turns into metrics.
BASELINE_META = "baseline"
SIGNAL_META = "signal"

#: A group whose members have not all finished is judged with the members it has once it has been
#: quiet this long (seconds): an episode that died mid-way must not hold its group's samples forever.
GROUP_QUIET_S = 600.0

#: Due turns at ``now`` (bound twice): a next state attached and not judged (failed ones once their
#: retry is due), and no live lease by a judge; oldest first.
_DUE_TURNS = (
    "SELECT session_id, turn_index, data FROM turns "
    "WHERE (status='ready' OR (status='failed' AND retry_at<=?)) "
    "AND (claimed_by IS NULL OR lease_until<=?) ORDER BY updated_at, session_id, turn_index LIMIT ?"
)


@dataclass(frozen=True)
class StoredResponse:
    """A Responses API response kept with ``store`` true: whose it is, its session, the conversation
    it read and wrote (chat messages), and the ``response`` object its client saw (None for one kept
    by a version before responses could be retrieved)."""

    user: str
    session_id: str
    messages: list[dict[str, Any]]
    response: dict[str, Any] | None


@dataclass(frozen=True)
class Counters:
    """What ``openclaw-rl status`` and the progress line show."""

    turns: int
    open: int
    waiting: int  # next state attached, not yet judged
    judged: int
    failed: int  # judge errors waiting for a retry
    samples_ready: int
    samples_claimed: int
    samples_trained: int
    samples_dropped: int
    reward_mean: float | None
    policy_version: int
    trainer_step: int  # the last update whose checkpoint is on disk (its samples count as trained)
    trainer_updates: int  # updates done, checkpointed or not
    sessions: int = 0  # sessions with at least one main turn: the conversations had so far
    user_adapters: int = 0  # per_user mode: users whose own adapter is being served
    newest_user_version: int = 0  # per_user mode: the highest version among those adapters


class StoreError(RuntimeError):
    """The store file cannot be opened: its folder is no folder, or the file is no store."""


def _nearest_existing(folder: Path) -> Path | None:
    """``folder`` or the nearest folder above it that exists (``os.path``'s test, not ``Path``'s: on
    Python 3.11 ``Path.exists`` raises for a path under a folder the process may not read)."""
    return next((p for p in (folder, *folder.parents) if os.path.exists(p)), None)


def _not_a_folder(folder: Path) -> str:
    """The message for a log_dir that is, or lies under, a file: it names the file."""
    file = _nearest_existing(folder) or folder
    if file == folder:
        return f"{folder} is a file, not a directory: [global] log_dir must name a folder"
    return f"{file} is a file, so [global] log_dir = {str(folder)!r} cannot be made under it"


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot hold a run, found without leaving anything behind: it or a folder above
    it is a file, or it cannot be created or written. Where it does not exist yet, a folder is made
    and removed at once in the nearest one that does (some folders, such as /proc, refuse only
    then); None when all is well."""
    folder = Path(folder)
    existing = _nearest_existing(folder)
    if existing is None:
        return None
    if not os.path.isdir(existing):
        return _not_a_folder(folder)
    if existing == folder:
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"[global] log_dir = {str(folder)!r} is not writable"
        return None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".openclaw_probe_", dir=existing))
    except OSError as exc:
        return f"[global] log_dir = {str(folder)!r} cannot be created in {existing}: {exc.strerror or exc}"
    return None


def _not_a_store(path: Path, exc: Exception) -> str:
    return (
        f"{path} is not a usable openclaw-rl store ({exc}); move it aside, or point [global] log_dir "
        "at another folder"
    )


def store_problem(path: Path) -> str | None:
    """Why the store at ``path`` could not be opened, read without writing anything (the dry
    run's check); None when it could (or does not exist yet)."""
    folder = Path(path).parent
    existing = _nearest_existing(folder)
    if existing is not None and not os.path.isdir(existing):
        return _not_a_folder(folder)
    if not os.path.isfile(path):
        return None
    if not os.access(folder, os.W_OK):  # not the store's fault: say so, lest a good store be moved aside
        return (
            f"{path} cannot be opened here: its folder is read-only, and SQLite (write-ahead log) writes "
            "beside the store even to read it; copy the folder somewhere writable and point "
            "[global] log_dir there"
        )
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            # a sound header over damaged pages opens fine and fails later, mid-run: look at them now
            damage = [r[0] for r in db.execute("PRAGMA quick_check(5)").fetchall() if r[0] != "ok"]
    except sqlite3.DatabaseError as exc:
        return _not_a_store(Path(path), exc)
    if damage:
        return (
            f"{path} is damaged ({'; '.join(damage).replace(chr(10), ' ')[:300]}); save what it holds with "
            f"`sqlite3 {path} .recover > recovered.sql`, then move it aside or point [global] log_dir "
            "at another folder"
        )
    return None


class Store:
    """Thread-safe handle on the store file; one per process is enough."""

    def __init__(self, path: Path, create: bool = True):
        """Open the store at ``path``; ``create=False``: a missing one is an error, not a new empty
        store (a loop the launcher started: the launcher made it, so a missing one was removed)."""
        path = Path(path)
        if not create and not path.exists():
            raise StoreError(
                f"the run's store {path} is gone (was its folder removed while the run was going?); "
                "not starting an empty one beside the run"
            )
        try:
            # the run's folder and its store hold people's words: the owner's alone (0700 / 0600) when
            # made here; SQLite gives the -wal / -shm files the store file's own mode
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(_not_a_folder(path.parent)) from None
        except OSError as exc:
            raise StoreError(
                f"[global] log_dir = {str(path.parent)!r} cannot be created: {exc.strerror or exc}"
            ) from None
        if not path.exists():
            try:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError:
                pass  # a folder it cannot be made in: connecting below says so, as it always did
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=30000")
            with self._lock:
                self._db.executescript(SCHEMA)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(_not_a_store(path, exc)) from None

    def _migrate(self) -> None:
        """Add the columns newer versions need to an older store file.

        Inside one IMMEDIATE transaction: two processes opening an old file at once must not both
        try the ALTER (the second would fail with "duplicate column name").
        """
        with self._tx() as db:
            for table, columns in COLUMNS_ADDED.items():
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})").fetchall()}
                for name, sql_type in columns.items():
                    if name not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")
            for statement in INDEXES_AFTER_MIGRATION.strip().splitlines():
                db.execute(statement)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: writers serialise, and the commit is durable on return."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # Every read holds the handle's lock and runs to its last row. A statement left stepping on the
    # shared connection keeps a read snapshot open; a BEGIN IMMEDIATE from another thread of this
    # process then upgrades that old snapshot and, once another process has committed since, gets
    # SQLITE_BUSY at once (no busy wait applies): "database is locked" under two judges.
    def _all(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _one(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    # ---------------------------------------------------------------- serving side
    def record_turn(
        self,
        turn: Turn,
        next_state_for_previous: NextState | None = None,
        prefix_digest: str | None = None,
        episode: EpisodeTag | None = None,
        key_owner: str | None = None,
    ) -> bool:
        """Store a served turn and, in the same commit, attach ``next_state_for_previous`` to the
        session's newest open main turn before it (which becomes ``ready`` for the judge), remember
        ``prefix_digest`` (the conversation so far, reply included) as leading to this session, and
        tag the session with its episode group / outcome.

        ``key_owner``: the user whose own key authenticated the request; if they no longer have one
        (``users delete`` ran while it generated), nothing is written and the result is False."""
        now = time.time()
        with self._tx() as db:
            if key_owner is not None and not _has_key(db, key_owner):
                return False
            if prefix_digest is not None:
                db.execute(
                    "INSERT OR REPLACE INTO prefixes(digest, session_id, created_at) VALUES (?, ?, ?)",
                    (prefix_digest, turn.session_id, now),
                )
            db.execute(
                "INSERT OR IGNORE INTO sessions(session_id, created_at, user) VALUES (?, ?, ?)",
                (turn.session_id, now, turn.user),
            )
            if episode is not None:
                self._tag(db, turn.session_id, episode)
            if next_state_for_previous is not None and turn.turn_type == "main":
                self._attach(db, turn.session_id, next_state_for_previous, now, before=turn.turn_index)
            status = "open" if turn.turn_type == "main" else "side"
            db.execute(
                "INSERT OR REPLACE INTO turns(session_id, turn_index, turn_type, status, data, updated_at, "
                "response_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    turn.session_id,
                    turn.turn_index,
                    turn.turn_type,
                    status,
                    turn.model_dump_json(),
                    now,
                    turn.response_id,
                ),
            )
        return True

    def tag_session(self, session_id: str, episode: EpisodeTag) -> None:
        """Put a session in its episode group and record its outcome (when ``episode`` has one)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO sessions(session_id, created_at) VALUES (?, ?)",
                (session_id, time.time()),
            )
            self._tag(db, session_id, episode)

    @staticmethod
    def _tag(db: sqlite3.Connection, session_id: str, episode: EpisodeTag) -> None:
        db.execute(
            "UPDATE sessions SET group_id=?, group_size=?, outcome=COALESCE(?, outcome) WHERE session_id=?",
            (episode.group_id, episode.group_size, episode.outcome, session_id),
        )

    def session_user(self, session_id: str) -> str | None:
        """The user a session belongs to (None: no such session yet)."""
        row = self._one("SELECT user FROM sessions WHERE session_id=?", (session_id,))
        return None if row is None else row[0]

    def group_users(self, group_id: str) -> set[str]:
        """The users whose sessions are in the episode group ``group_id`` (empty: a new group)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT user FROM sessions WHERE group_id=?", (group_id,)
            ).fetchall()
        return {r[0] for r in rows}

    def session_group(self, session_id: str) -> str | None:
        """The episode group a session belongs to (None: a session on its own, e.g. personal traffic)."""
        row = self._one("SELECT group_id FROM sessions WHERE session_id=?", (session_id,))
        return None if row is None else row[0]

    def attach_next_state(self, session_id: str, next_state: NextState, before: int | None = None) -> bool:
        """Attach a next state to the newest open main turn (``before``: of those before that turn
        index); False when there is none."""
        with self._tx() as db:
            return self._attach(db, session_id, next_state, time.time(), before)

    @staticmethod
    def _attach(
        db: sqlite3.Connection, session_id: str, state: NextState, now: float, before: int | None = None
    ) -> bool:
        # ``before``: the index of the turn whose request carried the state. Only an earlier turn can
        # be answered by it: a later one (a second request of the session, sent at once, that finished
        # first) never is, since its client had not read it when it wrote this message
        row = db.execute(
            "SELECT turn_index, data FROM turns WHERE session_id=? AND status='open' AND turn_index < ? "
            "ORDER BY turn_index DESC LIMIT 1",
            (session_id, before if before is not None else 2**62),
        ).fetchone()
        if row is None:
            return False
        turn = Turn.model_validate_json(row[1])
        turn.next_state = state
        db.execute(
            "UPDATE turns SET status='ready', data=?, updated_at=? WHERE session_id=? AND turn_index=?",
            (turn.model_dump_json(), now, session_id, row[0]),
        )
        return True

    def close_session(self, session_id: str) -> None:
        """Mark a session done: its still-open last turn will never get a next state."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO sessions(session_id, created_at) VALUES (?, ?)", (session_id, now)
            )
            db.execute("UPDATE sessions SET done=1 WHERE session_id=?", (session_id,))
            db.execute(
                "UPDATE turns SET status='closed', updated_at=? WHERE session_id=? AND status='open'",
                (now, session_id),
            )

    def sessions_for_prefixes(self, digests: list[str]) -> dict[str, str]:
        """digest → session id for the ``digests`` the store remembers (see :meth:`record_turn`)."""
        found: dict[str, str] = {}
        for start in range(0, len(digests), 500):  # SQLite caps the number of bound parameters
            chunk = digests[start : start + 500]
            rows = self._all(
                f"SELECT digest, session_id FROM prefixes WHERE digest IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            found.update(dict(rows))
        return found

    def latest_prefix(self, session_id: str) -> str | None:
        """The digest remembered with ``session_id``'s newest turn: the one conversation that still
        continues it (an older one continued is a branch)."""
        row = self._one(
            "SELECT digest FROM prefixes WHERE session_id=? ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (session_id,),
        )
        return row[0] if row else None

    def prune_prefixes(self, keep: int) -> int:
        """Forget all but the ``keep`` newest remembered prefixes; returns how many were dropped."""
        with self._tx() as db:
            cur = db.execute(
                "DELETE FROM prefixes WHERE digest NOT IN "
                "(SELECT digest FROM prefixes ORDER BY created_at DESC, rowid DESC LIMIT ?)",
                (keep,),
            )
            return cur.rowcount

    def next_turn_index(self, session_id: str) -> int:
        row = self._one("SELECT MAX(turn_index) FROM turns WHERE session_id=?", (session_id,))
        return 0 if row[0] is None else row[0] + 1

    def session_turns(self, session_id: str) -> list[Turn]:
        rows = self._all("SELECT data FROM turns WHERE session_id=? ORDER BY turn_index", (session_id,))
        return [Turn.model_validate_json(r[0]) for r in rows]

    def turn_status(self, session_id: str, turn_index: int) -> str | None:
        row = self._one(
            "SELECT status FROM turns WHERE session_id=? AND turn_index=?", (session_id, turn_index)
        )
        return None if row is None else row[0]

    # ---------------------------------------------------------------- judge side
    def turns_to_judge(self, limit: int = 16) -> list[Turn]:
        """A read-only look at due turns (next state attached, not judged, failed ones once their
        retry is due) that no judge holds a live lease on. It claims nothing: a judge that runs
        next to others must use :meth:`claim_turns`."""
        now = time.time()
        rows = self._all(_DUE_TURNS, (now, now, limit))
        return [Turn.model_validate_json(r[2]) for r in rows]

    def claim_turns(self, worker: str, limit: int, lease_s: float) -> list[Turn]:
        """Lease up to ``limit`` due turns to judge ``worker`` for ``lease_s`` seconds, oldest first.

        Due: ``ready``, or ``failed`` with its retry time passed; and not under another judge's
        live lease. Selection and lease are one IMMEDIATE transaction, so concurrent callers (any
        process) get disjoint turns. Statuses do not change. A turn whose lease ran out is claimable
        again, even by a different judge — see :meth:`save_judgement` for what happens to the
        first judge's late result.
        """
        if not worker:
            raise ValueError("claim_turns: worker must be a non-empty judge id")
        if limit < 1:
            raise ValueError(f"claim_turns: limit must be >= 1, got {limit}")
        if lease_s <= 0:
            raise ValueError(f"claim_turns: lease_s must be > 0, got {lease_s}")
        now = time.time()
        with self._tx() as db:
            rows = db.execute(_DUE_TURNS, (now, now, limit)).fetchall()
            db.executemany(
                "UPDATE turns SET claimed_by=?, lease_until=? WHERE session_id=? AND turn_index=?",
                [(worker, now + lease_s, r[0], r[1]) for r in rows],
            )
        return [Turn.model_validate_json(r[2]) for r in rows]

    def release_claims(self, worker: str) -> int:
        """Free every lease ``worker`` holds (a judge restarting under the same id: the turns its
        previous incarnation had in flight are due again at once). Returns how many were freed."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE turns SET claimed_by=NULL, lease_until=NULL WHERE claimed_by=?", (worker,)
            )
            return cur.rowcount

    def claimed_by(self, session_id: str, turn_index: int) -> str | None:
        """The judge holding a lease on the turn (expired or not), or None."""
        row = self._one(
            "SELECT claimed_by FROM turns WHERE session_id=? AND turn_index=?", (session_id, turn_index)
        )
        return None if row is None else row[0]

    def save_judgement(
        self,
        turn: Turn,
        result: JudgeResult,
        samples: Sequence[Sample] = (),
        retry_after_s: float = 10.0,
        worker: str | None = None,
    ) -> bool:
        """Record a judgement next to its turn; True when it was applied.

        A failed one (``result.error``) is stored as an error and retried after ``retry_after_s`` —
        never as a score. Samples are inserted in the same commit. The judgement applies only while
        the turn still waits for one (``ready`` / ``failed``) and is leased to ``worker`` or to no
        one; otherwise — another judge took the turn over after this one's lease ran out, or already
        saved it — nothing changes, no sample is inserted, and the result is False. Applying clears
        the lease.
        """
        now = time.time()
        key = (turn.session_id, turn.turn_index)
        with self._tx() as db:
            row = db.execute(
                "SELECT status, claimed_by FROM turns WHERE session_id=? AND turn_index=?", key
            ).fetchone()
            if row is None or row[0] not in ("ready", "failed") or row[1] not in (None, worker):
                return False
            if result.ok:
                db.execute(
                    "UPDATE turns SET status='judged', judge=?, score=?, error=NULL, updated_at=?, "
                    "claimed_by=NULL, lease_until=NULL WHERE session_id=? AND turn_index=?",
                    (result.model_dump_json(), result.score, now, *key),
                )
                for s in samples:
                    self._insert_sample(db, s, now)
            else:
                db.execute(
                    "UPDATE turns SET status='failed', judge=?, error=?, judge_attempts=judge_attempts+1, "
                    "retry_at=?, updated_at=?, claimed_by=NULL, lease_until=NULL "
                    "WHERE session_id=? AND turn_index=?",
                    (result.model_dump_json(), result.error, now + retry_after_s, now, *key),
                )
            return True

    def judgement(self, session_id: str, turn_index: int) -> JudgeResult | None:
        row = self._one(
            "SELECT judge FROM turns WHERE session_id=? AND turn_index=?", (session_id, turn_index)
        )
        return None if row is None or row[0] is None else JudgeResult.model_validate_json(row[0])

    def judged_turns(self, session_id: str) -> tuple[list[Turn], dict[int, JudgeResult]]:
        """A session's turns, and the successful judgements of those judged, in one query."""
        rows = self._all(
            "SELECT data, status, judge FROM turns WHERE session_id=? ORDER BY turn_index", (session_id,)
        )
        turns, results = [], {}
        for data, status, judge in rows:
            turn = Turn.model_validate_json(data)
            turns.append(turn)
            if status == "judged" and judge is not None:
                result = JudgeResult.model_validate_json(judge)
                if result.ok:
                    results[turn.turn_index] = result
        return turns, results

    def sessions_needing_guarantee(self) -> list[str]:
        """Done sessions, fully judged, with no sample yet and no guarantee applied."""
        rows = self._all(
            "SELECT s.session_id FROM sessions s WHERE s.done=1 AND s.guaranteed=0 AND s.group_id IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id=s.session_id "
            "                AND t.status IN ('open','ready','failed')) "
            "AND NOT EXISTS (SELECT 1 FROM samples x WHERE x.session_id=s.session_id)"
        )
        return [r[0] for r in rows]

    def close_quiet_groups(self, quiet_s: float = GROUP_QUIET_S) -> int:
        """Close the unfinished members of every group quiet for ``quiet_s``: their episodes died
        mid-way (an environment worker killed, the launcher gone), and nobody will finish them. Their
        judged turns then count with the group instead of waiting for it forever. Returns how many
        sessions were closed."""
        cutoff = time.time() - quiet_s
        with self._tx() as db:
            quiet = [
                r[0]
                for r in db.execute(
                    "SELECT s.group_id FROM sessions s WHERE s.group_id IS NOT NULL AND s.grouped=0 "
                    "GROUP BY s.group_id HAVING SUM(s.done) < COUNT(*) AND COALESCE((SELECT MAX(t.updated_at) "
                    "FROM turns t JOIN sessions u ON u.session_id=t.session_id WHERE u.group_id=s.group_id), "
                    "MAX(s.created_at)) <= ?",
                    (cutoff,),
                ).fetchall()
            ]
            closed = 0
            for group_id in quiet:
                members = "SELECT session_id FROM sessions WHERE group_id=? AND done=0"
                db.execute(
                    f"UPDATE turns SET status='closed', updated_at=? WHERE status='open' AND session_id IN ({members})",
                    (time.time(), group_id),
                )
                closed += db.execute(
                    "UPDATE sessions SET done=1 WHERE group_id=? AND done=0", (group_id,)
                ).rowcount
            return closed

    def groups_ready(self, quiet_s: float = GROUP_QUIET_S) -> list[str]:
        """Episode groups whose samples can be made: not done yet, no member turn waiting for the
        judge, and either every member finished (``group_size`` done sessions) or the group has been
        quiet for ``quiet_s`` with at least one finished member."""
        now = time.time()
        rows = self._all(
            "SELECT s.group_id, MAX(s.group_size), SUM(s.done), "
            "       (SELECT MAX(t.updated_at) FROM turns t JOIN sessions u ON u.session_id=t.session_id "
            "        WHERE u.group_id=s.group_id) "
            "FROM sessions s WHERE s.group_id IS NOT NULL AND s.grouped=0 GROUP BY s.group_id"
        )
        ready = []
        for group_id, size, done, last in rows:
            if not done or (done < (size or 1) and now - (last or now) < quiet_s):
                continue
            waiting = self._one(
                "SELECT 1 FROM turns t JOIN sessions s ON s.session_id=t.session_id "
                "WHERE s.group_id=? AND s.done=1 AND t.status IN ('ready','failed') LIMIT 1",
                (group_id,),
            )
            if waiting is None:
                ready.append(group_id)
        return ready

    def group_ids(self) -> list[str]:
        """Every episode group the store has seen, in the order its first member arrived."""
        rows = self._all(
            "SELECT group_id FROM sessions WHERE group_id IS NOT NULL GROUP BY group_id ORDER BY MIN(created_at)"
        )
        return [r[0] for r in rows]

    def group_episodes(self, group_id: str) -> list[tuple[str, float | None]]:
        """(session id, outcome) of a group's finished members, oldest first."""
        return [
            (r[0], r[1])
            for r in self._all(
                "SELECT session_id, outcome FROM sessions WHERE group_id=? AND done=1 ORDER BY created_at, session_id",
                (group_id,),
            )
        ]

    def apply_group(self, group_id: str, samples: list[Sample]) -> bool:
        """Insert a group's samples and mark every member as done with (so it is made once, even
        with several judges racing). Returns whether this call was the one that applied it."""
        now = time.time()
        with self._tx() as db:
            cur = db.execute("UPDATE sessions SET grouped=1 WHERE group_id=? AND grouped=0", (group_id,))
            if cur.rowcount == 0:
                return False
            for s in samples:
                self._insert_sample(db, s, now)
            return True

    def add_to_meta(self, key: str, counts: dict[str, float]) -> None:
        """Add ``counts`` to the numbers kept under ``key`` (one atomic read-modify-write)."""
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            have: dict[str, float] = json.loads(row[0]) if row else {}
            for k, v in counts.items():
                have[k] = have.get(k, 0) + v
            self._set_meta(db, key, have)

    def apply_guarantee(self, session_id: str, sample: Sample | None) -> bool:
        """Mark the session's at-least-one rule as applied and insert its sample (if any).

        Idempotent under races: several judges may find the same session in
        :meth:`sessions_needing_guarantee`; only the caller whose commit flips ``guaranteed`` from
        0 to 1 inserts the sample. Returns whether this call was that one.
        """
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "UPDATE sessions SET guaranteed=1 WHERE session_id=? AND guaranteed=0", (session_id,)
            )
            if cur.rowcount != 1:
                return False
            if sample is not None:
                self._insert_sample(db, sample, now)
            return True

    # ---------------------------------------------------------------- trainer side
    @staticmethod
    def _insert_sample(db: sqlite3.Connection, s: Sample, now: float) -> None:
        db.execute(
            "INSERT OR IGNORE INTO samples(sample_id, session_id, turn_index, policy_version, reward, status, "
            "data, created_at, user) VALUES (?, ?, ?, ?, ?, 'ready', ?, ?, ?)",
            (
                s.sample_id,
                s.session_id,
                s.turn_index,
                s.policy_version,
                s.reward,
                s.model_dump_json(),
                now,
                s.user,
            ),
        )

    def add_samples(self, samples: list[Sample]) -> None:
        now = time.time()
        with self._tx() as db:
            for s in samples:
                self._insert_sample(db, s, now)

    def turns_waiting(self) -> int:
        """Main turns with their next state that the judge has not judged yet."""
        return self._one("SELECT COUNT(*) FROM turns WHERE status='ready'")[0]

    def ready_count(self) -> int:
        """Samples waiting for the trainer: the environments' backlog."""
        return self._one("SELECT COUNT(*) FROM samples WHERE status='ready'")[0]

    def ready_by_user(self) -> dict[str, int]:
        """Ready samples per user (per_user training takes turns by these)."""
        return dict(self._all("SELECT user, COUNT(*) FROM samples WHERE status='ready' GROUP BY user"))

    def claim_samples(
        self,
        n: int,
        step: int,
        current_version: int,
        max_staleness: int | None = None,
        user: str | None = None,
    ) -> list[Sample]:
        """Claim up to ``n`` ready samples for training step ``step``: of the newest policy version
        first, oldest first within a version (``user``: only theirs, and only their samples are
        dropped). Samples more than ``max_staleness`` versions behind ``current_version`` are
        dropped (and counted).

        Why newest first: samples of the policy now served teach it about its own current mistakes
        (on-policy); older ones fill a batch when there are too few. Oldest-first let a burst of
        base-policy rollouts feed every update of a run (docs/training.md "Fresh samples first")."""
        only = "" if user is None else " AND user=?"
        args: tuple[object, ...] = () if user is None else (user,)
        with self._tx() as db:
            if max_staleness is not None:
                db.execute(
                    f"UPDATE samples SET status='dropped' WHERE status='ready' AND policy_version < ?{only}",
                    (current_version - max_staleness, *args),
                )
            rows = db.execute(
                f"SELECT sample_id, data FROM samples WHERE status='ready'{only} "
                "ORDER BY policy_version DESC, created_at, sample_id LIMIT ?",
                (*args, n),
            ).fetchall()
            db.executemany(
                "UPDATE samples SET status='claimed', step=? WHERE sample_id=?", [(step, r[0]) for r in rows]
            )
        return [Sample.model_validate_json(r[1]) for r in rows]

    def samples(self, status: SampleStatus | None = None) -> list[Sample]:
        """Every sample (``status``: only those, e.g. ``"trained"``), oldest first; for reports."""
        where, args = ("", ()) if status is None else (" WHERE status=?", (status,))
        rows = self._all(f"SELECT data FROM samples{where} ORDER BY created_at, sample_id", args)
        return [Sample.model_validate_json(r[0]) for r in rows]

    def commit_checkpoint(self, step: int, policy_version: int) -> int:
        """After a checkpoint at ``step`` is on disk: its claimed samples become trained. Returns how
        many did (0 when ``openclaw-rl users delete`` removed a per_user update's samples meanwhile)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE samples SET status='trained' WHERE status='claimed' AND step<=?", (step,)
            )
            self._set_meta(db, "trainer_step", step)
            self._set_meta(db, "checkpoint_version", policy_version)
            return cur.rowcount

    def claimed_count(self, step: int) -> int:
        """How many samples the update of ``step`` still holds (fewer than it claimed, or none, when
        their user was deleted during the update)."""
        row = self._one("SELECT COUNT(*) FROM samples WHERE status='claimed' AND step=?", (step,))
        return int(row[0]) if row else 0

    @staticmethod
    def _rejudge_rerated(db: sqlite3.Connection, where: str, args: tuple[object, ...]) -> int:
        """Samples about to go back to ready (``where`` on ``samples``) whose turn the user rated
        after they were made carry the old verdict: they are removed, with the turn's other untrained
        samples, and the turn is judged again from its rating, so the rating is what trains (the
        judge's new samples could not be saved beside the old ones: a sample's id is its turn's).
        Returns how many samples were removed."""
        turns = db.execute(
            "SELECT DISTINCT s.session_id, s.turn_index FROM samples s JOIN turns t "
            "ON t.session_id=s.session_id AND t.turn_index=s.turn_index "
            "JOIN feedback f ON f.response_id=t.response_id "
            f"WHERE {where} AND f.created_at > s.created_at",
            args,
        ).fetchall()
        removed = 0
        for key in turns:
            removed += db.execute(
                f"DELETE FROM samples AS s WHERE session_id=? AND turn_index=? AND (status='ready' OR ({where}))",
                (*key, *args),
            ).rowcount
            db.execute(
                "UPDATE turns SET status='ready', retry_at=0, error=NULL, claimed_by=NULL, lease_until=NULL "
                "WHERE session_id=? AND turn_index=? AND status IN ('judged', 'failed')",
                key,
            )
        return removed

    def release_sample_claims(self, step: int) -> int:
        """The update of ``step`` was abandoned and taken back (Ctrl-C mid-update): its claimed
        samples go back to ready, in their old order (by version and creation); those of a turn
        rated since are judged again instead (:meth:`_rejudge_rerated`). Returns how many."""
        with self._tx() as db:
            self._rejudge_rerated(db, "s.status='claimed' AND s.step=?", (step,))
            cur = db.execute(
                "UPDATE samples SET status='ready', step=NULL WHERE status='claimed' AND step=?", (step,)
            )
            return cur.rowcount

    def untrain_after(self, checkpoint_step: int) -> int:
        """The trainer resumed from an older checkpoint than the store's newest commit (a damaged
        newest one moved aside): samples trained after it are in no weights any more, so they go back
        to ready and are trained again, into the weights that survive. Returns how many."""
        with self._tx() as db:
            self._rejudge_rerated(db, "s.status='trained' AND s.step>?", (checkpoint_step,))
            cur = db.execute(
                "UPDATE samples SET status='ready', step=NULL WHERE status='trained' AND step>?",
                (checkpoint_step,),
            )
            if cur.rowcount:
                self._set_meta(db, "trainer_step", checkpoint_step)
            return cur.rowcount

    def recover_claims(self, checkpoint_step: int) -> int:
        """On trainer start: claims newer than the checkpoint go back to ready; older ones were
        trained into it. Returns how many samples were released."""
        with self._tx() as db:
            db.execute(
                "UPDATE samples SET status='trained' WHERE status='claimed' AND step<=?", (checkpoint_step,)
            )
            self._rejudge_rerated(db, "s.status='claimed' AND s.step>?", (checkpoint_step,))
            cur = db.execute(
                "UPDATE samples SET status='ready', step=NULL WHERE status='claimed' AND step>?",
                (checkpoint_step,),
            )
            return cur.rowcount

    # ---------------------------------------------------------------- users & feedback
    def add_user(self, name: str, key: IssuedKey, replace: bool = False) -> None:
        """Register ``name`` with ``key`` (only its digest is kept); :class:`UserError` if taken.
        ``replace``: give an existing user ``key`` in place of their old one (a lost or leaked key),
        keeping everything else of theirs; :class:`UserError` if they have no key to replace."""
        with self._tx() as db:
            row = db.execute("SELECT key_id FROM users WHERE name=?", (name,)).fetchone()
            has_key = row is not None and row[0] is not None
            if replace and not has_key:
                raise UserError(f"user {name!r} has no key to replace: add them without --new-key")
            if has_key and not replace:
                raise UserError(
                    f"user {name!r} already exists: `openclaw-rl users add {name} --new-key` gives them a "
                    "new key (the old one stops working; their turns and adapter stay), `openclaw-rl "
                    "users delete` removes them"
                )
            # their folders (policy/users/NAME) would be one on a case-insensitive file system
            other = _case_twin(db, name)
            if other is not None:
                raise UserError(
                    f"{name!r} differs only in case from the existing user {other!r}: names may not differ "
                    "only in case (their folders would be one on a case-insensitive file system)"
                )
            db.execute(
                "INSERT OR REPLACE INTO users(name, key_id, key_salt, key_digest, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, key.key_id, key.salt, key.digest, time.time()),
            )

    def case_twin(self, name: str) -> str | None:
        """A user the run knows (added with a key, or named by a gateway's traffic) whose name differs
        from ``name`` only in case, or None."""
        with self._lock:
            return _case_twin(self._db, name)

    def user_has_key(self, name: str) -> bool:
        """Whether ``name`` was added with a key and still has it."""
        with self._lock:
            return _has_key(self._db, name)

    def user_key(self, key_id: str) -> tuple[str, str, str] | None:
        """(name, salt, digest) of the user whose key has ``key_id``, or None."""
        row = self._one("SELECT name, key_salt, key_digest FROM users WHERE key_id=?", (key_id,))
        return None if row is None else (row[0], row[1], row[2])

    def user_names(self) -> list[str]:
        """Everyone the run knows: users added with a key and users named by the traffic."""
        rows = self._all(
            "SELECT name FROM users UNION SELECT DISTINCT user FROM sessions WHERE EXISTS "
            "(SELECT 1 FROM turns t WHERE t.session_id=sessions.session_id) ORDER BY 1"
        )
        return [r[0] for r in rows]

    def user_stats(self, name: str, adapter_version: str, window: int = 50) -> UserStats:
        """The ``users list`` line of ``name``; ``positive_rate`` over their last ``window`` judged turns."""
        with self._lock:  # one consistent read of the user's rows (see _all)
            db = self._db
            has_key = _has_key(db, name)
            owned = "t.session_id IN (SELECT session_id FROM sessions WHERE user=?)"
            turns, judged = db.execute(
                f"SELECT COUNT(*), COALESCE(SUM(t.status='judged'), 0) FROM turns t "
                f"WHERE t.turn_type='main' AND {owned}",
                (name,),
            ).fetchone()
            recent = db.execute(
                f"SELECT t.score FROM turns t WHERE t.status='judged' AND {owned} "
                "ORDER BY t.updated_at DESC LIMIT ?",
                (name, window),
            ).fetchall()
            samples, updates = db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT CASE WHEN status='trained' THEN step END) FROM samples WHERE user=?",
                (name,),
            ).fetchone()
            up, down = db.execute(
                # a response rated again counts once, as its latest rating (the one that trains)
                "SELECT COALESCE(SUM(rating=1), 0), COALESCE(SUM(rating=-1), 0) FROM feedback "
                "WHERE rowid IN (SELECT MAX(rowid) FROM feedback WHERE user=? GROUP BY response_id)",
                (name,),
            ).fetchone()
        return UserStats(
            name=name,
            has_key=has_key,
            turns=int(turns),
            judged=int(judged),
            samples=int(samples),
            updates=int(updates),
            adapter_version=adapter_version,
            positive_rate=(sum(1 for (sc,) in recent if sc == 1) / len(recent)) if recent else None,
            feedback_up=int(up),
            feedback_down=int(down),
        )

    def recent_user_hints(self, name: str, limit: int) -> list[str]:
        """Up to ``limit`` distinct hints the judge drew from ``name``'s own replies, newest first.

        Only hints from a next state the user wrote count — a reply, or a feedback comment (a tool's
        output is about its turn, not about what the user wants); repeats (:func:`hint_words`) count
        once. They are read back from the judgements, so a restart keeps them and ``users delete``
        removes them with the turns. Only the user's latest ``8 * limit`` sessions are read: the
        judgements hold the teacher's log-probs, too large to parse for a user's whole history on
        every judged turn.
        """
        if limit <= 0:
            return []
        rows = self._all(
            "SELECT json_extract(t.judge, '$.hint') FROM turns t "
            "JOIN sessions s ON s.session_id=t.session_id "
            "WHERE s.session_id IN (SELECT session_id FROM sessions WHERE user=? "
            "                       ORDER BY created_at DESC LIMIT ?) "
            "AND t.status='judged' AND json_extract(t.judge, '$.hint') IS NOT NULL "
            "AND json_extract(t.data, '$.next_state.role')='user' "
            "ORDER BY t.updated_at DESC LIMIT ?",
            (name, 8 * limit, 4 * limit),
        )
        hints: list[str] = []
        seen: set[str] = set()
        for (hint,) in rows:
            norm = hint_words(str(hint))
            if norm and norm not in seen:
                seen.add(norm)
                hints.append(str(hint))
                if len(hints) == limit:
                    break
        return hints

    def user_turns(self, name: str) -> Iterator[tuple[Turn, str, int | None]]:
        """Every turn of ``name``'s sessions with its status and judged score, oldest first."""
        rows = self._all(
            "SELECT t.data, t.status, t.score FROM turns t JOIN sessions s ON s.session_id=t.session_id "
            "WHERE s.user=? ORDER BY s.created_at, t.session_id, t.turn_index",
            (name,),
        )
        for data, status, score in rows:
            yield Turn.model_validate_json(data), status, score

    def recent_turns(self, limit: int, user: str | None = None) -> list[tuple[Turn, str, int | None]]:
        """The ``limit`` newest recorded turns (``user``: of that user's sessions), newest first,
        each with its status and judged score: what ``openclaw-rl turns`` lists."""
        only, args = ("WHERE s.user=? ", (user, limit)) if user is not None else ("", (limit,))
        rows = self._all(
            "SELECT t.data, t.status, t.score FROM turns t JOIN sessions s ON s.session_id=t.session_id "
            f"{only}ORDER BY t.rowid DESC LIMIT ?",
            args,
        )
        return [(Turn.model_validate_json(data), status, score) for data, status, score in rows]

    def delete_user(self, name: str) -> dict[str, int]:
        """Remove everything the store holds about ``name`` — key, sessions, turns (with their
        judgements), samples, remembered prefixes, feedback, adapter version — in one commit; returns
        the counts removed. Deleted pages are overwritten (``secure_delete``) and the file compacted,
        so the bytes do not linger in free pages or the write-ahead log."""
        with self._lock:  # deleted rows are overwritten, not left in free pages (set outside a transaction)
            self._db.execute("PRAGMA secure_delete=ON")
        with self._tx() as db:
            own = "SELECT session_id FROM sessions WHERE user=?"
            counts = {
                "key": db.execute("DELETE FROM users WHERE name=? AND key_id IS NOT NULL", (name,)).rowcount,
                "turns": db.execute(f"DELETE FROM turns WHERE session_id IN ({own})", (name,)).rowcount,
                "samples": db.execute(
                    f"DELETE FROM samples WHERE user=? OR session_id IN ({own})", (name, name)
                ).rowcount,
                "prefixes": db.execute(f"DELETE FROM prefixes WHERE session_id IN ({own})", (name,)).rowcount,
                "feedback": db.execute("DELETE FROM feedback WHERE user=?", (name,)).rowcount,
                "responses": db.execute(
                    f"DELETE FROM chains WHERE user=? OR session_id IN ({own})", (name, name)
                ).rowcount,
                "sessions": db.execute("DELETE FROM sessions WHERE user=?", (name,)).rowcount,
            }
            db.execute("DELETE FROM users WHERE name=?", (name,))
            counts["adapter_version_rows"] = db.execute(
                "DELETE FROM meta WHERE key=?", (adapter_meta(name),)
            ).rowcount
        self._checkpoint_whole()
        with self._lock:
            self._db.execute("VACUUM")
        counts["store_compacted"] = int(self._checkpoint_whole())
        return counts

    def _checkpoint_whole(self) -> bool:
        """Copy the whole write-ahead log into the database file and empty it; False when another
        process's read kept it from finishing within the busy timeout (30 s; serving, the judge and
        the trainer each hold a read for milliseconds), which leaves deleted rows' old pages in the
        file or the log."""
        with self._lock:
            busy, log_frames, copied = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy and log_frames in (0, copied, -1)

    def save_chain(
        self,
        response_id: str,
        user: str,
        session_id: str,
        messages: list[dict[str, Any]],
        response: dict[str, Any] | None = None,
    ) -> None:
        """Keep a stored response's whole conversation (its input and its output, as chat messages)
        and the response object itself, so a request naming it as ``previous_response_id`` continues
        it and ``GET /v1/responses/{id}`` returns it (Responses API)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO chains(response_id, user, session_id, messages, created_at, response) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    response_id,
                    user,
                    session_id,
                    json.dumps(messages, ensure_ascii=False),
                    time.time(),
                    None if response is None else json.dumps(response, ensure_ascii=False),
                ),
            )

    def chain(self, response_id: str) -> StoredResponse | None:
        """A stored response, or None."""
        row = self._one(
            "SELECT user, session_id, messages, response FROM chains WHERE response_id=?", (response_id,)
        )
        if row is None:
            return None
        return StoredResponse(
            row[0], row[1], json.loads(row[2]), None if row[3] is None else json.loads(row[3])
        )

    def delete_chain(self, response_id: str) -> bool:
        """Forget a stored response (it can no longer be retrieved or continued); False if unknown.
        The turn it served stays in the training record, as every turn does until its user is deleted."""
        with self._tx() as db:
            return db.execute("DELETE FROM chains WHERE response_id=?", (response_id,)).rowcount > 0

    def turn_by_response(self, response_id: str) -> tuple[Turn, str] | None:
        """(turn, owner) of the main turn the client saw as completion ``response_id``."""
        row = self._one(
            "SELECT t.data, s.user FROM turns t JOIN sessions s ON s.session_id=t.session_id "
            "WHERE t.response_id=? AND t.turn_type='main'",
            (response_id,),
        )
        return None if row is None else (Turn.model_validate_json(row[0]), row[1])

    def record_feedback(self, feedback: Feedback) -> FeedbackOutcome | None:
        """Make ``feedback`` the explicit next state of its turn, in one commit.

        The turn is judged again from the rating (``ready``, its untrained samples withdrawn; a judge
        still holding the turn cannot save its stale verdict, see :data:`FEEDBACK_LEASE`); samples
        already trained stay as they are and are not made twice (their ids are the turn's). The
        caller checks ownership first (:meth:`turn_by_response`); None: no such response (or it
        vanished meanwhile). Nothing is written then.
        """
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT session_id, turn_index, status, data FROM turns WHERE response_id=? AND turn_type='main'",
                (feedback.response_id,),
            ).fetchone()
            if row is None:
                return None
            sid, index, status, data = row
            turn = Turn.model_validate_json(data)
            replaced = turn.next_state is not None
            turn.next_state = NextState(role="user", content=feedback.comment or "", rating=feedback.rating)
            db.execute(
                "INSERT INTO feedback(response_id, user, rating, comment, created_at) VALUES (?, ?, ?, ?, ?)",
                (feedback.response_id, feedback.user, feedback.rating, feedback.comment, now),
            )
            trained = db.execute(
                "SELECT 1 FROM samples WHERE session_id=? AND turn_index=? AND status IN ('claimed','trained')",
                (sid, index),
            ).fetchone()
            db.execute(
                "DELETE FROM samples WHERE session_id=? AND turn_index=? AND status='ready'", (sid, index)
            )
            db.execute(
                "UPDATE turns SET status='ready', data=?, error=NULL, retry_at=0, updated_at=?, "
                "claimed_by=?, lease_until=0 WHERE session_id=? AND turn_index=?",
                (turn.model_dump_json(), now, FEEDBACK_LEASE, sid, index),
            )
            return FeedbackOutcome(
                session_id=sid, turn_index=index, will_train=trained is None, replaced_next_state=replaced
            )

    # ---------------------------------------------------------------- meta & counters
    @staticmethod
    def _set_meta(db: sqlite3.Connection, key: str, value: object) -> None:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def set_meta(self, key: str, value: object) -> None:
        with self._tx() as db:
            self._set_meta(db, key, value)

    def get_meta(self, key: str, default: object = None) -> object:
        row = self._one("SELECT value FROM meta WHERE key=?", (key,))
        return default if row is None else json.loads(row[0])

    def _meta_int(self, key: str, default: int) -> int:
        """A counter kept in ``meta`` (written as a JSON number), or ``default`` while unset."""
        value = self.get_meta(key, default)
        if not isinstance(value, int | float | str):  # what int() accepts of what JSON holds
            raise TypeError(f"meta {key!r} is {value!r}, not a number")
        return int(value)

    def counters(self) -> Counters:
        turn_counts = dict(
            self._all("SELECT status, COUNT(*) FROM turns WHERE turn_type='main' GROUP BY status")
        )
        sample_counts = dict(self._all("SELECT status, COUNT(*) FROM samples GROUP BY status"))
        reward = self._one("SELECT AVG(score) FROM turns WHERE status='judged'")[0]
        sessions = self._one("SELECT COUNT(DISTINCT session_id) FROM turns WHERE turn_type='main'")[0]
        adapters = [
            int(v)
            for (v,) in self._all("SELECT value FROM meta WHERE key LIKE ?", (adapter_meta("") + "%",))
            if str(v).isdigit() and int(v) > 0
        ]
        return Counters(
            turns=sum(turn_counts.values()),
            open=turn_counts.get("open", 0),
            waiting=turn_counts.get("ready", 0),
            judged=turn_counts.get("judged", 0),
            failed=turn_counts.get("failed", 0),
            samples_ready=sample_counts.get("ready", 0),
            samples_claimed=sample_counts.get("claimed", 0),
            samples_trained=sample_counts.get("trained", 0),
            samples_dropped=sample_counts.get("dropped", 0),
            reward_mean=None if reward is None else float(reward),
            policy_version=self._meta_int("policy_version", 0),
            trainer_step=self._meta_int("trainer_step", 0),
            trainer_updates=self._meta_int("trainer_updates", self._meta_int("trainer_step", 0)),
            sessions=int(sessions),
            user_adapters=len(adapters),
            newest_user_version=max(adapters, default=0),
        )


def _case_twin(db: sqlite3.Connection, name: str) -> str | None:
    row = db.execute(
        "SELECT name FROM users WHERE lower(name)=lower(?) AND name<>? AND key_id IS NOT NULL "
        "UNION SELECT user FROM sessions WHERE lower(user)=lower(?) AND user<>? LIMIT 1",
        (name, name, name, name),
    ).fetchone()
    return None if row is None else str(row[0])


def _has_key(db: sqlite3.Connection, name: str) -> bool:
    return (
        db.execute("SELECT 1 FROM users WHERE name=? AND key_id IS NOT NULL", (name,)).fetchone() is not None
    )
