"""Which session a request belongs to, its turn index, and the next state it carries.

Explicit identity comes from ``X-Session-Id`` / ``X-Turn-Type`` / ``X-Session-Done`` (or the same keys
in the body). A plain OpenAI client sends none of them, yet re-sends the whole conversation on every
call; peers drop such traffic as untrainable. We stitch it instead: after each main turn we remember
a digest of *its messages plus the assistant reply we produced*; a later request whose messages start
with such a prefix continues that session. The longest matching prefix wins. A conversation that
branches (the user edits an earlier message) starts a new session rather than corrupting the old one;
so does a request that is an older turn's conversation plus one new message after the session went
on past it (the last message regenerated or edited), which must not become the next state of a turn
it never answered. A request that goes on past an older turn with assistant messages of its own is
that later conversation with some of it rewritten (OpenClaw shortens old tool results): it continues.

Digests use a canonical form of each message (role, stripped text, tool calls with parsed arguments)
because clients re-serialise what they echo back (``content: null`` vs ``""``, argument whitespace).
Each digest is written to the store in the same commit as its turn, and kept in memory (LRU-capped)
for speed: after a restart a headerless conversation continues its session, found in the store. The
store keeps the newest ``max_prefixes`` digests (pruned every ``PRUNE_EVERY`` turns).

Digests are per user: the same conversation from two users is two sessions, so nobody's reply is
ever stitched onto someone else's turn (the default user's digests are the plain ones, as before
users existed, so an old store's sessions continue).

The next state of the previous main turn is what the client added after the last assistant message:
the newest non-assistant message (several consecutive tool results are joined, in order, under the
newest one's role), if its role is ``user``, ``tool`` or ``environment``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import takewhile
from typing import Any

from openclaw_rl.policy.protocol import ChatMessage
from openclaw_rl.runtime.store import Store
from openclaw_rl.types import DEFAULT_USER, EpisodeTag, NextState, TurnType

STATE_ROLES = ("user", "tool", "environment")
#: Remembered prefixes between two prunings of the store's prefix table.
PRUNE_EVERY = 10_000


@dataclass
class Assignment:
    """Where one request's turn goes."""

    session_id: str
    turn_index: int
    turn_type: TurnType
    next_state: NextState | None
    done: bool
    stitched: bool  # True when the session was found by conversation prefix
    episode: EpisodeTag | None = None  # the environment's group / outcome headers, when sent
    user: str = DEFAULT_USER

    @property
    def client_session_id(self) -> str:
        """The session id as its client knows it (:func:`client_session_id`)."""
        return client_session_id(self.user, self.session_id)


def scoped_session_id(user: str, session_id: str) -> str:
    """The stored id of ``user``'s session ``session_id``. Session ids are chosen by clients, so two
    users may both call theirs "work": a named user's ids are kept as ``user/id`` (a user name holds
    no "/"; an id already under the user stays). The ``default`` user's ids are kept as sent, but
    for one with a "/" in it, which is kept as ``default/id``: sent as ``alice/work`` it would
    otherwise be alice's session ``work``, taken before she could open it."""
    if user == DEFAULT_USER:
        return f"{user}/{session_id}" if "/" in session_id else session_id
    if session_id.startswith(f"{user}/"):
        return session_id
    return f"{user}/{session_id}"


def client_session_id(user: str, session_id: str) -> str:
    """The inverse of :func:`scoped_session_id`: what the answer's ``X-Session-Id`` says, so a client
    that sends it back continues the same session."""
    prefix = f"{user}/"
    return session_id.removeprefix(prefix)


def _canon_calls(calls: list[Any] | None) -> list[tuple[str, str]]:
    out = []
    for c in calls or []:
        fn = c["function"] if isinstance(c, dict) else c.function
        name = fn["name"] if isinstance(fn, dict) else fn.name
        raw = fn.get("arguments", "{}") if isinstance(fn, dict) else fn.arguments
        try:
            args = json.dumps(json.loads(raw or "{}"), sort_keys=True)
        except (json.JSONDecodeError, TypeError):
            args = str(raw)
        out.append((name, args))
    return out


