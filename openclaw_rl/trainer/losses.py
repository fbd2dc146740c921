"""The one PPO loss of docs/training.md ("The loss"), its advantages, and the distillation / KL / entropy terms.

Every function works on right-padded ``[B, R]`` tensors of response tokens with a float ``mask``
(1 = a token that is trained on, 0 = padding or a turn excluded by the judge). Equations:

    ratio_t = exp(logp_new_t - logp_old_t)                                    (eq. 1)
    L_pg    = -mean_t min(ratio_t * A_t, clip(ratio_t, 1 - eps, 1 + eps_high) * A_t)      (eq. 2)
    L       = L_pg + kl_coef * KL(pi_theta || pi_ref) - entropy_coef * H              (eq. 3)
    k3_t    = exp(r_t) - r_t - 1,  r_t = logp_ref_t - logp_new_t                       (eq. 4)

    decoupled:  L_pg = -mean_t w_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps_high) A_t),
                rho_t = exp(logp_new_t - logp_prox_t),
                w_t = min(exp(logp_prox_t - logp_behav_t), C)                           (eq. 2')

    Binary RL:  A_t = r - b   (b: the group's mean reward, or a running mean)     (eq. 5)
    OPD:        A_t = clip(logp_teacher_t - logp_student_t, -c, c)                 (eq. 6)
    Combined:   A_t = w_rl * r + w_opd * (logp_teacher_t - logp_student_t)         (eq. 7)
    Top-K:      KL(q || p) over K+1 bins, bin K+1 = tail mass 1 - sum_k p_k          (eq. 8)
    Stop:       KL(Bern(s_t) || Bern(s_ref_t)), s_t = p_theta(stop | prefix_t)        (eq. 9)

``logp_student`` is the rollout's log-probs by default, the proximal policy's with ``[training]
opd_reference = "proximal"``.

Token means: ``mean_t`` is the sum over masked tokens divided by a *denominator* the caller passes
(the trainer passes the number of masked tokens in the whole mini-batch, so micro-batches add up to
exactly one mean per optimiser step). A denominator of 0 is treated as 1: a batch whose masks are all
zero yields a loss of exactly 0 with zero gradient, never NaN. Masking uses ``torch.where`` rather
than multiplication, and log-ratios are clamped before ``exp``, because ``0 * inf`` is NaN and an
overflowing ratio on a *masked* token must not poison the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

# exp(20) ~ 5e8: far beyond any clip range, small enough that exp never overflows float32.
MAX_LOG_RATIO = 20.0
# Smallest tail probability we take the log of: a teacher top-K covering "all" the mass would
# otherwise give log(0) = -inf in eq. 8.
MIN_TAIL_PROB = 1e-8


def _where(mask: Tensor, x: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def masked_sum(x: Tensor, mask: Tensor, weight: Tensor | None = None) -> Tensor:
    """Sum of ``x`` over tokens with ``mask > 0``, each scaled by ``weight`` when given."""
    w = mask if weight is None else weight
    return _where(mask, x * w).sum()


def masked_mean(
    x: Tensor, mask: Tensor, denom: float | Tensor | None = None, weight: Tensor | None = None
) -> Tensor:
    """``masked_sum / denom`` with ``denom`` defaulting to the number of masked tokens; 0 -> 1."""
    if denom is None:
        denom = (mask > 0).sum()
    d = torch.as_tensor(denom, dtype=x.dtype, device=x.device).clamp(min=1.0)
    return masked_sum(x, mask, weight) / d


# ---------------------------------------------------------------------------------------------
# Advantages (eqs. 5-7)
# ---------------------------------------------------------------------------------------------


def opd_advantage(
    teacher_logprobs: Tensor,
    student_logprobs: Tensor,
    has_teacher: Tensor,
    mask: Tensor,
    *,
    opd_adv_clip: float | None = None,
    baseline: Literal["none", "prefix_mean", "response_mean"] = "none",
    skip: Tensor | None = None,
) -> Tensor:
    """The per-token OPD part of eq. 6, ``[B, R]``: ``teacher - student``, clipped to ``±opd_adv_clip``
    when set, zero on rows without teacher log-probs and where ``skip`` ``[B, R]`` is set (the stop
    tokens, with ``[training] opd_stop_token = "skip"``; they count for no later token's baseline).

    ``baseline`` removes the part common to the whole response (the hint shifts the teacher's
    context, which makes every student token a little less likely under it; docs/training.md, "The
    OPD baseline"): ``"prefix_mean"`` takes each token relative to the mean of the same row's earlier
    trained tokens (0 for the first), ``"response_mean"`` relative to the mean of all of them, so
    each row's OPD advantages sum to zero and nothing pushes the sampled response up or down as a
    whole (rollouts are sampled below temperature 1, where such a push sharpens or flattens the
    policy; tried, it did not learn more: docs/training.md, "A zero-sum baseline"). ``"none"``: the plain
    difference.
    """
    opd = teacher_logprobs - student_logprobs
    if opd_adv_clip is not None:
        opd = opd.clamp(-opd_adv_clip, opd_adv_clip)
    on = mask * has_teacher.to(mask.dtype).unsqueeze(-1)
    if skip is not None:
        on = on * (skip <= 0).to(mask.dtype)
    opd = torch.where(on > 0, opd, torch.zeros_like(opd))
    if baseline == "response_mean":
        n = on.sum(dim=-1, keepdim=True)
        mean = opd.sum(dim=-1, keepdim=True) / n.clamp(min=1.0)
        opd = torch.where(on > 0, opd - mean, torch.zeros_like(opd))
    elif baseline == "prefix_mean":
        before_sum = torch.cumsum(opd, dim=-1) - opd
        before_n = torch.cumsum(on, dim=-1) - on
        prefix_mean = torch.where(before_n > 0, before_sum / before_n.clamp(min=1.0), torch.zeros_like(opd))
        opd = torch.where(on > 0, opd - prefix_mean, torch.zeros_like(opd))
    elif baseline != "none":
        raise ValueError(f"baseline must be 'none', 'prefix_mean' or 'response_mean', got {baseline!r}")
    return opd


def compute_advantages(
    rewards: Tensor,
    has_reward: Tensor,
    opd: Tensor,
    *,
    binary_rl_weight: float = 1.0,
    opd_weight: float = 1.0,
    rl_scale: float = 1.0,
) -> Tensor:
    """Per-token advantages ``[B, R]`` of the combined method (eq. 7).

    ``rewards`` / ``has_reward``: ``[B]`` the RL scalar ``r - b`` of eq. 5 (a sample's advantage, or
    its raw score without a baseline) and whether the sample has an RL part.
    ``opd`` ``[B, R]``: the OPD part, :func:`opd_advantage` (zero on rows without a teacher). A
    missing part contributes zero, so pure Binary RL (eq. 5) is an all-zero ``opd`` and pure OPD
    (eq. 6) ``has_reward = 0``. The baseline is subtracted where samples are made
    (judge/sample_rules.py). ``rl_scale`` multiplies the RL part (see :func:`balanced_rl_scale`).
    """
    rl = (binary_rl_weight * rl_scale * rewards * has_reward.to(rewards.dtype)).unsqueeze(-1)  # [B, 1]
    return rl + opd_weight * opd


def balanced_rl_scale(
    rewards: Tensor, has_reward: Tensor, opd: Tensor, has_teacher: Tensor, mask: Tensor
) -> float | None:
    """The factor that brings the RL part to the OPD part's size per token in this batch (at most 1),
    or None when the batch has no token of one of them.

    The two parts live on different scales: a ±1 reward is broadcast to every token at full size,
    while ``teacher - rollout`` is a small per-token difference (measured on the embedded model:
    mean |RL| 0.83 against mean |OPD| 0.10 per token), so at 1:1 the scalar would drown the
    distillation signal. Scaled by this factor, ``binary_rl_weight : opd_weight`` is the ratio of
    their mean pushes per token. It never enlarges the RL part: a batch of small advantages (rewards
    close to their baseline) is not blown up to full size. ``rewards`` / ``has_reward`` as
    :func:`compute_advantages`, ``opd`` its OPD part, ``has_teacher`` ``[B]`` the rows that have one,
    ``mask`` ``[B, R]``: the tokens trained on.
    """
    opd_tokens = mask * has_teacher.to(mask.dtype).unsqueeze(-1)
    rl_tokens = mask * has_reward.to(mask.dtype).unsqueeze(-1)
    if opd_tokens.sum() <= 0 or rl_tokens.sum() <= 0:
        return None
    opd_size = float((opd.abs() * opd_tokens).sum() / opd_tokens.sum())
    rl_size = float((rewards.abs().unsqueeze(-1) * rl_tokens).sum() / rl_tokens.sum())
    if rl_size <= 0:
        return None
    return min(1.0, opd_size / rl_size)


# ---------------------------------------------------------------------------------------------
# Terms (eqs. 1-4, 8)
# ---------------------------------------------------------------------------------------------


def k3_kl(logp_new: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-token low-variance KL estimate (eq. 4): ``exp(r) - r - 1`` with ``r = ref - new``; >= 0."""
    r = (logp_ref - logp_new).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(r) - r - 1.0


def _log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, floored at ``log(MIN_TAIL_PROB)``."""
    one_minus = -torch.expm1(x.clamp(max=0.0))
    return one_minus.clamp(min=MIN_TAIL_PROB).log()


def topk_reverse_kl(student_topk_logprobs: Tensor, teacher_topk_logprobs: Tensor) -> Tensor:
    """Per-token reverse KL(student || teacher) over the teacher's top-K plus a tail bin (eq. 8).

    Inputs ``[B, R, K]``: log-probs of the *teacher's* top-K token ids under the student and the
    teacher. Bin K+1 holds the remaining mass: ``log(1 - sum_k exp(logp_k))`` on each side.
    Returns ``[B, R]``: ``sum_bins q (log q - log p)``, >= 0 up to the tail floor.
    """
    s_tail = _log1mexp(torch.logsumexp(student_topk_logprobs, dim=-1, keepdim=True))
    t_tail = _log1mexp(torch.logsumexp(teacher_topk_logprobs, dim=-1, keepdim=True))
    s = torch.cat([student_topk_logprobs, s_tail], dim=-1)  # [B, R, K+1]
    t = torch.cat([teacher_topk_logprobs, t_tail], dim=-1)
    return (s.exp() * (s - t)).sum(-1)


def stop_kl(stop_logp: Tensor, stop_logp_ref: Tensor) -> Tensor:
    """Per-position KL between two stop-or-continue decisions (eq. 9), ``[B, R]``, >= 0.

    Inputs are log-probabilities of stopping at each position (any stop token) under the policy and
    the reference. Unlike :func:`k3_kl` on the sampled token, it acts at every position, also where
    the response went on: it keeps the policy's readiness to stop where the base had it
    (docs/training.md, "Holding the stop decision").
    """
    go_on = _log1mexp(stop_logp)
    go_on_ref = _log1mexp(stop_logp_ref)
    return stop_logp.exp() * (stop_logp - stop_logp_ref) + go_on.exp() * (go_on - go_on_ref)


@dataclass
class LossOutput:
    """The differentiable loss plus detached per-token means of its parts (over masked tokens)."""

    loss: Tensor
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


def ppo_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    sample_weight: Tensor | None = None,
    logp_ref: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    student_topk: Tensor | None = None,
    teacher_topk: Tensor | None = None,
    topk_mask: Tensor | None = None,
    topk_coef: float = 1.0,
    denom: float | None = None,
    behaviour_weight: Tensor | None = None,
    stop_logp: Tensor | None = None,
    stop_logp_ref: Tensor | None = None,
    stop_kl_coef: float = 0.0,
) -> LossOutput:
    """The loss of eq. 3 (plus ``topk_coef`` x eq. 8 where ``topk_mask``), token means over ``mask``.

    ``logp_old`` is the ratio's denominator: the behaviour (rollout) log-probs, or with the decoupled
    correction (eq. 2') the proximal policy's, in which case ``behaviour_weight`` ``[B, R]`` carries
    the truncated proximal / behaviour importance weight of each token (detached). ``sample_weight``
    ``[B]`` scales each sample's tokens (staleness down-weighting) without changing the denominator.
    ``topk_mask`` ``[B, R]`` selects tokens trained by top-K distillation (normally those samples
    whose OPD part comes as a top-K instead of an advantage). ``denom`` defaults to the number of
    masked tokens here; pass the mini-batch's total when accumulating micro-batches.
    ``stop_logp`` / ``stop_logp_ref`` ``[B, R]``: log-probability of stopping at each position under
    the policy and the reference; with both, ``stop_kl_coef`` x eq. 9 is added.
    """
    mask = mask.float()
    weight = mask if sample_weight is None else mask * sample_weight.to(mask.dtype).unsqueeze(-1)
    n_tok = int((mask > 0).sum().item())
    if denom is None:
        denom = float(n_tok)

    # eq. 1; clamped so that exp never overflows (see module docstring).
    log_ratio = (logp_new - logp_old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    # eq. 2: the pessimistic (min) of the unclipped and clipped surrogate, negated for descent.
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    pg_tok = -torch.minimum(surr1, surr2)
    if behaviour_weight is not None:  # eq. 2': the version gap between behaviour and proximal policy
        pg_tok = pg_tok * behaviour_weight.detach()
    pg_loss = masked_mean(pg_tok, mask, denom, weight)
    loss = pg_loss

    kl_val = torch.zeros((), device=mask.device)
    if logp_ref is not None:
        kl_tok = k3_kl(logp_new, logp_ref)
        kl_val = masked_mean(kl_tok, mask, denom, weight)
        if kl_coef:
            loss = loss + kl_coef * kl_val
    ent_val = torch.zeros((), device=mask.device)
    if entropy is not None:
        ent_val = masked_mean(entropy, mask, denom, weight)
        if entropy_coef:
            loss = loss - entropy_coef * ent_val
    topk_val = torch.zeros((), device=mask.device)
    if student_topk is not None and teacher_topk is not None and topk_mask is not None:
        tk_mask = mask * topk_mask.to(mask.dtype)
        tk_weight = weight * topk_mask.to(mask.dtype)
        topk_val = masked_mean(topk_reverse_kl(student_topk, teacher_topk), tk_mask, denom, tk_weight)
        loss = loss + topk_coef * topk_val
    stop_val = torch.zeros((), device=mask.device)
    if stop_logp is not None and stop_logp_ref is not None:
        stop_val = masked_mean(stop_kl(stop_logp, stop_logp_ref), mask, denom, weight)
        if stop_kl_coef:
            loss = loss + stop_kl_coef * stop_val

    with torch.no_grad():
        # Diagnostics are plain means over this call's masked tokens (not the caller's denominator).
        clipped = (surr2 < surr1).float()  # the clipped branch is the active one
        metrics = {
            "pg_loss": float(pg_loss.detach()),
            "kl": float(kl_val.detach()),
            "entropy": float(ent_val.detach()),
            "topk_kl": float(topk_val.detach()),
            "stop_kl": float(stop_val.detach()),
            "clip_frac": float(masked_mean(clipped, mask)),
            "ppo_kl": float(masked_mean(logp_old - logp_new, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "adv_mean": float(masked_mean(advantages, mask)),
        }
        if behaviour_weight is not None:
            metrics["behaviour_weight_mean"] = float(masked_mean(behaviour_weight, mask))
    return LossOutput(loss=loss, num_tokens=n_tok, metrics=metrics)
