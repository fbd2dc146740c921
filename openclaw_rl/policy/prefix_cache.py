"""The embedded engine's prefix cache: key/value tensors of earlier token sequences, reused by later prompts.

Agent clients resend the whole conversation every turn: the next prompt is the previous prompt, the
previous response and a few new tokens, and many sessions open with the same long system prompt. A
prompt that starts with tokens whose keys/values were already computed under the same weights need only
prefill the rest. :class:`PrefixCache` keeps those keys/values, bounded in bytes, evicting the least
recently used first.

Design: **hash-chained fixed-size blocks**, as vLLM's automatic prefix caching does, not whole sequences.

* A sequence is cut into blocks of :data:`BLOCK_TOKENS` tokens; only full blocks are stored. A block is
  found by ``(epoch, parent block id, its own tokens)``: the key names the whole prefix it ends, so two
  sequences share a block exactly when they share every token up to its end. Keys are compared as
  tuples of token ids (a dict, not a hash alone), so a hash collision can never serve wrong keys/values.
* Lookup walks the chain from the first block and stops at the first one missing: the longest cached
  prefix, rounded down to a block. Losing up to ``BLOCK_TOKENS - 1`` tokens per reuse is cheap (they are
  prefilled with the new tokens) and buys what whole sequences cannot give as simply: **sharing** — a
  system prompt common to many sessions, and each turn of one session, are stored once (a session's turn
  *n+1* adds only the blocks past turn *n*), so the byte bound holds many more sessions than copies of
  whole conversations would; and **exact LRU by bytes** at block granularity with no splitting of tensors.
* Every block holds one tensor ``[2 * layers, kv_heads, BLOCK_TOKENS, head_dim]`` (keys and values of
  each layer) that owns its memory: nothing the engine does in place to its batch cache reaches it.
* LRU order keeps a parent more recent than every child (a chain is touched from its last block back to
  its first), so eviction always takes leaves first and never strands a block behind a missing parent.
  Inserting never evicts the chain being inserted, and stops adding blocks once that chain alone would
  exceed the bound: the bytes held never exceed ``max_bytes``.
* ``epoch`` is the scope the keys/values were computed in: the engine's weights epoch (it changes on
  every weight swap), and in per-user mode the user and their adapter's version too. It is part of
  every key and the engine also calls :meth:`PrefixCache.clear` on a swap, so keys/values computed
  under one policy are never used under another, and one user's blocks are never another's hit.

The engine thread alone inserts and looks up; a lock still guards every operation so that
:meth:`PrefixCache.stats` (``/healthz``) can be read from any thread.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

#: Tokens per block. Smaller: finer reuse, more (smaller) tensors to walk and copy; 32 loses at most 31
#: tokens per reuse, which prefill with the new ones for a fraction of the cost of the whole prompt.
BLOCK_TOKENS = 32


class Block:
    """One cached block: the keys/values of ``block_tokens`` tokens following its parent's prefix."""

    __slots__ = ("id", "key", "kv", "nbytes")

    def __init__(self, id_: int, key: tuple[Any, ...], kv: torch.Tensor):
        self.id = id_
        self.key = key
        self.kv = kv
        self.nbytes = kv.numel() * kv.element_size()


