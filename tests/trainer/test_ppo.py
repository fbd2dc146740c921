"""Behaviour of the Trainer on the tiny model: learning direction, OPD, top-K, no-ops, micro-batching,
checkpoints and exports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from openclaw_rl.runtime.logprobs import sequence_logprobs
from openclaw_rl.trainer.ppo import Trainer, UpdateInterrupted, micro_batches
from openclaw_rl.types import Sample
from tests.helpers import tiny_model

pytestmark = pytest.mark.slow  # real processes, a sandbox, Ray, FSDP, or trains a model

PROMPT = [1, 520, 33, 1097, 30, 2]
RESPONSE = [1280, 314, 2133, 28, 216, 9]


def _sample(trainer: Trainer, sid: str = "a", prompt=PROMPT, response=RESPONSE, **kw) -> Sample:
    """A sample whose rollout log-probs are the trainer's own (as if it had served the turn)."""
    lp, _, _ = sequence_logprobs(trainer.model, prompt, response)
    return Sample(
        sample_id=sid,
        session_id="s",
        turn_index=0,
        prompt_ids=prompt,
        response_ids=response,
        rollout_logprobs=lp.tolist(),
        loss_mask=[1] * len(response),
        **kw,
    )


def _total_lp(trainer: Trainer, prompt=PROMPT, response=RESPONSE) -> float:
    return float(sequence_logprobs(trainer.model, prompt, response)[0].sum())


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.params]


@pytest.mark.parametrize("reward", [1.0, -1.0])
def test_reward_sign_moves_response_logprob(make_cfg, reward):
    trainer = Trainer(make_cfg(), make_cfg().policy_service.model)
    before = _total_lp(trainer)
    for _ in range(3):
        metrics = trainer.train_update([_sample(trainer, reward=reward)])
    after = _total_lp(trainer)
    assert (after - before) * reward > 0.05, (before, after)
    for key in (
        "loss",
        "pg_loss",
        "kl",
        "clip_frac",
        "ppo_kl",
        "entropy",
        "grad_norm",
        "tokens_per_s",
        "logprob_gap",
    ):
        assert key in metrics and metrics[key] == metrics[key]  # present and not NaN
    assert metrics["grad_norm"] > 0 and trainer.step == 3 and trainer.policy_version == 3


def test_recomputing_activations_for_long_sequences_trains_the_same_update(make_cfg):
    # recompute_above_tokens = 0 runs every micro-batch checkpointed (the memory-lean path of an
    # agent's long turns): the update must be the one the plain path makes.
    plain = Trainer(make_cfg(), make_cfg().policy_service.model)
    lean = Trainer(make_cfg(recompute_above_tokens=0), make_cfg().policy_service.model)
    batch = [_sample(plain, "a", reward=1.0), _sample(plain, "b", response=RESPONSE[::-1], reward=-1.0)]
    plain.train_update(batch)
    lean.train_update(batch)
    assert _checkpointing(lean) and not _checkpointing(plain)
    for a, b in zip(_weights(plain), _weights(lean), strict=True):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    # a batch under the limit goes back to the faster path
    lean.tc.recompute_above_tokens = 10**6
    lean.train_update(batch)
    assert not _checkpointing(lean)


def _checkpointing(trainer: Trainer) -> bool:
    """Whether the model itself recomputes activations (transformers' flag on its layers' owner)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.model.modules())


def test_update_logs_spec_line(make_cfg, capsys):
    trainer = Trainer(make_cfg(), make_cfg().policy_service.model)
    trainer.train_update([_sample(trainer, reward=1.0)])
    out = capsys.readouterr().out
    assert "[train] ppo_update done, kl=" in out and ", clip_frac=" in out


def test_stale_rollout_logprobs_show_as_gap_and_ratio(make_cfg):
    """A sample whose behaviour policy gave every token e^-0.5 of today's probability."""
    trainer = Trainer(make_cfg(off_policy_correction="none"), make_cfg().policy_service.model)
    s = _sample(trainer, reward=1.0)
    shifted = s.model_copy(update={"rollout_logprobs": [x - 0.5 for x in s.rollout_logprobs]})
    m = trainer.train_update([shifted])
    assert m["logprob_gap"] == pytest.approx(0.5, abs=1e-4)
    # no correction: new/rollout ratio = e^0.5 > 1.28, every token is clipped and pushes nothing
    assert m["clip_frac"] == pytest.approx(1.0) and m["behaviour_weight_mean"] == 1.0
    # decoupled (eq. 2'): the ratio is taken against the proximal policy (1 at the first step, so
    # nothing is clipped) and the version gap becomes an importance weight e^0.5, under its cap
    decoupled = Trainer(make_cfg(), make_cfg().policy_service.model)
    m = decoupled.train_update([shifted])
    assert m["clip_frac"] == pytest.approx(0.0) and m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["behaviour_weight_mean"] == pytest.approx(math.exp(0.5), rel=1e-3)
    capped = Trainer(make_cfg(behaviour_weight_cap=1.2), make_cfg().policy_service.model)
    assert capped.train_update([shifted])["behaviour_weight_mean"] == pytest.approx(1.2, rel=1e-4)


