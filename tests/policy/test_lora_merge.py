"""The fast LoRA swap path merges exactly what peft's merge_and_unload would."""

from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from openclaw_rl.policy.weights import check_compatible, load_policy_state, merge_lora_from_disk


def test_fast_merge_matches_peft(tiny_model_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a trained adapter: B is no longer zero
    peft_model.save_pretrained(tmp_path / "adapter")

    fast = merge_lora_from_disk(tmp_path / "adapter", tiny_model_dir, torch.float32)
    reference = (
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "adapter")
        .merge_and_unload()
        .state_dict()
    )
    assert fast is not None and len(fast) == 2 * 3  # 2 layers x 3 target modules
    for key, value in fast.items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6)

    serving = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    state = load_policy_state(tmp_path / "adapter", tiny_model_dir, torch.float32)
    check_compatible(serving, state)
    serving.load_state_dict(state, strict=False)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged.load_state_dict(reference)
    torch.testing.assert_close(serving(ids).logits, merged(ids).logits, rtol=1e-4, atol=1e-5)