class PrefixCache:
    """Key/value blocks of token prefixes, bounded by ``max_bytes``, least recently used evicted first.

    ``kv`` tensors are laid out ``[..., tokens, head_dim]`` (tokens on dim -2); the engine stores
    ``[2 * layers, kv_heads, tokens, head_dim]``.
    """

    def __init__(self, max_bytes: int, block_tokens: int = BLOCK_TOKENS):
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.max_bytes = int(max_bytes)
        self.block_tokens = block_tokens
        self._blocks: collections.OrderedDict[tuple[Any, ...], Block] = collections.OrderedDict()  # LRU first
        self._ids = itertools.count(1)  # 0 is the root: the parent of every first block
        self._lock = threading.Lock()
        self.bytes = 0
        self.peak_bytes = 0
        self.hits = 0  # lookups that found at least one block
        self.misses = 0  # lookups that found none
        self.hit_tokens = 0  # tokens served from the cache
        self.evictions = 0  # blocks evicted for room
        self.inserted = 0  # blocks stored

    # ------------------------------------------------------------------ lookup
    def match(self, tokens: Sequence[int], epoch: Hashable, limit: int | None = None) -> list[Block]:
        """The blocks of the longest cached prefix of ``tokens[:limit]`` (default: all but the last token,
        which must be prefilled for its logits), first block first; marks them recently used."""
        limit = len(tokens) - 1 if limit is None else min(limit, len(tokens))
        with self._lock:
            chain = self._chain(tokens, epoch, max(0, limit) // self.block_tokens)
            self._touch(chain)
            if chain:
                self.hits += 1
                self.hit_tokens += len(chain) * self.block_tokens
            else:
                self.misses += 1
        return chain

    def cached_tokens(self, tokens: Sequence[int], epoch: Hashable) -> int:
        """How many leading tokens of ``tokens`` are cached (no LRU update, no statistics)."""
        with self._lock:
            return len(self._chain(tokens, epoch, len(tokens) // self.block_tokens)) * self.block_tokens

    # ------------------------------------------------------------------ insertion
    def insert(
        self, tokens: Sequence[int], epoch: Hashable, kv_of: Callable[[int, int], torch.Tensor]
    ) -> int:
        """Store the full blocks of ``tokens`` not cached yet; return how many were added.

        ``kv_of(start, end)`` returns the keys/values of ``tokens[start:end]`` (tokens on dim -2); it is
        called only for blocks missing from the cache. A returned view of a larger tensor is copied, so a
        block never keeps a batch's cache alive or shares memory with it.
        """
        bt = self.block_tokens
        n = len(tokens) // bt
        added = 0
        with self._lock:
            chain = self._chain(tokens, epoch, n)
            self._touch(chain)
            keep = {b.key for b in chain}
            chain_bytes = sum(b.nbytes for b in chain)
            while len(chain) < n:
                j = len(chain)
                kv = kv_of(j * bt, (j + 1) * bt)
                if kv.shape[-2] != bt:
                    raise ValueError(f"kv_of returned {kv.shape[-2]} tokens for a block of {bt}")
                if kv.untyped_storage().nbytes() > kv.numel() * kv.element_size():
                    kv = kv.clone()  # a view into something larger: own the memory
                key = (epoch, chain[-1].id if chain else 0, tuple(tokens[j * bt : (j + 1) * bt]))
                block = Block(next(self._ids), key, kv)
                if chain_bytes + block.nbytes > self.max_bytes or not self._evict(block.nbytes, keep):
                    break  # this chain alone would not fit: keep the prefix that does
                self._blocks[key] = block
                keep.add(key)
                chain.append(block)
                chain_bytes += block.nbytes
                self.bytes += block.nbytes
                self.peak_bytes = max(self.peak_bytes, self.bytes)
                self.inserted += 1
                added += 1
            self._touch(chain)
        return added

    def drop(self, scope_matches: Callable[[Hashable], bool]) -> int:
        """Drop every block whose scope (``epoch``) ``scope_matches``; return how many. A scope's
        blocks chain only to each other, so no other chain loses a parent."""
        with self._lock:
            gone = [key for key in self._blocks if scope_matches(key[0])]
            for key in gone:
                self.bytes -= self._blocks.pop(key).nbytes
            return len(gone)

    def clear(self) -> None:
        """Drop every block (the weights changed)."""
        with self._lock:
            self._blocks.clear()
            self.bytes = 0

    # ------------------------------------------------------------------ status
    def __len__(self) -> int:
        return len(self._blocks)

    def lru_keys(self) -> list[tuple[Any, ...]]:
        """Block keys, least recently used first (what eviction takes next)."""
        with self._lock:
            return list(self._blocks)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "prefix_cache_bytes": self.bytes,
                "prefix_cache_max_bytes": self.max_bytes,
                "prefix_cache_peak_bytes": self.peak_bytes,
                "prefix_cache_entries": len(self._blocks),
                "prefix_cache_block_tokens": self.block_tokens,
                "prefix_cache_hits": self.hits,
                "prefix_cache_misses": self.misses,
                "prefix_cache_hit_tokens": self.hit_tokens,
                "prefix_cache_evictions": self.evictions,
            }

    # ------------------------------------------------------------------ internals (lock held)
    def _chain(self, tokens: Sequence[int], epoch: Hashable, n_blocks: int) -> list[Block]:
        bt = self.block_tokens
        chain: list[Block] = []
        parent = 0
        for j in range(n_blocks):
            block = self._blocks.get((epoch, parent, tuple(tokens[j * bt : (j + 1) * bt])))
            if block is None:
                break
            chain.append(block)
            parent = block.id
        return chain

    def _touch(self, chain: list[Block]) -> None:
        # last block first, so that every parent ends up more recent than its children
        for block in reversed(chain):
            self._blocks.move_to_end(block.key)

    def _evict(self, room: int, keep: set[tuple[Any, ...]]) -> bool:
        """Evict least recently used blocks until ``room`` more bytes fit; never a block in ``keep``."""
        while self.bytes + room > self.max_bytes:
            if not self._blocks:
                return False
            key, block = next(iter(self._blocks.items()))
            if key in keep:
                return False
            del self._blocks[key]
            self.bytes -= block.nbytes
            self.evictions += 1
        return True