def _teacher_lp(prompt=PROMPT, response=RESPONSE, topk=0):
    teacher, _ = tiny_model(seed=7)
    return sequence_logprobs(teacher, prompt, response, topk=topk)


def test_opd_moves_student_towards_teacher(make_cfg):
    cfg = make_cfg(kl_coef=0.0)
    trainer = Trainer(cfg, cfg.policy_service.model)
    teacher = _teacher_lp()[0]

    def dist() -> float:
        return float((sequence_logprobs(trainer.model, PROMPT, RESPONSE)[0] - teacher).abs().sum())

    before = dist()
    for _ in range(3):
        trainer.train_update([_sample(trainer, teacher_logprobs=teacher.tolist())])
    assert dist() < before - 0.05


def test_opd_reference_proximal_pushes_a_stale_sample_by_what_the_student_still_lacks(make_cfg):
    """Asynchronous training: the policy that sampled a hinted turn gave its tokens e^-0.5 of what
    the teacher gives them; updates since then have brought the student to the teacher. With
    ``opd_reference = "proximal"`` the OPD advantage is what is still missing — nothing here, so no
    gradient; with the default ``"rollout"`` it pushes again by the gap already closed."""
    cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, off_policy_correction="none", opd_reference="proximal")
    trainer = Trainer(cfg, cfg.policy_service.model)
    now = _sample(trainer)  # the student's log-probs today, which the teacher shares
    stale = now.model_copy(
        update={
            "teacher_logprobs": now.rollout_logprobs,
            "rollout_logprobs": [x - 0.5 for x in now.rollout_logprobs],
        }
    )
    m = trainer.train_update([stale])
    assert m["grad_norm"] == 0.0 and m["pg_loss"] == 0.0

    default = Trainer(make_cfg(kl_coef=0.0, entropy_coef=0.0), cfg.policy_service.model)
    assert default.tc.opd_reference == "rollout"
    start = _total_lp(default)
    default.train_update([stale])
    assert _total_lp(default) > start + 0.05  # the tokens already have the teacher's mass: pushed on


def test_opd_baseline_stops_a_hint_that_shifts_every_token_from_pushing_the_whole_response_down(make_cfg):
    """A hinted teacher that finds every token of the response 0.3 less likely than the student
    does (the hint changed the context, not the answer) pushes the whole response down without a
    baseline; with ``opd_baseline = "prefix_mean"`` only the first token (nothing before it to
    compare with) keeps a push, so the response moves far less."""

    def moved(baseline: str) -> float:
        cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, opd_baseline=baseline)
        trainer = Trainer(cfg, cfg.policy_service.model)
        sample = _sample(trainer)
        shifted = sample.model_copy(update={"teacher_logprobs": [x - 0.3 for x in sample.rollout_logprobs]})
        start = _total_lp(trainer)
        trainer.train_update([shifted])
        return _total_lp(trainer) - start

    plain, centred = moved("none"), moved("prefix_mean")
    assert plain < -0.05  # every sampled token pushed down
    assert abs(centred) < 0.5 * abs(plain)


