"""Memory-lean per-token log-probs of response tokens under a causal LM.

Why this module exists: the naive way to score a response is ``log_softmax(model(ids).logits)``,
which materialises a float32 ``[batch, seq, vocab]`` tensor (49k vocab x 2k tokens x 4 bytes =
400 MB per sequence for SmolLM2) and, with gradients, keeps it alive for the backward pass. Here we

1. run only the decoder (``model.get_decoder()``) to get final hidden states ``[B, L, H]``;
2. gather the hidden states at the positions that *predict* response tokens, dropping padding, into
   a flat ``[N, H]`` (prompt and padding positions are never projected onto the vocabulary at all);
3. project ``chunk_size`` of those tokens at a time through the LM head, in float32, and reduce each
   chunk immediately to what is needed (log-prob of the target, entropy, top-K, log-probs at given
   ids).

With gradients each chunk runs under ``torch.utils.checkpoint``: its logits are recomputed during
backward instead of being saved, so at most one chunk of ``[chunk_size, vocab]`` logits (plus its
softmax temporaries) is alive at any time, forward or backward, whatever the batch size.

The LM head is applied as ``model.get_output_embeddings()``; LoRA adapters on decoder layers are
honoured because peft replaces those layers in place (so ``disable_adapter()`` also works here).

Public entry points:

* :func:`sequence_logprobs` — one (prompt, response) pair, no gradient (judge / teacher / tests).
* :func:`batch_token_stats` — a right-padded batch, with or without gradient; optional entropy and
  log-probs at caller-given token ids (the teacher's top-K for top-K distillation).
* :func:`full_logsoftmax_logprobs` — the plain reference implementation (tests and benchmark).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


@dataclass
class TokenStats:
    """Per-response-token quantities of a batch, right-padded to the longest response.

    ``mask`` is 1 where a real response token is, 0 on padding. All tensors are float32.
    """

    logprobs: Tensor  # [B, R]
    mask: Tensor  # [B, R]
    entropy: Tensor | None = None  # [B, R]
    gathered: Tensor | None = None  # [B, R, K] log-probs at the caller's ids
    topk_ids: Tensor | None = None  # [B, R, K] (int64)
    topk_logprobs: Tensor | None = None  # [B, R, K]
    stop_logprobs: Tensor | None = None  # [B, R] log-probability of stopping (any stop token) there


def _decoder_and_head(model):
    """The decoder stack and the LM head of a HF causal LM (or a peft wrapper around one)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None:
        raise TypeError(
            f"{type(model).__name__} does not expose get_decoder()/get_output_embeddings(); "
            "a Hugging Face causal LM is required"
        )
    return decoder, head