def canonical(
    role: str, text: str, tool_calls: list[Any] | None = None
) -> tuple[str, str, list[tuple[str, str]]]:
    return (role, text.strip(), _canon_calls(tool_calls))


Item = tuple[str, str, list[tuple[str, str]]]


def digest(items: list[Item], user: str = DEFAULT_USER) -> str:
    """The key a conversation (its canonical items) is remembered under, for ``user``."""
    return prefix_digests(items, [len(items)], user)[0]


def prefix_digests(items: list[Item], ends: list[int], user: str = DEFAULT_USER) -> list[str]:
    """:func:`digest` of ``items[:end]`` for each of ``ends``, in one pass over the items: a request
    of n messages has about n/2 candidate prefixes, and hashing each anew would cost n² (a client's
    20,000-message body held the event loop for a minute). The text hashed is ``json.dumps`` of the
    prefix, written piece by piece, so the keys equal those already stored."""
    head = hashlib.sha256((json.dumps(user) if user != DEFAULT_USER else "").encode() + b"[")
    wanted = set(ends)
    at: dict[int, str] = {}
    for n in range(len(items) + 1):
        if n in wanted:
            whole = head.copy()
            whole.update(b"]")
            at[n] = whole.hexdigest()
        if n < len(items):
            head.update(((", " if n else "") + json.dumps(items[n], ensure_ascii=False)).encode())
    return [at[end] for end in ends]


def next_state_of(messages: list[ChatMessage], clean: Callable[[str], str] | None = None) -> NextState | None:
    """What followed the last assistant message, as the previous turn's next state; ``clean``: what
    to take off each user message first (a client's timestamps: :mod:`~.client_rules`)."""
    tail: list[ChatMessage] = []
    for m in reversed(messages):
        if m.role == "assistant":
            break
        tail.append(m)
    tail.reverse()
    if not tail or tail[-1].role not in STATE_ROLES:
        return None
    if tail[-1].role == "tool":
        tools = [m for m in tail if m.role == "tool"]
        return NextState(role="tool", content="\n".join(m.text for m in tools))
    # Consecutive messages of the last one's role are joined: a user who wrote twice before the
    # next reply (a second thought) said both things to this turn. The same words twice are one
    # message sent again: a client that keeps an unanswered message after a failed request (the
    # server down, a timeout) and sends it once more.
    role = tail[-1].role
    texts = [m.text for m in reversed(list(takewhile(lambda m: m.role == role, reversed(tail))))]
    if clean is not None and role == "user":
        texts = [clean(text) for text in texts]
    said = [t for i, t in enumerate(texts) if i == 0 or t.strip() != texts[i - 1].strip()]
    return NextState(role=role, content="\n".join(said))