def test_opd_stop_token_skip_leaves_where_a_response_stopped_to_the_policy(make_cfg):
    """A response that ended by itself (its last token a stop token), and a hinted teacher that finds
    only that stop token far less likely (it wanted more written): with ``opd_stop_token = "keep"``
    the update pushes the stop token down; with ``"skip"`` (the default) it does not move.
    ``stop_frac`` reports the share of the batch's responses that ended by themselves."""
    stopped = [*RESPONSE, 2]  # the tiny model's tokenizer ends a sequence with id 2

    def stop_moved(mode: str) -> tuple[float, float]:
        cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, opd_baseline="none", opd_stop_token=mode)
        trainer = Trainer(cfg, cfg.policy_service.model)
        assert 2 in trainer.stop_ids
        sample = _sample(trainer, response=stopped)
        teacher = list(sample.rollout_logprobs)
        teacher[-1] -= 3.0
        start = float(sequence_logprobs(trainer.model, PROMPT, stopped)[0][-1])
        metrics = trainer.train_update([sample.model_copy(update={"teacher_logprobs": teacher})])
        return float(sequence_logprobs(trainer.model, PROMPT, stopped)[0][-1]) - start, metrics["stop_frac"]

    (kept, frac_kept), (skipped, frac_skipped) = stop_moved("keep"), stop_moved("skip")
    assert kept < -1e-3
    assert abs(skipped) < 0.2 * abs(kept)
    assert frac_kept == frac_skipped == 1.0


def test_opd_repeats_skip_leaves_a_loops_tokens_unpushed_and_keeps_pushing_new_ones(make_cfg):
    """A response that says one thing twice, and a teacher that finds the second saying far more
    likely (it copies what it has just read): with ``opd_repeats = "keep"`` the update pushes the
    repetition up; with ``"skip"`` it barely moves, while a new token's push is kept."""
    phrase = RESPONSE + [17, 42]  # 8 tokens: one run of the repetition window
    looped = phrase + phrase

    def moved(mode: str) -> tuple[float, float]:
        cfg = make_cfg(
            kl_coef=0.0, entropy_coef=0.0, opd_baseline="none", opd_stop_token="keep", opd_repeats=mode
        )
        trainer = Trainer(cfg, cfg.policy_service.model)
        sample = _sample(trainer, response=looped)
        teacher = list(sample.rollout_logprobs)
        for t in range(8, 16):
            teacher[t] += 2.0
        teacher[3] += 2.0  # a token of the first saying: new text
        start = sequence_logprobs(trainer.model, PROMPT, looped)[0]
        trainer.train_update([sample.model_copy(update={"teacher_logprobs": teacher})])
        after = sequence_logprobs(trainer.model, PROMPT, looped)[0]
        return float(after[8:].sum() - start[8:].sum()), float(after[3] - start[3])

    (rep_kept, new_kept), (rep_skipped, new_skipped) = moved("keep"), moved("skip")
    assert rep_kept > 1e-2
    assert rep_skipped < 0.25 * rep_kept
    assert new_skipped > 1e-3 and new_kept > 1e-3


def test_repeat_penalty_pushes_a_loop_down_and_leaves_a_response_that_does_not_repeat_alone(make_cfg):
    """No signal but the penalty (teacher = rollout, no reward): with ``repeat_penalty`` an update on
    a response that says one thing twice makes its second saying less likely, while an update on a
    response that repeats nothing moves nothing; without the penalty neither moves."""
    phrase = RESPONSE + [17, 42]  # 8 tokens: one run of the repetition window
    looped = phrase + phrase

    def moved(penalty: float, response: list[int]) -> float:
        cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, opd_baseline="none", repeat_penalty=penalty)
        trainer = Trainer(cfg, cfg.policy_service.model)
        sample = _sample(trainer, response=response)
        sample = sample.model_copy(update={"teacher_logprobs": list(sample.rollout_logprobs)})
        start = sequence_logprobs(trainer.model, PROMPT, looped)[0]
        trainer.train_update([sample])
        return float(sequence_logprobs(trainer.model, PROMPT, looped)[0][8:].sum() - start[8:].sum())

    assert moved(0.5, looped) < -1e-2
    assert abs(moved(0.5, phrase)) < 1e-4
    assert abs(moved(0.0, looped)) < 1e-4