def _chunk_stats(
    hidden: Tensor,
    targets: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    want_entropy: bool,
    gather_ids: Tensor | None,
    topk: int,
    stop_ids: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Reduce one chunk of hidden states ``[c, H]`` (c response tokens) to per-token statistics.

    Returns (target log-probs, entropy or empty, gathered log-probs or empty, top-K log-probs or empty,
    top-K ids or empty, log-prob of stopping or empty). Empty tensors stand in for "not requested" so
    that the function can run under ``checkpoint`` (which needs tensor outputs).
    """
    logits = F.linear(hidden, weight, bias).float()  # [c, V], float32 for a stable normaliser
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [B, c, 1]
    target_lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse.squeeze(-1)
    empty = logits.new_zeros(0)
    if want_entropy:
        # H = -sum p log p = lse - sum softmax(logits) * logits
        probs = torch.softmax(logits, dim=-1)
        entropy = lse.squeeze(-1) - (probs * logits).sum(-1)
    else:
        entropy = empty
    gathered = (logits.gather(-1, gather_ids) - lse) if gather_ids is not None else empty
    if topk > 0:
        top_vals, top_ids = logits.topk(topk, dim=-1)
        top_lp = top_vals - lse
    else:
        top_lp, top_ids = empty, empty.long()
    # Stopping is one decision whichever stop token ends the response: their probabilities add up.
    stop_lp = (
        torch.logsumexp(logits[:, stop_ids], dim=-1) - lse.squeeze(-1) if stop_ids is not None else empty
    )
    return target_lp, entropy, gathered, top_lp, top_ids, stop_lp


def _pad_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int, device: torch.device
):
    """Right-pad prompt+response; return ids, attention mask, predicting positions, targets, mask."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if not prompts:
        raise ValueError("empty batch")
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        if len(p) == 0:
            raise ValueError(
                f"sequence {i}: prompt is empty, so the first response token has no position predicting it"
            )
        if len(r) == 0:
            raise ValueError(f"sequence {i}: response is empty")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    max_len, max_resp = max(lengths), max(len(r) for r in responses)
    bsz = len(prompts)
    ids = torch.full((bsz, max_len), pad_id, dtype=torch.long)
    attn = torch.zeros((bsz, max_len), dtype=torch.long)
    pos = torch.zeros((bsz, max_resp), dtype=torch.long)
    targets = torch.full((bsz, max_resp), pad_id, dtype=torch.long)
    mask = torch.zeros((bsz, max_resp), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        n_p, n_r = len(p), len(r)
        ids[i, : n_p + n_r] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attn[i, : n_p + n_r] = 1
        # Token at index n_p + j is predicted by the hidden state at index n_p + j - 1.
        pos[i, :n_r] = torch.arange(n_p - 1, n_p + n_r - 1)
        targets[i, :n_r] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :n_r] = 1.0
    return (ids.to(device), attn.to(device), pos.to(device), targets.to(device), mask.to(device))


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def batch_token_stats(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    chunk_size: int = 256,
    with_entropy: bool = False,
    gather_ids: Sequence[Tensor | None] | None = None,
    topk: int = 0,
    pad_id: int = 0,
    stop_ids: Collection[int] | None = None,
) -> TokenStats:
    """Per-response-token log-probs (and optional extras) of a batch, ``chunk_size`` tokens at a time.

    Gradients flow iff grad mode is enabled by the caller (use ``torch.no_grad()`` for scoring).
    ``gather_ids``: per sequence a ``[len(response), K]`` long tensor of token ids whose log-probs
    are wanted (all sequences must share K; None entries are filled with token 0 and should be masked
    by the caller). ``topk``: also return the K most likely tokens per position (no gradient use).
    ``stop_ids``: also return, per position, the log-probability that the response stops there (the
    summed probability of these token ids), with gradient when enabled.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    device = _model_device(model)
    decoder, head = _decoder_and_head(model)
    ids, attn, pos, targets, mask = _pad_batch(prompts, responses, pad_id, device)
    bsz, max_resp = targets.shape

    gid: Tensor | None = None
    if gather_ids is not None:
        ks = {g.shape[-1] for g in gather_ids if g is not None}
        if len(ks) != 1:
            raise ValueError(f"gather_ids must share one K across the batch, got {sorted(ks)}")
        k = ks.pop()
        gid = torch.zeros((bsz, max_resp, k), dtype=torch.long, device=device)
        for i, g in enumerate(gather_ids):
            if g is None:
                continue
            if g.shape[0] != len(responses[i]):
                raise ValueError(
                    f"sequence {i}: gather_ids has {g.shape[0]} rows, response has {len(responses[i])} tokens"
                )
            gid[i, : g.shape[0]] = g.to(device=device, dtype=torch.long)

    hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    # Keep only positions that predict real response tokens, flattened to [N, H]: prompt and padding
    # positions are never projected onto the vocabulary.
    h_resp = hidden.gather(1, pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    valid = mask.bool()
    flat_idx = valid.reshape(-1).nonzero().squeeze(-1)  # [N] into the [B * R] grid
    h_flat = h_resp.reshape(bsz * max_resp, -1)[flat_idx]
    t_flat = targets.reshape(-1)[flat_idx]
    g_flat = gid.reshape(bsz * max_resp, -1)[flat_idx] if gid is not None else None
    weight, bias = head.weight, getattr(head, "bias", None)
    stop_t = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device) if stop_ids else None

    parts: list[tuple[Tensor, ...]] = []
    use_ckpt = torch.is_grad_enabled() and (h_flat.requires_grad or weight.requires_grad)
    n_tok = h_flat.shape[0]
    for start in range(0, n_tok, chunk_size):
        sl = slice(start, start + chunk_size)
        g = g_flat[sl] if g_flat is not None else None
        if use_ckpt:
            # Recompute this chunk's logits in backward rather than keeping [chunk, V] alive.
            out = checkpoint(
                _chunk_stats,
                h_flat[sl],
                t_flat[sl],
                weight,
                bias,
                with_entropy,
                g,
                topk,
                stop_t,
                use_reentrant=False,
            )
        else:
            out = _chunk_stats(h_flat[sl], t_flat[sl], weight, bias, with_entropy, g, topk, stop_t)
        parts.append(out)

    def unflatten(k: int, trailing: tuple[int, ...] = ()) -> Tensor:
        """Concatenate part ``k`` of every chunk and scatter it back onto the padded [B, R, ...] grid."""
        flat = torch.cat([p[k] for p in parts], dim=0)
        grid = flat.new_zeros((bsz * max_resp, *trailing))
        return grid.index_put((flat_idx,), flat).reshape(bsz, max_resp, *trailing)

    stats = TokenStats(logprobs=unflatten(0), mask=mask)
    if with_entropy:
        stats.entropy = unflatten(1)
    if g_flat is not None:
        stats.gathered = unflatten(2, (g_flat.shape[-1],))
    if topk > 0:
        stats.topk_logprobs = unflatten(3, (topk,))
        stats.topk_ids = unflatten(4, (topk,))
    if stop_t is not None:
        stats.stop_logprobs = unflatten(5)
    return stats


def sequence_logprobs(
    model, prompt_ids: list[int], response_ids: list[int], *, topk: int = 0, chunk_size: int = 256
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs of ``response_ids`` given ``prompt_ids`` under ``model``, without gradient.

    Returns ``(logprobs [T], topk_ids [T, K] | None, topk_logprobs [T, K] | None)`` on CPU, float32,
    with T = len(response_ids). Computed ``chunk_size`` positions at a time (see module docstring).
    This is what the judge uses for teacher log-probs: pass the hint-enhanced prompt and the same
    response token ids the policy sampled.
    """
    with torch.no_grad():
        stats = batch_token_stats(model, [prompt_ids], [response_ids], chunk_size=chunk_size, topk=topk)
    lp = stats.logprobs[0].cpu()
    if topk > 0:
        assert stats.topk_ids is not None and stats.topk_logprobs is not None
        return lp, stats.topk_ids[0].cpu(), stats.topk_logprobs[0].cpu()
    return lp, None, None


def full_logsoftmax_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    with_entropy: bool = False,
    pad_id: int = 0,
) -> TokenStats:
    """The plain implementation: full ``[B, L, V]`` float32 log-softmax. Reference for tests/bench."""
    device = _model_device(model)
    ids, attn, pos, targets, mask = _pad_batch(prompts, responses, pad_id, device)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)  # [B, L, V]
    idx = pos.unsqueeze(-1).expand(-1, -1, logp_all.shape[-1])
    logp_resp = logp_all.gather(1, idx)  # [B, R, V]
    lp = logp_resp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
    stats = TokenStats(logprobs=lp, mask=mask)
    if with_entropy:
        stats.entropy = -(logp_resp.exp() * logp_resp).sum(-1) * mask
    return stats


def plain_token_stats(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    chunk_size: int = 256,
    with_entropy: bool = False,
    gather_ids: Sequence[Tensor | None] | None = None,
    topk: int = 0,
    pad_id: int = 0,
    stop_ids: Collection[int] | None = None,
) -> TokenStats:
    """Drop-in for :func:`batch_token_stats` built on :func:`full_logsoftmax_logprobs`.

    Exists only so the benchmark can run the *same* trainer with the plain implementation;
    ``chunk_size`` is ignored and ``topk`` is not supported.
    """
    if topk:
        raise ValueError("plain_token_stats does not compute top-K")
    stats = full_logsoftmax_logprobs(model, prompts, responses, with_entropy=with_entropy, pad_id=pad_id)
    if gather_ids is not None:
        raise ValueError("plain_token_stats does not gather ids")
    if stop_ids:
        raise ValueError("plain_token_stats does not compute the stop log-probability")
    return stats
