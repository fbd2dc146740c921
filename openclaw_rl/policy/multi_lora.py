"""Many users' LoRA adapters beside one base model, each batch row decoded with its own.

``[users] mode = "per_user"`` serves every user from one copy of the base weights. Each adapted
linear layer (``[training] lora_target_modules``) becomes a :class:`SlotLinear`: the base matmul for
the whole batch, plus a per-row low-rank term gathered from a table of resident adapters::

    y_b = W x_b + s[i_b] * B[i_b] (A[i_b] x_b)        i_b = the adapter slot of row b (0 = none)

``A`` is ``[slots + 1, r, in]`` and ``B`` ``[slots + 1, out, r]``, so a step over rows of eight
different users costs one base matmul and two small batched matmuls per layer — the gather-then-BMM
shape of S-LoRA / Punica, in plain torch. Slot 0 is all zeros: a user without an adapter gets the
base model exactly. Adapters of a smaller rank than the table are zero-padded (the padding adds
nothing to the product).

Adapters are the PEFT directories the trainer exports (``adapter_config.json`` +
``adapter_model.safetensors``); :func:`read_adapter` checks every tensor against the table before
anything is copied, so a bad adapter is refused with the reason and the resident ones keep serving.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from openclaw_rl.policy.weights import WeightLoadError

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Adapter:
    """One adapter's tensors, keyed by the adapted module's name: ``A`` ``[r, in]``, ``B`` ``[out, r]``."""

    path: Path
    rank: int
    scale: float  # lora_alpha / r (or / sqrt(r) with rsLoRA)
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(
            a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values()
        )


def read_adapter(path: str | Path) -> Adapter:
    """Read a PEFT LoRA directory; :class:`WeightLoadError` saying why it cannot be one."""
    from safetensors.torch import load_file

    p = Path(path)
    conf_file = p / "adapter_config.json"
    if not conf_file.is_file():
        raise WeightLoadError(f"path: {p} is not a LoRA adapter directory (no adapter_config.json)")
    try:
        conf = json.loads(conf_file.read_text(encoding="utf-8"))
        rank, alpha = int(conf["r"]), float(conf["lora_alpha"])
    except (OSError, ValueError, KeyError, TypeError) as exc:  # OSError: removed while being read
        raise WeightLoadError(f"path: {conf_file} is not a readable LoRA config: {exc}") from None
    unsupported = [
        k for k in ("rank_pattern", "alpha_pattern", "use_dora", "modules_to_save") if conf.get(k)
    ] + (["bias"] if conf.get("bias", "none") != "none" else [])
    if unsupported:
        raise WeightLoadError(f"path: {p}: per-user serving supports plain LoRA only, not {unsupported}")
    files = sorted(p.glob("adapter_model*.safetensors"))
    if len(files) != 1:
        raise WeightLoadError(f"path: {p} needs exactly one adapter_model*.safetensors, found {len(files)}")
    try:
        tensors = load_file(str(files[0]))
    except Exception as exc:  # a torn or removed file: safetensors raises its own (Rust) error types
        raise WeightLoadError(f"path: {files[0]} cannot be read as safetensors: {exc}") from None
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        stem = key.removesuffix(".lora_A.weight")
        b = tensors.get(stem + ".lora_B.weight")
        if b is None or a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise WeightLoadError(f"path: {p}: {stem} has no matching rank-{rank} lora_A / lora_B pair")
        weights[stem.removeprefix(PEFT_PREFIX)] = (a, b)
    if not weights:
        raise WeightLoadError(f"path: {p} holds no LoRA tensors")
    scale = alpha / (rank**0.5 if conf.get("use_rslora") else rank)
    return Adapter(path=p, rank=rank, scale=scale, weights=weights)


class SlotLinear(nn.Module):
    """A base linear layer plus the low-rank term of each row's adapter slot (see the module doc)."""

    lora_A: torch.Tensor  # [slots + 1, r, in], a buffer
    lora_B: torch.Tensor  # [slots + 1, out, r], a buffer

    def __init__(self, base: nn.Linear, table: AdapterTable, slots: int, rank: int):
        super().__init__()
        self.base = base
        self.table = [table]  # a list, so the table is not registered as a sub-module
        w = base.weight
        self.register_buffer("lora_A", w.new_zeros((slots + 1, rank, base.in_features)), persistent=False)
        self.register_buffer("lora_B", w.new_zeros((slots + 1, base.out_features, rank)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        table = self.table[0]
        rows = table.rows_B
        if rows is None or table.all_base:
            return y
        if x.dim() != 3 or x.shape[0] != rows.shape[0]:
            raise RuntimeError(
                f"adapter slots set for {rows.shape[0]} rows, the layer got input of shape {tuple(x.shape)}"
            )
        a_B_r_in = self.lora_A[rows]
        b_B_out_r = self.lora_B[rows]
        h_B_T_r = torch.bmm(x, a_B_r_in.transpose(1, 2))
        delta_B_T_out = torch.bmm(h_B_T_r, b_B_out_r.transpose(1, 2))
        return y + delta_B_T_out * table.scale_S[rows].view(-1, 1, 1).to(y.dtype)


class AdapterTable:
    """The resident adapters of one model: ``slots`` rows of every adapted layer's A / B tables.

    Not thread-safe: the engine thread owns it (loads happen at step boundaries, between forwards).
    """

    def __init__(self, model: nn.Module, target_modules: list[str], rank: int, slots: int):
        self.rank = rank
        self.slots = slots
        self.layers: dict[str, SlotLinear] = {}
        targets = set(target_modules)
        found = [
            (name, mod)
            for name, mod in model.named_modules()
            if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets
        ]
        if not found:
            raise ValueError(f"no linear layer of the model is named one of {sorted(targets)}")
        for name, mod in found:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            layer = SlotLinear(mod, self, slots, rank)
            setattr(parent, attr, layer)
            self.layers[name] = layer
        device = next(iter(self.layers.values())).lora_A.device
        self.scale_S = torch.zeros(slots + 1, device=device)
        self.rows_B: torch.Tensor | None = None
        self.all_base = True

    @property
    def bytes_per_slot(self) -> int:
        """Memory one resident adapter takes (its A and B rows in every adapted layer)."""
        return sum(
            (layer.lora_A[0].numel() + layer.lora_B[0].numel()) * layer.lora_A.element_size()
            for layer in self.layers.values()
        )

    def check(self, adapter: Adapter) -> None:
        """Refuse an adapter that does not fit this table (names, rank, shapes), before any copy."""
        if adapter.rank > self.rank:
            raise WeightLoadError(
                f"path: {adapter.path}: rank {adapter.rank} is above the serving table's rank {self.rank} "
                "([training] lora_rank)"
            )
        unknown = sorted(set(adapter.weights) - set(self.layers))
        if unknown:
            raise WeightLoadError(
                f"path: {adapter.path} adapts {unknown[:3]}, which are not among the served adapted "
                "layers ([training] lora_target_modules)"
            )
        for name, (a, b) in adapter.weights.items():
            layer = self.layers[name]
            if a.shape[1] != layer.base.in_features or b.shape[0] != layer.base.out_features:
                raise WeightLoadError(
                    f"path: {adapter.path}: {name} has shapes that do not fit the base model"
                )

    def load(self, slot: int, adapter: Adapter) -> None:
        """Copy ``adapter`` into ``slot`` (1..slots); layers it does not adapt get zeros."""
        if not 1 <= slot <= self.slots:
            raise ValueError(f"slot {slot} is outside 1..{self.slots}")
        self.check(adapter)
        with torch.no_grad():
            for name, layer in self.layers.items():
                layer.lora_A[slot].zero_()
                layer.lora_B[slot].zero_()
                if name in adapter.weights:
                    a, b = adapter.weights[name]
                    layer.lora_A[slot, : adapter.rank].copy_(a.to(layer.lora_A.dtype))
                    layer.lora_B[slot, :, : adapter.rank].copy_(b.to(layer.lora_B.dtype))
            self.scale_S[slot] = adapter.scale

    def use(self, slot_per_row: list[int]) -> None:
        """Set the slot of each row of the next forward pass (0 = the base alone)."""
        self.all_base = not any(slot_per_row)
        self.rows_B = torch.tensor(slot_per_row, dtype=torch.long, device=self.scale_S.device)


def table_info(table: AdapterTable | None) -> dict[str, Any]:
    """``/healthz`` figures of the adapter table (none when there is no table)."""
    if table is None:
        return {}
    return {"adapter_slots": table.slots, "adapter_bytes_per_slot": table.bytes_per_slot}


class ResidentAdapters:
    """Which users' adapters are in the table (least recently used out first) and where each
    user's newest adapter is on disk. Owned by the engine thread, like the table."""

    def __init__(self, table: AdapterTable):
        self.table = table
        self.sources: dict[str, tuple[Path, int]] = {}  # user -> (newest adapter dir, its version)
        self.slot_of: collections.OrderedDict[str, int] = collections.OrderedDict()  # LRU order
        self.loads = 0
        self.evictions = 0

    def version(self, user: str | None) -> int:
        """The version a new row of ``user`` is served with (0: no adapter yet, the base)."""
        if user is None or user not in self.sources:
            return 0
        # a resident slot always holds the newest version: publish() copies it in at once
        return self.sources[user][1]

    def publish(self, user: str, adapter: Adapter, version: int) -> None:
        """A new version of ``user``'s adapter: into their slot now if resident, else on their next request."""
        self.sources[user] = (adapter.path, version)
        slot = self.slot_of.get(user)
        if slot is not None:
            self.table.load(slot, adapter)

    def removed(self, user: str | None) -> bool:
        """Whether ``user``'s adapter was published here but its folder is gone (``users delete``)."""
        return user is not None and user in self.sources and not self.sources[user][0].is_dir()

    def acquire(self, user: str | None, busy: set[int]) -> tuple[int, int] | None:
        """(slot, version) for a new row of ``user``: slot 0 when they have no adapter; None when
        every slot holds an adapter an active row is using (the row waits for one to finish).
        Loading from disk may raise :class:`WeightLoadError`. The caller forgets a :meth:`removed`
        user first (and drops what it cached of them)."""
        if user is None or user not in self.sources:
            return 0, 0
        if user in self.slot_of:
            self.slot_of.move_to_end(user)
            return self.slot_of[user], self.sources[user][1]
        taken = set(self.slot_of.values())
        free = [s for s in range(1, self.table.slots + 1) if s not in taken]
        if free:
            slot = free[0]
        else:
            victim = next((u for u, s in self.slot_of.items() if s not in busy), None)
            if victim is None:
                return None
            slot = self.slot_of.pop(victim)
            self.evictions += 1
        path, version = self.sources[user]
        adapter = read_adapter(path)
        self.table.check(adapter)  # a file changed on disk since it was published: refused, not copied
        self.table.load(slot, adapter)
        self.slot_of[user] = slot
        self.loads += 1
        return slot, version

    def forget(self, user: str) -> None:
        """Drop ``user``'s adapter: its source, and its slot (zeroed, free for the next user)."""
        self.sources.pop(user, None)
        slot = self.slot_of.pop(user, None)
        if slot is not None:
            with torch.no_grad():
                for layer in self.table.layers.values():
                    layer.lora_A[slot].zero_()
                    layer.lora_B[slot].zero_()
                self.table.scale_S[slot] = 0.0

    def stats(self) -> dict[str, Any]:
        return {
            **table_info(self.table),
            "adapters_known": len(self.sources),
            "adapters_resident": len(self.slot_of),
            "adapter_loads": self.loads,
            "adapter_evictions": self.evictions,
        }
