"""The embedded engine's key/value cache: appending a token writes into spare room, never copies.

transformers' ``DynamicLayer`` appends with ``torch.cat``: every decode step allocates a new tensor
per layer and copies the whole cache into it: for one session at 7k tokens of context on
SmolLM2-135M (30 layers, 3 key/value heads of 64), ~320 MB read and written per generated token.
Measured (bench/decode.py) that copy is a few percent of a step at 4k and about a fifth at 7k; a
one-token step is mostly the weights being read (docs/serving.md).

:class:`GrowingLayer` keeps each layer's keys and values at the front of a buffer with spare columns
(``[batch, heads, capacity, dim]``) and exposes the filled part as a view, so a decode step writes
one column. When the room runs out the buffer is reallocated with a quarter more (at least
:data:`MIN_SPARE` tokens), so the copying left is amortised O(1) per token. Everything else the
engine does with a cache (select the unfinished rows, drop a shared padding column range, merge
two batches, compact after a prefix-cache prefill) keeps working through ``keys`` / ``values``:
assigning a tensor adopts it as a buffer without spare room, and the next append makes room.

A buffer is only ever written in place when this layer allocated it, so a tensor handed in (from
the prefix cache, from another batch) is never modified.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DummyLayer,
    DynamicLayer,
    LinearAttentionCacheLayerMixin,
)

#: Spare columns a reallocated buffer gets at least (a reply's worth, so decode rarely reallocates).
MIN_SPARE = 256


def _append(buf: torch.Tensor | None, n: int, owned: bool, new: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Write ``new`` (``[B, H, m, D]``) after the first ``n`` columns of ``buf``; returns the buffer
    (reallocated when it has no room, is not ours, or its batch/head shape differs) and ``n + m``."""
    m = new.shape[-2]
    need = n + m
    fits = (
        owned
        and buf is not None
        and buf.shape[-2] >= need
        and buf.shape[:2] == new.shape[:2]
        and buf.shape[-1] == new.shape[-1]
        and buf.dtype == new.dtype
    )
    if not fits:
        cap = need + max(MIN_SPARE, need // 4)
        fresh = new.new_empty((new.shape[0], new.shape[1], cap, new.shape[3]))
        if n:
            assert buf is not None
            fresh[:, :, :n] = buf[:, :, :n]
        buf = fresh
    assert buf is not None
    buf[:, :, n:need] = new
    return buf, need


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` / ``values`` are views of buffers with spare columns."""

    def __init__(self, **kwargs: object) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._kn = self._vn = 0
        self._owned = False  # the buffers were allocated here, so writing past the filled part is safe
        super().__init__(**kwargs)

    # ``keys`` / ``values`` as transformers and the engine read and assign them
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self._kn]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k, self._kn, self._owned = value, 0 if value is None else value.shape[-2], False

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self._vn]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v, self._vn, self._owned = value, 0 if value is None else value.shape[-2], False

    @property
    def capacity(self) -> int:
        """Columns the buffers hold, filled or spare (0 before the first append)."""
        return 0 if self._k is None else int(self._k.shape[-2])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._k, self._kn = _append(self._k, self._kn, self._owned, key_states)
        self._v, self._vn = _append(self._v, self._vn, self._owned, value_states)
        self._owned = True
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        return keys, values

    def get_seq_length(self) -> int:
        return self._kn if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``, spare columns included (no reallocation at the next step)."""
        if self._k is None or self._v is None or self._kn == 0:
            return
        owned = self._owned
        kn, vn = self._kn, self._vn
        self._k, self._v = self._k[indices], self._v[indices]  # advanced indexing: fresh tensors
        self._kn, self._vn, self._owned = kn, vn, owned

    def reset(self) -> None:
        self._k = self._v = None
        self._kn = self._vn = 0
        self._owned = False
        self.is_initialized = False


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` made of :class:`GrowingLayer` s, optionally filled with ``kv`` (one
    ``(keys, values)`` pair per layer, ``[batch, heads, tokens, dim]``, adopted without copying)."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        if not kv:
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
            return
        layers: list[CacheLayerMixin | LinearAttentionCacheLayerMixin | DummyLayer] = []
        for keys, values in kv:
            layer = GrowingLayer()
            layer.device = keys.device
            layer.is_initialized = True
            layer.keys, layer.values = keys, values
            layers.append(layer)
        Cache.__init__(self, layers=layers)