def test_stop_kl_pulls_a_drifted_readiness_to_stop_back_towards_the_base(make_cfg):
    """A policy taught not to stop (the OPD part kept on a stop token the teacher dislikes) is
    pulled back by ``stop_kl_coef`` alone: trained on a response with no signal at all (teacher =
    rollout), the probability of stopping where it had fallen rises again towards the base's;
    without the term the same updates leave it where it is."""
    from openclaw_rl.runtime.logprobs import batch_token_stats

    stopped = [*RESPONSE, 2]  # the tiny model's tokenizer ends a sequence with id 2

    def stop_lp(trainer: Trainer) -> float:
        with torch.no_grad():
            stats = batch_token_stats(trainer.model, [PROMPT], [stopped], stop_ids=trainer.stop_ids)
        assert stats.stop_logprobs is not None
        return float(stats.stop_logprobs[0, -1])

    def recovered(coef: float) -> tuple[float, float, dict[str, float]]:
        cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, opd_baseline="none", opd_stop_token="keep")
        trainer = Trainer(cfg, cfg.policy_service.model)
        base = stop_lp(trainer)
        sample = _sample(trainer, response=stopped)
        disliked = list(sample.rollout_logprobs)
        disliked[-1] -= 3.0
        for _ in range(3):
            trainer.train_update([sample.model_copy(update={"teacher_logprobs": disliked})])
        drifted = stop_lp(trainer)
        assert drifted < base - 1e-3
        trainer.tc.stop_kl_coef = coef
        trainer.optimizer = torch.optim.AdamW(trainer.params, lr=cfg.training.lr)  # no momentum carried
        neutral = _sample(trainer, response=stopped)
        neutral = neutral.model_copy(update={"teacher_logprobs": list(neutral.rollout_logprobs)})
        for _ in range(3):
            metrics = trainer.train_update([neutral])
        return (stop_lp(trainer) - drifted) / (base - drifted), base - drifted, metrics

    # The tiny model stops with probability ~2e-5 anywhere, so the term's gradient is that small;
    # under Adam its direction is what counts, and a large coefficient lifts it clear of Adam's eps.
    (held, gap, metrics), (free, _, free_metrics) = recovered(1e4), recovered(0.0)
    assert held > 0.3, (held, gap)  # a third or more of the lost readiness to stop is back
    assert abs(free) < 0.05
    assert metrics["stop_kl"] != 0.0 and free_metrics["stop_kl"] == 0.0  # measured only when on


def test_topk_distillation_reduces_reverse_kl(make_cfg):
    from openclaw_rl.runtime.logprobs import batch_token_stats
    from openclaw_rl.trainer.losses import topk_reverse_kl

    cfg = make_cfg(kl_coef=0.0, topk_distill=True)
    trainer = Trainer(cfg, cfg.policy_service.model)
    _, ids, top_lp = _teacher_lp(topk=4)

    def rkl() -> float:
        with torch.no_grad():
            st = batch_token_stats(trainer.model, [PROMPT], [RESPONSE], gather_ids=[ids])
        return float(topk_reverse_kl(st.gathered, top_lp.unsqueeze(0)).sum())

    before = rkl()
    for _ in range(3):
        m = trainer.train_update(
            [_sample(trainer, teacher_topk_ids=ids.tolist(), teacher_topk_logprobs=top_lp.tolist())]
        )
    assert m["topk_kl"] > 0
    # Random tiny models are near-uniform over 49k tokens, so the KL is small in absolute terms.
    assert rkl() < 0.5 * before


def test_all_zero_mask_batch_is_noop(make_cfg):
    trainer = Trainer(make_cfg(), make_cfg().policy_service.model)
    s = _sample(trainer, reward=1.0).model_copy(update={"loss_mask": [0] * len(RESPONSE)})
    w0 = _weights(trainer)
    m = trainer.train_update([s, s])
    assert all(v == v for v in m.values())
    assert m["loss"] == 0.0 and m["optimizer_steps"] == 0.0 and trainer.policy_version == 0
    assert all(torch.equal(a, b) for a, b in zip(w0, _weights(trainer), strict=True))


def test_micro_batching_does_not_change_the_step(make_cfg):
    """A mini-batch split into single-sample micro-batches gives the same weights as one micro-batch."""
    results = []
    for budget in (16, 4096):
        cfg = make_cfg(micro_batch_tokens=budget, mini_batch_size=3, batch_size=3, lr=1e-3)
        trainer = Trainer(cfg, cfg.policy_service.model)
        batch = [
            _sample(trainer, "a", reward=1.0),
            _sample(trainer, "b", prompt=PROMPT[:3], response=RESPONSE[:2], reward=-1.0),
            _sample(trainer, "c", prompt=[5, 6], response=[7, 8, 9, 10], reward=1.0),
        ]
        trainer.train_update(batch)
        results.append(_weights(trainer))
    # Adam steps are ~lr = 1e-3 per weight; a wrong accumulation (a micro-batch counted twice, a
    # wrong denominator) moves weights by that much. Summation order alone moves them by ~1e-6.
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_micro_batches_respect_budget():
    groups = micro_batches([10, 3, 7, 50, 4], budget=20)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    lengths = [10, 3, 7, 50, 4]
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 20


