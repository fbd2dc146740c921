"""Each loss term against a hand computation on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from openclaw_rl.trainer.losses import (
    compute_advantages,
    k3_kl,
    masked_mean,
    opd_advantage,
    ppo_loss,
    topk_reverse_kl,
)

EPS, EPS_HIGH = 0.2, 0.28


def _case():
    # ratios 0.5, 0.5, 1.5, 1.5 (+ a masked 1.1) against advantages +1, -1, +1, -1 (+ 2)
    ratios = torch.tensor([[0.5, 0.5, 1.5, 1.5, 1.1]])
    logp_old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    logp_new = (logp_old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return logp_new, logp_old, adv, mask


def test_ppo_clipping_both_sides_asymmetric():
    logp_new, logp_old, adv, mask = _case()
    out = ppo_loss(logp_new, logp_old, adv, mask, clip_low=EPS, clip_high=EPS_HIGH)
    # token 0: min(0.5, 0.8)=0.5 -> -0.5 | token 1: min(-0.5, -0.8)=-0.8 -> 0.8 (low clip active)
    # token 2: min(1.5, 1.28)=1.28 -> -1.28 (high clip active) | token 3: min(-1.5, -1.28) -> 1.5
    expected = (-0.5 + 0.8 - 1.28 + 1.5) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    assert out.num_tokens == 4
    out.loss.backward()
    g = logp_new.grad[0]
    # d/dlogp of -ratio*A is -ratio*A; clipped tokens and the masked one get no gradient.
    assert g[0].item() == pytest.approx(-0.5 / 4, abs=1e-6)
    assert g[1].item() == 0.0 and g[2].item() == 0.0 and g[4].item() == 0.0
    assert g[3].item() == pytest.approx(1.5 / 4, abs=1e-6)


def test_ppo_symmetric_clip_uses_eps_for_upper_bound():
    logp_new, logp_old, adv, mask = _case()
    out = ppo_loss(logp_new, logp_old, adv, mask, clip_low=EPS, clip_high=EPS)
    assert out.loss.item() == pytest.approx((-0.5 + 0.8 - 1.2 + 1.5) / 4, abs=1e-6)


def test_ppo_kl_metric_and_denominator():
    logp_new, logp_old, adv, mask = _case()
    out = ppo_loss(logp_new, logp_old, adv, mask, clip_low=EPS, clip_high=EPS_HIGH, denom=8)
    assert out.loss.item() == pytest.approx((-0.5 + 0.8 - 1.28 + 1.5) / 8, abs=1e-6)
    # ppo_kl = mean(old - new) over the 4 masked tokens = -mean(log ratio)
    assert out.metrics["ppo_kl"] == pytest.approx(-(2 * math.log(0.5) + 2 * math.log(1.5)) / 4, abs=1e-6)


def test_all_zero_mask_is_a_noop_even_with_overflowing_ratios():
    logp_old = torch.zeros(2, 3)
    logp_new = torch.full((2, 3), 1000.0, requires_grad=True)  # exp(1000) = inf if not guarded
    ref = torch.full((2, 3), -1000.0)
    out = ppo_loss(
        logp_new,
        logp_old,
        torch.ones(2, 3),
        torch.zeros(2, 3),
        clip_low=EPS,
        clip_high=EPS_HIGH,
        logp_ref=ref,
        kl_coef=0.1,
        entropy=torch.ones(2, 3),
        entropy_coef=0.1,
    )
    assert out.loss.item() == 0.0 and out.num_tokens == 0
    out.loss.backward()
    assert torch.isfinite(logp_new.grad).all() and (logp_new.grad == 0).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_masked_token_with_huge_ratio_does_not_poison_batch():
    logp_old = torch.tensor([[0.0, 0.0]])
    logp_new = torch.tensor([[0.1, 500.0]], requires_grad=True)
    out = ppo_loss(
        logp_new, logp_old, torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), clip_low=EPS, clip_high=EPS_HIGH
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-math.exp(0.1), abs=1e-6)
    assert torch.isfinite(logp_new.grad).all()


def test_sample_weight_scales_without_changing_denominator():
    logp = torch.zeros(2, 1)
    base = dict(clip_low=EPS, clip_high=EPS_HIGH)
    out = ppo_loss(
        logp, logp, torch.ones(2, 1), torch.ones(2, 1), sample_weight=torch.tensor([1.0, 0.5]), **base
    )
    assert out.loss.item() == pytest.approx(-(1.0 + 0.5) / 2)


def test_k3_kl_hand_values():
    new = torch.tensor([0.0, -1.0, -2.0])
    ref = torch.tensor([math.log(2.0), -1.0, -2.5])
    k3 = k3_kl(new, ref)
    assert k3[0].item() == pytest.approx(2.0 - math.log(2.0) - 1.0, abs=1e-6)
    assert k3[1].item() == pytest.approx(0.0, abs=1e-7)
    assert k3[2].item() == pytest.approx(math.exp(-0.5) + 0.5 - 1.0, abs=1e-6)
    assert (k3 >= 0).all()


def test_kl_and_entropy_enter_total_loss():
    logp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-1.0 + math.log(2.0), -1.0]])
    ent = torch.tensor([[2.0, 4.0]])
    out = ppo_loss(
        logp,
        logp,
        torch.zeros(1, 2),
        torch.ones(1, 2),
        clip_low=EPS,
        clip_high=EPS_HIGH,
        logp_ref=ref,
        kl_coef=0.5,
        entropy=ent,
        entropy_coef=0.1,
    )
    kl = (2.0 - math.log(2.0) - 1.0) / 2
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-6)
    assert out.metrics["entropy"] == pytest.approx(3.0)
    assert out.loss.item() == pytest.approx(0.5 * kl - 0.1 * 3.0, abs=1e-6)


def test_advantages_binary_opd_combined():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    teacher = torch.tensor([[-0.5, -4.0, -3.0], [0.0, 0.0, 0.0]])
    rewards = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)

    def opd(has_teacher: list[bool], clip: float | None = None) -> torch.Tensor:
        return opd_advantage(teacher, old, torch.tensor(has_teacher), mask, opd_adv_clip=clip)

    # Binary RL only: reward broadcast, no normalisation.
    a = compute_advantages(rewards, torch.tensor([True, True]), opd([False, False]))
    assert a.tolist() == [[1.0] * 3, [-1.0] * 3]
    # OPD only, clipped at 1: teacher - old = [0.5, -2 -> -1, 0]
    a = compute_advantages(rewards, torch.tensor([False, False]), opd([True, False], clip=1.0))
    assert a.tolist() == [[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]]
    # Combined with weights 2 : 0.5; sample 1 has no teacher part.
    a = compute_advantages(
        rewards, torch.tensor([True, True]), opd([True, False]), binary_rl_weight=2.0, opd_weight=0.5
    )
    assert a[0].tolist() == pytest.approx([2.25, 1.0, 2.0])
    assert a[1].tolist() == [-2.0] * 3


def test_the_opd_baseline_removes_what_is_common_to_the_whole_response_and_keeps_what_differs():
    """A hint that makes every token 0.3 less likely under the teacher pushes every sampled token
    down without a baseline; with ``baseline`` only the token the hint really disfavours is pushed
    (relative to the row's earlier tokens), padding and rows without a teacher stay zero."""
    student = torch.zeros(2, 5)
    teacher = torch.tensor([[-0.3, -0.3, -0.3, -1.3, 5.0], [-0.3, -0.3, -0.3, -0.3, -0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])  # row 0: padding last
    has_teacher = torch.tensor([True, False])
    plain = opd_advantage(teacher, student, has_teacher, mask)
    assert plain[0].tolist() == pytest.approx([-0.3, -0.3, -0.3, -1.3, 0.0])  # every token pushed down
    centred = opd_advantage(teacher, student, has_teacher, mask, baseline="prefix_mean")
    # the first token has nothing before it; later ones are measured against their prefix's mean
    assert centred[0].tolist() == pytest.approx([-0.3, 0.0, 0.0, -1.0, 0.0])
    assert centred[1].tolist() == [0.0] * 5
    # the baseline of a token never depends on the token itself (nor on later ones): changing the
    # last real token moves only that token's advantage
    moved = teacher.clone()
    moved[0, 3] = 2.0
    again = opd_advantage(moved, student, has_teacher, mask, baseline="prefix_mean")
    assert again[0, :3].tolist() == pytest.approx(centred[0, :3].tolist())
    assert float(again[0, 3]) == pytest.approx(2.3)


def test_a_skipped_stop_token_gets_no_opd_push_and_sets_no_later_baseline():
    """With ``skip`` (the stop tokens, ``opd_stop_token = "skip"``) a teacher that dislikes where the
    response stopped (-2.0 on its last token) pushes that token nowhere; the other tokens keep their
    advantages, with or without the baseline."""
    student = torch.zeros(1, 4)
    teacher = torch.tensor([[-0.1, 0.4, -0.2, -2.0]])
    mask = torch.ones(1, 4)
    has_teacher = torch.tensor([True])
    stop = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    for baseline in ("none", "prefix_mean"):
        kept = opd_advantage(teacher, student, has_teacher, mask, baseline=baseline)
        skipped = opd_advantage(teacher, student, has_teacher, mask, baseline=baseline, skip=stop)
        assert float(kept[0, 3]) < -1.0
        assert float(skipped[0, 3]) == 0.0
        assert skipped[0, :3].tolist() == pytest.approx(kept[0, :3].tolist())
    # a skipped token in the middle (a stop id the response went past) is left out of the prefix mean
    mid = opd_advantage(
        teacher, student, has_teacher, mask, baseline="prefix_mean", skip=torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    )
    assert mid[0].tolist() == pytest.approx([-0.1, 0.0, -0.1, -1.85])


def test_the_zero_sum_baseline_leaves_no_push_on_the_response_as_a_whole():
    """``response_mean``: each row's OPD advantages sum to zero over its trained tokens, so the
    tokens the hinted teacher prefers more than the row's average go up and the others down by as
    much; padding, skipped stop tokens and rows without a teacher stay zero and count in no mean."""
    student = torch.zeros(3, 5)
    teacher = torch.tensor(
        [[-0.3, -0.1, -0.5, 0.1, 9.0], [0.2, -0.4, 0.0, -0.6, -3.0], [-0.3, -0.3, -0.3, -0.3, -0.3]]
    )
    mask = torch.tensor(
        [[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0], [1.0] * 5]
    )  # row 0: padding last
    has_teacher = torch.tensor([True, True, False])
    stop = torch.tensor([[0.0] * 5, [0.0, 0.0, 0.0, 0.0, 1.0], [0.0] * 5])  # row 1 ended with a stop token
    adv = opd_advantage(teacher, student, has_teacher, mask, baseline="response_mean", skip=stop)
    assert adv[0].tolist() == pytest.approx([-0.1, 0.1, -0.3, 0.3, 0.0])  # mean -0.2 taken off
    assert adv[1].tolist() == pytest.approx([0.4, -0.2, 0.2, -0.4, 0.0])  # the stop token's -3.0 not in it
    assert adv[2].tolist() == [0.0] * 5
    assert float(adv[:2].sum()) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="baseline"):
        opd_advantage(teacher, student, has_teacher, mask, baseline="mean")  # type: ignore[arg-type]


def test_topk_reverse_kl_with_tail_bin():
    q = torch.tensor([[[0.5, 0.2]]])  # student tail 0.3
    p = torch.tensor([[[0.4, 0.4]]])  # teacher tail 0.2
    kl = topk_reverse_kl(q.log(), p.log())
    expected = 0.5 * math.log(0.5 / 0.4) + 0.2 * math.log(0.2 / 0.4) + 0.3 * math.log(0.3 / 0.2)
    assert kl.item() == pytest.approx(expected, abs=1e-6)
    assert topk_reverse_kl(p.log(), p.log()).item() == pytest.approx(0.0, abs=1e-7)


def test_topk_term_in_loss_only_on_selected_tokens():
    q = torch.tensor([[[0.5, 0.2], [0.5, 0.2]]]).log().requires_grad_(True)
    p = torch.tensor([[[0.4, 0.4], [0.4, 0.4]]]).log()
    zeros = torch.zeros(1, 2)
    out = ppo_loss(
        zeros,
        zeros,
        zeros,
        torch.ones(1, 2),
        clip_low=EPS,
        clip_high=EPS_HIGH,
        student_topk=q,
        teacher_topk=p,
        topk_mask=torch.tensor([[1.0, 0.0]]),
        topk_coef=2.0,
    )
    single = topk_reverse_kl(q[:, :1], p[:, :1]).item()
    assert out.loss.item() == pytest.approx(2.0 * single / 2, abs=1e-6)
    out.loss.backward()
    assert (q.grad[0, 1] == 0).all() and (q.grad[0, 0] != 0).any()


def test_masked_mean_zero_mask():
    assert masked_mean(torch.tensor([1.0, 2.0]), torch.zeros(2)).item() == 0.0
    assert masked_mean(torch.tensor([1.0, 3.0]), torch.ones(2)).item() == 2.0


def test_decoupled_loss_weights_each_token_by_its_behaviour_weight():
    """eq. 2': the clipped surrogate against the proximal policy, times w_t (detached)."""
    new = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    prox = torch.tensor([[-1.2, -2.0, -0.4]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    w = torch.tensor([[0.5, 2.0, 1.0]])
    out = ppo_loss(new, prox, adv, mask, clip_low=0.2, clip_high=0.2, behaviour_weight=w)
    ratio = torch.exp(new.detach() - prox)
    per_tok = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    assert float(out.loss) == pytest.approx(float((per_tok * w).mean()), rel=1e-6)
    assert out.metrics["behaviour_weight_mean"] == pytest.approx(float(w.mean()))
    plain = ppo_loss(new, prox, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(plain.loss) == pytest.approx(float(per_tok.mean()), rel=1e-6)  # weight 1 = the plain loss


def test_balanced_scale_brings_the_rl_part_to_the_opd_parts_size_and_never_up():
    from openclaw_rl.trainer.losses import balanced_rl_scale

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the first row's last token is padding
    old = torch.zeros(2, 3)
    teacher = torch.tensor([[0.1, -0.1, 9.0], [0.0, 0.0, 0.0]])  # padding must not count
    rewards, has_reward, has_teacher = (
        torch.tensor([0.0, 1.0]),
        torch.tensor([False, True]),
        torch.tensor([True, False]),
    )
    opd = opd_advantage(teacher, old, has_teacher, mask)
    scale = balanced_rl_scale(rewards, has_reward, opd, has_teacher, mask)
    assert scale == pytest.approx(0.1)  # mean |OPD| over the hinted row's two real tokens
    adv = compute_advantages(rewards, has_reward, opd, rl_scale=scale)
    rl_size = float(adv[1].abs().mean())
    opd_size = float((adv[0, :2]).abs().mean())
    assert rl_size == pytest.approx(opd_size)  # 1:1 is now an even mix
    # small advantages are not blown up, and without one of the parts there is nothing to balance
    small = torch.tensor([0.0, 0.01])
    assert balanced_rl_scale(small, has_reward, opd, has_teacher, mask) == 1.0
    no_opd = torch.tensor([False, False])
    assert (
        balanced_rl_scale(rewards, has_reward, opd_advantage(teacher, old, no_opd, mask), no_opd, mask)
        is None
    )


def test_stop_kl_is_the_kl_between_two_stop_or_go_on_decisions():
    """Eq. 9 at each position: zero where the policy is as ready to stop as the base, the Bernoulli KL
    otherwise, and its gradient moves the policy's stop probability back towards the base's."""
    from openclaw_rl.trainer.losses import stop_kl

    p_ref = torch.tensor([[0.5, 0.1, 0.9]])
    logit = torch.tensor([[0.0, -1.0, 3.0]], requires_grad=True)
    q = torch.sigmoid(logit)
    kl = stop_kl(torch.log(q), torch.log(p_ref))
    expected = q * torch.log(q / p_ref) + (1 - q) * torch.log((1 - q) / (1 - p_ref))
    torch.testing.assert_close(kl, expected)
    assert float(kl[0, 0].detach()) == pytest.approx(0.0, abs=1e-7)
    assert bool((kl[0, 1:] > 0).all())
    kl.sum().backward()
    assert logit.grad is not None
    # q = 0.27 > 0.1: descent lowers it; q = 0.95 > 0.9: lowers it too; q = p: no push
    assert float(logit.grad[0, 1]) > 0 and float(logit.grad[0, 2]) > 0
    assert float(logit.grad[0, 0]) == pytest.approx(0.0, abs=1e-6)


def test_ppo_loss_adds_the_stop_term_only_with_its_coefficient():
    lp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    stop, stop_ref = torch.log(torch.tensor([[0.2, 0.3]])), torch.log(torch.tensor([[0.5, 0.5]]))
    common = dict(clip_low=0.2, clip_high=0.28, stop_logp=stop, stop_logp_ref=stop_ref)
    off = ppo_loss(lp, lp, torch.zeros(1, 2), mask, **common)
    on = ppo_loss(lp, lp, torch.zeros(1, 2), mask, stop_kl_coef=2.0, **common)
    assert off.metrics["stop_kl"] == pytest.approx(on.metrics["stop_kl"]) and on.metrics["stop_kl"] > 0
    assert float(on.loss - off.loss) == pytest.approx(2.0 * on.metrics["stop_kl"], rel=1e-5)
