"""Loading exported policy weights for a swap: a LoRA adapter merged into the base, or a full model.

Used by every engine that holds the model in-process (the embedded engine and its Ray replicas).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError


class WeightLoadError(ValueError):
    """A weight directory that cannot be applied to the serving model; says why."""


def load_policy_state(path: str | Path, base_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The full state dict described by ``path``: a peft LoRA adapter directory (merged into a fresh
    copy of the base model) or a full Hugging Face model directory. Whatever stops it from being
    read (a config that is not JSON, a name too long, a file cut short) is a :class:`WeightLoadError`
    naming the path: the caller's error, not the service's."""
    try:
        return _load_policy_state(Path(path), base_dir, dtype)
    except WeightLoadError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, SafetensorError) as exc:
        # a config that is JSON but no object, a weights file cut short: the folder is at fault
        raise WeightLoadError(
            f"path: {str(path)[:200]} cannot be read: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc


def _load_policy_state(p: Path, base_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    if not p.is_dir():
        raise WeightLoadError(f"path: {p} is not a directory (expected the output of export_policy)")
    if (p / "adapter_config.json").is_file():
        merged_fast = merge_lora_from_disk(p, base_dir, dtype)
        if merged_fast is not None:
            return merged_fast
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
        try:
            merged = PeftModel.from_pretrained(base, p).merge_and_unload()
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise WeightLoadError(
                f"path: {p} holds a LoRA adapter that does not fit the base model {base_dir}: {exc}"
            ) from exc
        return merged.state_dict()
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin")):
        try:
            return AutoModelForCausalLM.from_pretrained(p, dtype=dtype).state_dict()
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise WeightLoadError(f"path: {p} is not a loadable model directory: {exc}") from exc
    raise WeightLoadError(
        f"path: {p} has neither adapter_config.json (LoRA adapter) nor config.json + "
        "*.safetensors (full model)"
    )


LORA_SUFFIX_A = ".lora_A.weight"


def merge_lora_from_disk(adapter: Path, base_dir: Path, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """Merged weights of just the LoRA-adapted matrices: ``W = W_base + (alpha / r) * B @ A``.

    Why: a swap happens every few training steps while requests are being decoded in the same
    process. Re-loading the whole base model and merging through peft costs seconds of CPU and
    stalls decoding; reading only the adapted matrices from the base safetensors (memory-mapped)
    and adding a rank-r product costs a fraction of that. Returns None for adapters this fast path
    does not cover (rank patterns, DoRA, bias or modules_to_save), which then take the peft path.
    The partial state dict is complete for a swap because every adapter of a run adapts the same
    matrices and leaves all others at their base values.
    """
    from safetensors import safe_open
    from safetensors.torch import load_file

    conf = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    if (
        conf.get("rank_pattern")
        or conf.get("alpha_pattern")
        or conf.get("use_dora")
        or conf.get("modules_to_save")
        or conf.get("bias", "none") != "none"
    ):
        return None
    files = sorted(adapter.glob("adapter_model*.safetensors"))
    shards = sorted(base_dir.glob("*.safetensors"))
    if len(files) != 1 or not shards:
        return None
    r = int(conf["r"])
    scale = float(conf["lora_alpha"]) / (r**0.5 if conf.get("use_rslora") else r)
    lora = load_file(str(files[0]))
    where: dict[str, Path] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as fh:
            where.update({k: shard for k in fh.keys()})
    merged: dict[str, torch.Tensor] = {}
    for key_a, a in lora.items():
        if not key_a.endswith(LORA_SUFFIX_A):
            continue
        prefix = key_a[: -len(LORA_SUFFIX_A)]
        b = lora.get(prefix + ".lora_B.weight")
        name = prefix.removeprefix("base_model.model.") + ".weight"
        if b is None or name not in where:
            return None
        with safe_open(str(where[name]), framework="pt") as fh:
            w = fh.get_tensor(name).float()
        merged[name] = (w + scale * (b.float() @ a.float())).to(dtype)
    return merged or None


def check_compatible(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Refuse a state dict whose keys or shapes differ from the serving model's (before the swap).
    A LoRA merge carries only the adapted matrices: its keys must be a subset of the model's."""
    own = model.state_dict()
    partial = len(state) < len(own) and all(k.endswith(".weight") for k in state)
    missing = [] if partial else sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or extra or shapes:
        raise WeightLoadError(
            f"weights do not match the serving model: missing {missing[:3]}, "
            f"unexpected {extra[:3]}, wrong shape {shapes[:3]}"
        )
