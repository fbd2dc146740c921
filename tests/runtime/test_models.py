"""The stop tokens a model's responses end with, read without loading its weights."""

from __future__ import annotations

import shutil
from pathlib import Path

from openclaw_rl.runtime.models import load_generation_config, load_tokenizer, stop_token_ids


def test_stop_tokens_are_the_tokenizers_end_and_the_generation_configs_own(
    tiny_model_dir: Path, tmp_path: Path
):
    """A chat model that ends its turn with its own token (here id 7, named in its generation
    config) stops there as well as at the tokenizer's end-of-sequence token; a model directory with
    no generation config stops at the end-of-sequence token alone."""
    from transformers import GenerationConfig

    with_own = tmp_path / "own"
    shutil.copytree(tiny_model_dir, with_own)
    GenerationConfig(eos_token_id=[7, 2]).save_pretrained(with_own)
    tok = load_tokenizer(str(with_own))
    assert stop_token_ids(tok, load_generation_config(str(with_own))) == {tok.eos_token_id, 7}

    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    (bare / "generation_config.json").unlink(missing_ok=True)
    assert load_generation_config(str(bare)) is None
    assert stop_token_ids(load_tokenizer(str(bare))) == {tok.eos_token_id}