class SessionManager:
    """Thread-safe session bookkeeping shared by all requests of one service."""

    def __init__(self, store: Store, max_prefixes: int = 200_000):
        self.store = store
        self.max_prefixes = max_prefixes
        self._lock = threading.Lock()
        self._next_index: dict[str, int] = {}
        self._prefixes: OrderedDict[str, str] = OrderedDict()
        self._latest: OrderedDict[str, str] = OrderedDict()  # session -> the prefix that continues it
        self._since_prune = 0

    def _allocate(self, session_id: str) -> int:
        with self._lock:
            if session_id not in self._next_index:
                self._next_index[session_id] = self.store.next_turn_index(session_id)
            idx = self._next_index[session_id]
            self._next_index[session_id] = idx + 1
            return idx

    def release(self, session_id: str, turn_index: int) -> None:
        """A turn that was allocated ``turn_index`` and recorded nothing (its client went away, or
        it failed): give the index back if no later turn took one, so the session's turns stay
        numbered 0, 1, 2, ..."""
        with self._lock:
            if self._next_index.get(session_id) == turn_index + 1:
                self._next_index[session_id] = turn_index

    def _find_prefix(self, messages: list[ChatMessage], user: str) -> str | None:
        """The session of ``user`` whose remembered conversation is the longest prefix of ``messages``."""
        items = [canonical(m.role, m.text, m.tool_calls) for m in messages]
        # Longest first: every prefix that ends with an assistant message is a candidate.
        ends = [end for end in range(len(messages), 0, -1) if messages[end - 1].role == "assistant"]
        keys = prefix_digests(items, ends, user)
        found: tuple[int, str] | None = None  # (index into keys, session)
        with self._lock:
            hit = next((n for n, key in enumerate(keys) if key in self._prefixes), len(keys))
            if hit < len(keys):
                self._prefixes.move_to_end(keys[hit])
                found = (hit, self._prefixes[keys[hit]])
        # Longer prefixes than the one in memory may be in the store only (remembered before a
        # restart, or by a peer): the longest match wins wherever it is kept.
        if hit:
            stored = self.store.sessions_for_prefixes(keys[:hit])
            for n, key in enumerate(keys[:hit]):
                if key in stored:
                    self._cache(key, stored[key])
                    found = (n, stored[key])
                    break
        if found is None:
            return None
        n, sid = found
        if n > 0 or self._newest(sid) == keys[n]:
            # The session's newest turn; or an older one that the request goes on past (assistant
            # messages follow it, not remembered as they are: a client such as OpenClaw shortens old
            # tool results in what it re-sends), which is that later conversation: it continues.
            return sid
        # Only the client's new message follows a prefix the session went on past: the last message
        # was regenerated or edited. A branch, which must not answer a later turn.
        return None

    def _newest(self, session_id: str) -> str | None:
        """The prefix of ``session_id``'s newest main turn (from the store after a restart)."""
        with self._lock:
            key = self._latest.get(session_id)
        if key is None:
            key = self.store.latest_prefix(session_id)
            if key is not None:
                self._remember_latest(session_id, key)
        return key

    def assign(
        self,
        messages: list[ChatMessage],
        session_id: str | None,
        turn_type: TurnType | None,
        done: bool,
        user: str = DEFAULT_USER,
        clean: Callable[[str], str] | None = None,
    ) -> Assignment:
        """Decide the session, turn index and next state for ``user``'s request (``clean``: see
        :func:`next_state_of`)."""
        ttype: TurnType = turn_type or "main"
        stitched = False
        if session_id is None:
            found = self._find_prefix(messages, user) if ttype == "main" else None
            stitched = found is not None
            session_id = found or scoped_session_id(user, f"auto-{uuid.uuid4().hex[:16]}")
            fresh = found is None
        else:
            fresh = False
        state = None if fresh or ttype != "main" else next_state_of(messages, clean)
        return Assignment(
            session_id=session_id,
            turn_index=self._allocate(session_id),
            turn_type=ttype,
            next_state=state,
            done=done,
            stitched=stitched,
            user=user,
        )

    @staticmethod
    def prefix_key(
        messages: list[ChatMessage],
        reply_text: str | None,
        reply_tool_calls: list[dict[str, Any]] | None,
        user: str = DEFAULT_USER,
    ) -> str:
        """The digest of ``messages`` + the reply: what a continuation of ``user``'s conversation
        starts with."""
        items = [canonical(m.role, m.text, m.tool_calls) for m in messages]
        items.append(canonical("assistant", reply_text or "", reply_tool_calls))
        return digest(items, user)

    def remember_key(self, key: str, session_id: str) -> None:
        """After a main turn: a request extending its conversation (``key``, from :meth:`prefix_key`)
        continues ``session_id``. The caller stores the key with the turn
        (``Store.record_turn(..., prefix_digest=key)``, one commit for both); this keeps it at hand."""
        self._cache(key, session_id)
        self._remember_latest(session_id, key)
        with self._lock:
            self._since_prune += 1
            prune = self._since_prune >= PRUNE_EVERY
            if prune:
                self._since_prune = 0
        if prune:
            self.store.prune_prefixes(self.max_prefixes)

    def _remember_latest(self, session_id: str, key: str) -> None:
        self._put(self._latest, session_id, key)

    def _cache(self, key: str, session_id: str) -> None:
        self._put(self._prefixes, key, session_id)

    def _put(self, lru: OrderedDict[str, str], key: str, value: str) -> None:
        """Set ``key`` in one of the two LRU maps, newest last, at most ``max_prefixes`` kept."""
        with self._lock:
            lru[key] = value
            lru.move_to_end(key)
            while len(lru) > self.max_prefixes:
                lru.popitem(last=False)