def test_checkpoint_resume_round_trip(make_cfg):
    cfg = make_cfg(lr=1e-3)
    a = Trainer(cfg, cfg.policy_service.model)
    samples = [_sample(a, "x", reward=1.0), _sample(a, "y", prompt=[5, 6], response=[7, 8, 9], reward=-1.0)]
    a.train_update(samples)
    a.train_update(samples)
    ckpt = a.save_checkpoint()
    assert (ckpt / "policy" / "adapter_model.safetensors").is_file()
    assert (a.checkpoint_root / "latest").read_text().strip() == ckpt.name
    b = Trainer(cfg, cfg.policy_service.model)
    assert b.resume() is True
    assert (b.step, b.policy_version) == (2, 2)
    for x, y in zip(_weights(a), _weights(b), strict=True):
        torch.testing.assert_close(x, y)
    # Optimizer state restored: the next update is identical in both trainers.
    a.train_update(samples)
    b.train_update(samples)
    for x, y in zip(_weights(a), _weights(b), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def test_resume_without_checkpoint_and_with_broken_pointer(make_cfg):
    cfg = make_cfg()
    t = Trainer(cfg, cfg.policy_service.model)
    assert t.resume() is False
    t.train_update([_sample(t, reward=1.0)])
    t.save_checkpoint()
    (t.checkpoint_root / "latest").write_text("step_99999999\n")  # points at nothing
    (t.checkpoint_root / ".step_00000002.tmp1").mkdir()  # an interrupted write is ignored
    assert t.latest_checkpoint() == t.checkpoint_root / "step_00000001"


def test_lora_export_loads_with_peft(make_cfg, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = make_cfg()
    t = Trainer(cfg, cfg.policy_service.model)
    t.train_update([_sample(t, reward=1.0)])
    out = t.export_policy(t.checkpoint_root.parent / "exports", 1)
    assert out.name == "v000001"
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    meta = json.loads((out / "openclaw_policy.json").read_text())
    assert meta["kind"] == "lora" and meta["version"] == 1
    served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out).eval()
    torch.testing.assert_close(
        sequence_logprobs(served, PROMPT, RESPONSE)[0],
        sequence_logprobs(t.model, PROMPT, RESPONSE)[0],
        atol=1e-5,
        rtol=1e-5,
    )


def test_full_training_export_and_resume(make_cfg):
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(lora=False, lr=1e-3)
    t = Trainer(cfg, cfg.policy_service.model)
    before = _total_lp(t)
    t.train_update([_sample(t, reward=1.0)])
    assert _total_lp(t) > before
    out = t.export_policy(t.checkpoint_root.parent / "exports", 1)
    served = AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(
        sequence_logprobs(served, PROMPT, RESPONSE)[0],
        sequence_logprobs(t.model, PROMPT, RESPONSE)[0],
        atol=1e-5,
        rtol=1e-5,
    )
    t.save_checkpoint()
    u = Trainer(cfg, cfg.policy_service.model)
    assert u.resume()
    for x, y in zip(_weights(t), _weights(u), strict=True):
        torch.testing.assert_close(x, y)


def test_bad_token_id_is_named(make_cfg):
    t = Trainer(make_cfg(), make_cfg().policy_service.model)
    s = _sample(t, reward=1.0).model_copy(update={"response_ids": [10**7] + RESPONSE[1:]})
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        t.train_update([s])


def test_non_finite_inputs_are_refused(make_cfg):
    t = Trainer(make_cfg(), make_cfg().policy_service.model)
    s = _sample(t, reward=1.0)
    bad = s.model_copy(update={"rollout_logprobs": [float("nan")] + s.rollout_logprobs[1:]})
    with pytest.raises(ValueError, match="rollout_logprobs contains a non-finite value"):
        t.train_update([bad])
    with pytest.raises(ValueError, match="weight must be a finite number"):
        t.train_update([s.model_copy(update={"weight": float("inf")})])


def test_non_finite_step_is_skipped_not_applied(make_cfg, capsys):
    t = Trainer(make_cfg(), make_cfg().policy_service.model)
    s = _sample(t, reward=1.0)
    poisoned = next(p for n, p in t.model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        poisoned[0, 0] = float("nan")
    w0 = _weights(t)
    m = t.train_update([s])
    assert m["skipped_steps"] == 1.0 and m["optimizer_steps"] == 0.0 and t.policy_version == 0
    assert "optimiser step skipped" in capsys.readouterr().out
    for a, b in zip(w0, _weights(t), strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


def test_a_group_of_identical_rewards_gives_no_policy_gradient(make_cfg):
    """Four attempts that all failed: as raw rewards they push every sampled token down; as
    group-relative advantages (all 0) they give no gradient at all."""
    cfg = make_cfg(kl_coef=0.0, entropy_coef=0.0, batch_size=4, mini_batch_size=4)
    trainer = Trainer(cfg, cfg.policy_service.model)
    responses = [RESPONSE, RESPONSE[:4], RESPONSE[1:], RESPONSE[::-1]]
    grouped = [
        _sample(trainer, f"g{i}", response=r, reward=-1.0, advantage=0.0) for i, r in enumerate(responses)
    ]
    metrics = trainer.train_update(grouped)
    assert metrics["grad_norm"] == 0.0 and metrics["pg_loss"] == 0.0
    raw = [_sample(trainer, f"r{i}", response=r, reward=-1.0) for i, r in enumerate(responses)]
    assert trainer.train_update(raw)["grad_norm"] > 0


def test_the_first_mini_batch_takes_its_proximal_logprobs_from_its_own_forward(make_cfg):
    """One scoring pass fewer, same update: the weights after it equal those of a trainer that scores
    every sample first (stale rollout log-probs, so the decoupled weights are not all 1)."""
    cfg = make_cfg(kl_coef=0.0, batch_size=4, mini_batch_size=2)
    fast, full = Trainer(cfg, cfg.policy_service.model), Trainer(cfg, cfg.policy_service.model)
    start = _weights(fast)
    real = full._score_old_and_ref
    full._score_old_and_ref = lambda active, first_mini_batch=0: real(active, 0)
    scored: list[int] = []
    real_score = fast._score
    fast._score = lambda model, samples: scored.append(len(samples)) or real_score(model, samples)
    responses = [RESPONSE, RESPONSE[:4], RESPONSE[1:], RESPONSE[::-1]]
    for t in (fast, full):
        batch = []
        for i, r in enumerate(responses):
            s = _sample(t, f"s{i}", response=r, reward=1.0 if i % 2 else -1.0)
            s.rollout_logprobs = [lp - 0.3 for lp in s.rollout_logprobs]  # as if sampled by an older policy
            batch.append(s)
        metrics = t.train_update(batch)
        assert metrics["behaviour_weight_mean"] > 1.2
    assert scored == [2]  # only the second mini-batch was scored before the first step
    moved = max(float((a - b).abs().max()) for a, b in zip(_weights(fast), start, strict=True))
    apart = max(float((a - b).abs().max()) for a, b in zip(_weights(fast), _weights(full), strict=True))
    assert moved > 1e-3 and apart < moved / 100, (moved, apart)  # float noise through AdamW, no more


def _batch(trainer: Trainer) -> list[Sample]:
    responses = [RESPONSE, RESPONSE[:4], RESPONSE[1:], RESPONSE[::-1]]
    return [
        _sample(trainer, f"s{i}", response=r, reward=1.0 if i % 2 else -1.0) for i, r in enumerate(responses)
    ]


def _asked(answers: list[bool]):
    """An ``interrupted`` callable that gives ``answers`` in turn (then True) and counts its calls."""
    calls: list[bool] = []

    def interrupted() -> bool:
        calls.append(answers[len(calls)] if len(calls) < len(answers) else True)
        return calls[-1]

    return interrupted, calls


def test_an_update_interrupted_after_its_first_step_takes_it_back(make_cfg):
    """Ctrl-C between the two optimiser steps of an update: the weights and AdamW moments are as
    before it, no step is counted, and the next update is exactly the one an uninterrupted trainer
    makes (the moments were restored, not left half-advanced)."""
    cfg = make_cfg(kl_coef=0.0, batch_size=4, mini_batch_size=2)
    stopped, clean = Trainer(cfg, cfg.policy_service.model), Trainer(cfg, cfg.policy_service.model)
    warm_up = _batch(stopped)
    for t in (stopped, clean):  # AdamW moments that are not empty, so restoring them means something
        t.train_update(warm_up)
    before = _weights(stopped)
    stopped.stop_check_interval_s = math.inf  # the boundaries alone ask: their calls are counted
    interrupted, calls = _asked([False, False])  # before scoring, before mini-batch 0, then stop
    with pytest.raises(UpdateInterrupted, match="1 step"):
        stopped.train_update(_batch(stopped), interrupted=interrupted)
    assert len(calls) == 3 and stopped.step == 1 and stopped.policy_version == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(stopped), strict=True))
    for t in (stopped, clean):
        t.train_update(_batch(t))
    apart = max(float((a - b).abs().max()) for a, b in zip(_weights(stopped), _weights(clean), strict=True))
    assert apart < 1e-6 and stopped.step == clean.step == 2


def test_an_update_stopped_before_it_began_changes_nothing_and_one_not_asked_to_stop_finishes(make_cfg):
    t = Trainer(make_cfg(batch_size=4, mini_batch_size=2), make_cfg().policy_service.model)
    t.stop_check_interval_s = math.inf  # the boundaries alone ask: their calls are counted
    w0 = _weights(t)
    with pytest.raises(UpdateInterrupted, match="before the update began"):
        t.train_update(_batch(t), interrupted=lambda: True)
    assert t.step == 0 and all(torch.equal(a, b) for a, b in zip(w0, _weights(t), strict=True))
    interrupted, calls = _asked([False] * 10)
    assert t.train_update(_batch(t), interrupted=interrupted)["optimizer_steps"] == 2.0
    assert t.step == 1 and len(calls) == 3  # before scoring and before each mini-batch's micro-batch


@pytest.mark.parametrize("asked_before_stop", [1, 3, 12])
def test_a_stop_inside_a_forward_or_backward_pass_ends_the_update_and_takes_it_back(
    make_cfg, asked_before_stop
):
    """A pass over a long agent turn takes minutes on a busy CPU: a stop request is asked at every
    decoder layer, forward and backward (here at every one, not once a second), and the update ends
    inside the pass with what it applied taken back; the next update is the one a clean trainer makes."""
    cfg = make_cfg(kl_coef=0.0, batch_size=4, mini_batch_size=2)
    stopped, clean = Trainer(cfg, cfg.policy_service.model), Trainer(cfg, cfg.policy_service.model)
    for t in (stopped, clean):
        t.train_update(_batch(t))
    before = _weights(stopped)
    stopped.stop_check_interval_s = 0.0
    interrupted, calls = _asked([False] * asked_before_stop)
    with pytest.raises(UpdateInterrupted, match="stopped in"):
        stopped.train_update(_batch(stopped), interrupted=interrupted)
    assert len(calls) == asked_before_stop + 1 and stopped.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(stopped), strict=True))
    stopped.stop_check_interval_s = 1.0
    for t in (stopped, clean):
        t.train_update(_batch(t))
    apart = max(float((a - b).abs().max()) for a, b in zip(_weights(stopped), _weights(clean), strict=True))
    assert apart < 1e-6 and stopped.step == clean.step == 2


def test_full_weights_finish_an_update_that_has_stepped_rather_than_copy_the_model(make_cfg):
    """Without LoRA there is no copy to go back to: a stop after the first step lets the update
    finish (and be counted); a stop before it still abandons it."""
    cfg = make_cfg(lora=False, lr=1e-4, batch_size=4, mini_batch_size=2)
    t = Trainer(cfg, cfg.policy_service.model)
    t.stop_check_interval_s = math.inf  # the boundaries alone ask: their calls are counted
    interrupted, calls = _asked([False, False])
    metrics = t.train_update(_batch(t), interrupted=interrupted)
    assert metrics["optimizer_steps"] == 2.0 and t.step == 1 and len(calls) == 2
    w1 = _weights(t)
    interrupted, _ = _asked([False])
    with pytest.raises(UpdateInterrupted):
        t.train_update(_batch(t), interrupted=interrupted)
    assert t.step == 1 and all(torch.equal(a, b) for a, b in zip(w1, _weights(t), strict=True))
