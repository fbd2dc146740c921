"""Chunked log-probs equal a plain full-vocabulary log_softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch

from openclaw_rl.runtime.logprobs import batch_token_stats, full_logsoftmax_logprobs, sequence_logprobs
from tests.helpers import tiny_model

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 11]]
RESPONSES = [[20, 21, 22], [30, 31, 32, 33, 34, 35, 36], [40]]


@pytest.fixture(scope="module")
def model():
    m, _ = tiny_model(seed=3)
    return m


@pytest.mark.parametrize("chunk", [1, 3, 256])
def test_chunked_equals_full_logsoftmax(model, chunk):
    with torch.no_grad():
        ours = batch_token_stats(model, PROMPTS, RESPONSES, chunk_size=chunk, with_entropy=True, pad_id=0)
        ref = full_logsoftmax_logprobs(model, PROMPTS, RESPONSES, with_entropy=True, pad_id=0)
    assert torch.equal(ours.mask, ref.mask)
    assert ours.mask.sum().item() == sum(len(r) for r in RESPONSES)
    torch.testing.assert_close(ours.logprobs, ref.logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, ref.entropy, atol=1e-4, rtol=1e-5)


def test_single_sequence_matches_batch_and_topk(model):
    lp, ids, top_lp = sequence_logprobs(model, PROMPTS[1], RESPONSES[1], topk=5, chunk_size=2)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPTS[1] + RESPONSES[1]])).logits[0].float()
    full = torch.log_softmax(logits, -1)[len(PROMPTS[1]) - 1 : -1]  # positions predicting the response
    expect = full.gather(-1, torch.tensor(RESPONSES[1]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(lp, expect, atol=1e-5, rtol=1e-5)
    vals, idx = full.topk(5, dim=-1)
    assert torch.equal(ids, idx)
    torch.testing.assert_close(top_lp, vals, atol=1e-5, rtol=1e-5)
    assert lp.shape == (len(RESPONSES[1]),) and lp.requires_grad is False


def test_gathered_ids_match_full(model):
    gather = [torch.tensor([[1, 2]] * len(r)) for r in RESPONSES]
    with torch.no_grad():
        ours = batch_token_stats(model, PROMPTS, RESPONSES, chunk_size=2, gather_ids=gather)
        logits = model(input_ids=torch.tensor([PROMPTS[0] + RESPONSES[0]])).logits[0].float()
    full = torch.log_softmax(logits, -1)[len(PROMPTS[0]) - 1 : -1]
    torch.testing.assert_close(ours.gathered[0, :3], full[:, 1:3], atol=1e-5, rtol=1e-5)


def test_stop_logprob_is_the_summed_probability_of_every_stop_token(model):
    """With two stop ids, the log-probability of stopping at a position is log(p_a + p_b) of the
    full softmax there, at every chunking, with a gradient when asked."""
    with torch.no_grad():
        ours = batch_token_stats(model, PROMPTS, RESPONSES, chunk_size=2, stop_ids=[2, 5, 2])
        logits = model(input_ids=torch.tensor([PROMPTS[1] + RESPONSES[1]])).logits[0].float()
    probs = torch.softmax(logits, -1)[len(PROMPTS[1]) - 1 : -1]
    expect = torch.log(probs[:, 2] + probs[:, 5])
    assert ours.stop_logprobs is not None
    torch.testing.assert_close(ours.stop_logprobs[1, : len(RESPONSES[1])], expect, atol=1e-5, rtol=1e-5)
    assert float(ours.stop_logprobs[2, 1:].abs().sum()) == 0.0  # padding stays zero
    with_grad = batch_token_stats(model, PROMPTS[:1], RESPONSES[:1], chunk_size=2, stop_ids=[2])
    assert with_grad.stop_logprobs is not None and with_grad.stop_logprobs.requires_grad
    assert batch_token_stats(model, PROMPTS[:1], RESPONSES[:1]).stop_logprobs is None


def test_gradients_match_full(model):
    def grads(fn):
        model.zero_grad()
        stats = fn()
        (stats.logprobs.sum() + stats.entropy.sum()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ours = grads(lambda: batch_token_stats(model, PROMPTS, RESPONSES, chunk_size=2, with_entropy=True))
    ref = grads(lambda: full_logsoftmax_logprobs(model, PROMPTS, RESPONSES, with_entropy=True))
    assert len(ours) == len(ref) > 0
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    model.zero_grad()


def test_bad_inputs_are_named(model):
    with pytest.raises(ValueError, match="prompt is empty"):
        sequence_logprobs(model, [], [1, 2])
    with pytest.raises(ValueError, match="response is empty"):
        batch_token_stats(model, [[1]], [[]])
    with pytest.raises(ValueError, match="chunk_size"):
        batch_token_stats(model, [[1]], [[2]], chunk_size=0)


def test_the_documented_trainer_import_path_still_works():
    from openclaw_rl.runtime import logprobs
    from openclaw_rl.trainer.logprobs import sequence_logprobs as documented

    assert documented is logprobs.sequence_logprobs
