"""The training engine: PPO updates over judged samples, checkpoints, and policy export.

One :meth:`Trainer.train_update` call is one PPO update:

1. a no-grad pass scores the samples under the current (proximal) policy — except those of the first
   mini-batch, whose training forward runs on exactly these weights and gives their proximal
   log-probs for free — and, when ``kl_coef`` or ``stop_kl_coef`` is above 0, every sample under the
   reference policy — with LoRA the *same* model with its adapter disabled (no extra weights), for
   full training a frozen copy of the initial weights;
2. the batch is split into mini-batches of ``mini_batch_size`` samples, one optimiser step each;
3. inside a mini-batch, samples are packed into micro-batches whose padded size stays under
   ``micro_batch_tokens``; gradients accumulate with the mini-batch's token count as the common
   denominator, so a step sees exactly one token mean (losses.py) however it was split.

A stop request (Ctrl-C) need not wait for an update to finish: given ``interrupted``, the update
checks it before every micro-batch and, when it is set, undoes what it applied and raises
:class:`UpdateInterrupted`; the caller returns the batch to the queue (docs/training.md "Stopping").

Off-policy correction (``[training] off_policy_correction``). Samples may come from a policy several
versions old (up to ``max_staleness``). With ``"decoupled"`` (the default; decoupled PPO as in AReaL)
the ratio is taken against the *proximal* policy — the weights this update starts from, scored in
step 1 — so clipping bounds how far one update moves the policy, and each token is weighted by
proximal / behaviour probability (truncated at ``behaviour_weight_cap``) to correct for the version
gap between the policy that sampled it and the proximal one. For a fresh sample the two policies are
the same and the weight is 1. With ``"none"`` the ratio is taken against the rollout log-probs
recorded at serving time, which folds the version gap into the clipped ratio.

Checkpoints live under ``{log_dir}/checkpoints/step_XXXXXXXX/`` and are written to a temporary
directory first, then renamed, then published by atomically replacing the ``latest`` pointer file;
a crash at any moment leaves either the old or the new checkpoint as ``latest``, never a half one.
Checkpoints and exported policies are published by one helper, :mod:`openclaw_rl.trainer.checkpoint`,
which the FSDP trainer shares. See docs/training.md for the layouts of checkpoints and exported policies.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import pickle
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from openclaw_rl.config import Config
from openclaw_rl.runtime.logprobs import batch_token_stats
from openclaw_rl.runtime.metrics import REPEAT_WINDOW, repeated_items
from openclaw_rl.runtime.rundir import POLICY_META, RunDir
from openclaw_rl.trainer.checkpoint import (
    POINTER_FILE,
    STATE_FILE,
    Publication,
    checkpoint_name,
    config_mismatch,
    latest_checkpoint,
    prune_checkpoints,
    publish,
)
from openclaw_rl.trainer.losses import balanced_rl_scale, compute_advantages, opd_advantage, ppo_loss
from openclaw_rl.types import Sample


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: damaged, incomplete, or saved with another config.
    The message names the checkpoint folder and what is wrong with it."""


#: Seconds between two stop checks inside one forward or backward pass (Trainer._stop_in_passes).
STOP_CHECK_INTERVAL_S = 1.0


class UpdateInterrupted(Exception):
    """A stop request ended :meth:`Trainer.train_update` part-way; the weights and the optimiser
    state are as they were before the update, and no step was counted."""


@dataclass
class _Undo:
    """What an update changes, kept before its first optimiser step so an interrupted update can be
    taken back: the trainable tensors and the optimiser state (a LoRA adapter's worth)."""

    params: list[Tensor]
    optimizer_state: dict[str, Any]


log = logging.getLogger("openclaw_rl.trainer")

# POINTER_FILE and STATE_FILE (imported above) belong to the publication helper; they stay importable here.
OPTIMIZER_FILE = "optimizer.pt"
POLICY_SUBDIR = "policy"
KEEP_CHECKPOINTS = 3


def user_checkpoints(cfg: Config, user: str) -> Path:
    """Where per_user training keeps ``user``'s adapter and optimiser checkpoints."""
    return RunDir.of(cfg).user_folders(user)[1]


def last_user_step(cfg: Config) -> int:
    """The newest update any user's checkpoint holds (per_user mode resumes its step count here)."""
    root = RunDir.of(cfg).checkpoints / "users"
    steps = [0]
    for d in root.iterdir() if root.is_dir() else []:
        ckpt = latest_checkpoint(d)
        if ckpt is not None:
            steps.append(int(json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))["step"]))
    return max(steps)


# Metrics already divided by a mini-batch's token count (averaged over optimiser steps), and metrics
# averaged over trained tokens; both the single-process and the FSDP update report them.
PER_STEP_METRICS = ("loss", "pg_loss", "kl", "entropy", "topk_kl", "stop_kl")
TOKEN_METRICS = ("clip_frac", "ppo_kl", "logprob_gap", "ratio_mean", "adv_mean", "behaviour_weight_mean")


def log_update(metrics: dict[str, float]) -> str:
    """Print the ``[train]`` progress line for one update to stdout (the one place it is emitted); returns it."""
    line = f"[train] ppo_update done, kl={metrics.get('kl', 0.0):.4g}, clip_frac={metrics.get('clip_frac', 0.0):.4g}"
    print(line, flush=True)
    return line


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Pack sample indices into micro-batches whose padded size (count x longest) is <= ``budget``.

    Indices are sorted by length first so that padding is small; a single sample longer than the
    budget forms its own micro-batch (it cannot be split without changing its attention context).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > budget:
            batches.append(current)
            current, longest = [], 0
            new_longest = lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


class Trainer:
    """PPO trainer for one policy (LoRA or full parameters) on one device.

    Attributes: ``step`` (completed PPO updates), ``policy_version`` (updates that changed the
    weights), ``model`` (the trainable model, a peft model with LoRA), ``tokenizer``.
    """

    #: This process's index and the number of training processes (FSDPTrainer sets both).
    rank: int = 0
    world: int = 1
    #: Seconds between two stop checks inside a pass (a test sets 0 to stop inside a short one).
    stop_check_interval_s: float = STOP_CHECK_INTERVAL_S
    _stoppable: bool = False  # while an update runs: whether a stop may end it now

    def __init__(self, cfg: Config, model_name_or_dir: str, device: str | None = None):
        """``device`` overrides ``[training] device`` (an FSDP rank passes its own ``cuda:<rank>``)."""
        from openclaw_rl.runtime.models import load_model, resolve_model_dir, stop_token_ids

        self.cfg = cfg
        self.tc = cfg.training
        self.device = device or self.tc.device
        torch.manual_seed(cfg.global_.seed)
        self.base_dir = resolve_model_dir(model_name_or_dir)
        self.model_name = model_name_or_dir
        model, self.tokenizer = load_model(model_name_or_dir, device=self.device)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.stop_ids = stop_token_ids(self.tokenizer, getattr(model, "generation_config", None))
        self.ref_model: torch.nn.Module | None = None
        if self.tc.lora:
            from peft import LoraConfig, get_peft_model

            lora_cfg = LoraConfig(
                r=self.tc.lora_rank,
                lora_alpha=self.tc.lora_alpha,
                target_modules=list(self.tc.lora_target_modules),
                lora_dropout=0.0,
                bias="none",
                task_type="CAUSAL_LM",
            )
            try:
                with warnings.catch_warnings():
                    # transformers 5 deprecation noise raised from inside peft; nothing for users to do.
                    warnings.filterwarnings(
                        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
                    )
                    model = get_peft_model(model, lora_cfg)
            except ValueError as exc:
                raise ValueError(
                    f"[training] lora_target_modules = {self.tc.lora_target_modules}: {exc}"
                ) from None
        elif self.needs_reference:
            # Full training needs its own frozen reference; with LoRA it is the adapter-disabled model.
            self.ref_model = copy.deepcopy(model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.model = model
        self._recomputing = False  # activation checkpointing, set per micro-batch (_recompute_if_long)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("no trainable parameters (check [training] lora_target_modules)")
        self.optimizer = torch.optim.AdamW(self.params, lr=self.tc.lr)
        self.step = 0
        self.policy_version = 0
        # per_user mode: whose adapter is being trained, and a fresh adapter for users new to training
        self.user: str | None = None
        self._fresh_adapter: dict[str, Tensor] | None = None
        if self.tc.lora:
            from peft import get_peft_model_state_dict

            self._fresh_adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        # [training] term_balance: the factor last applied to the RL part (1: the reward's own unit)
        self.rl_scale = 1.0
        self.checkpoint_root = RunDir.of(cfg).checkpoints
        # The log-prob implementation; the benchmark swaps in logprobs.plain_token_stats to compare.
        self.token_stats = batch_token_stats
        # How many torch threads to use for the next pass (the training loop's CoreBudget); None:
        # keep the process's own setting.
        self.thread_budget: Callable[[], int] | None = None

    # ------------------------------------------------------------------ per-user adapters
    def use_user(self, user: str) -> None:
        """Train ``user``'s own adapter from now on (per_user mode): their weights and optimiser
        state from their newest checkpoint, or a fresh adapter (equal to the base) and a fresh
        optimiser for a user never trained. ``step`` stays the run's update count; ``policy_version``
        becomes the count of the user's own weight-changing updates (the version serving knows
        counts publishes and is kept by the training loop). Checkpoints go to
        ``checkpoints/users/<user>``."""
        if user == self.user and (self.policy_version == 0 or self.latest_checkpoint() is not None):
            return  # theirs already (a trained user without checkpoints was deleted: start afresh)
        if self._fresh_adapter is None:
            raise ValueError("per-user training needs [training] lora = true")
        from peft import set_peft_model_state_dict

        step = self.step
        self.checkpoint_root = user_checkpoints(self.cfg, user)
        if not self.resume():
            set_peft_model_state_dict(self.model, self._fresh_adapter)
            self.optimizer = torch.optim.AdamW(self.params, lr=self.tc.lr)
            self.policy_version = 0
        self.step = step
        self.user = user

    def forget_user(self) -> None:
        """The loaded user was deleted: the next :meth:`use_user` loads from disk, even for their name."""
        self.user = None

    # ------------------------------------------------------------------ scoring helpers

    @contextmanager
    def _reference(self) -> Iterator[torch.nn.Module]:
        """The reference policy: adapter-disabled LoRA model, or the frozen full copy."""
        if self.tc.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            assert self.ref_model is not None
            yield self.ref_model

    @property
    def needs_reference(self) -> bool:
        """Whether an update scores its samples under the reference (base) policy: for the KL term
        to it, and for the stop-decision term's base probabilities."""
        return self.tc.kl_coef > 0 or self.tc.stop_kl_coef > 0

    def _score(self, model: torch.nn.Module, samples: Sequence[Sample], stop: bool = False) -> list[Tensor]:
        """No-grad per-token log-probs of each sample's response (list of ``[R_i]`` CPU tensors);
        with ``stop``, ``[R_i, 2]``: column 1 is the log-probability of stopping at that position."""
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        lengths = [s.num_tokens for s in samples]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for idx in micro_batches(lengths, self.tc.micro_batch_tokens):
                    stats = self.token_stats(
                        model,
                        [samples[i].prompt_ids for i in idx],
                        [samples[i].response_ids for i in idx],
                        chunk_size=self.tc.logprob_chunk_size,
                        pad_id=self.pad_id,
                        stop_ids=self.stop_ids if stop else None,
                    )
                    for row, i in enumerate(idx):
                        n = len(samples[i].response_ids)
                        lp = stats.logprobs[row, :n]
                        if stats.stop_logprobs is not None:
                            lp = torch.stack([lp, stats.stop_logprobs[row, :n]], dim=-1)
                        out[i] = lp.float().cpu()
        finally:
            model.train(was_training)
        return out

    def _uses_topk(self, s: Sample) -> bool:
        return bool(self.tc.opd_enabled and self.tc.topk_distill and s.teacher_topk_ids is not None)

    def check_samples(self, samples: Sequence[Sample], names: Sequence[str] | None = None) -> None:
        """Refuse samples this model cannot train on (a token id outside its vocabulary, an empty
        prompt, non-finite log-probs, a negative weight, mixed top-K sizes) with a ``ValueError``
        naming the first (``names``: what to call each, e.g. its file and line). ``train_update``
        runs it on every batch; a replay runs it on the whole file before the first update."""
        self._validate(samples, names)

    def _validate(self, samples: Sequence[Sample], names: Sequence[str] | None = None) -> None:
        vocab = self.model.get_output_embeddings().weight.shape[0]
        ks: set[int] = set()
        for n, s in enumerate(samples):
            where = names[n] if names is not None else f"sample {n} ({s.sample_id})"
            if not s.prompt_ids:
                raise ValueError(f"{where}: prompt_ids is empty")
            bad = [t for t in (*s.prompt_ids, *s.response_ids) if t < 0 or t >= vocab]
            if bad:
                raise ValueError(
                    f"{where}: token id {bad[0]} outside the model's vocabulary (0..{vocab - 1})"
                )
            if not (math.isfinite(s.weight) and s.weight >= 0):
                raise ValueError(f"{where}: weight must be a finite number >= 0, got {s.weight}")
            for name in ("rollout_logprobs", "teacher_logprobs"):
                values = getattr(s, name) or []
                if not all(math.isfinite(v) for v in values):
                    raise ValueError(f"{where}: {name} contains a non-finite value (NaN or infinity)")
            if self._uses_topk(s):
                assert s.teacher_topk_ids is not None
                ks.update(len(row) for row in s.teacher_topk_ids)
                assert s.teacher_topk_logprobs is not None
                if not all(math.isfinite(v) for row in s.teacher_topk_logprobs for v in row):
                    raise ValueError(f"{where}: teacher_topk_logprobs contains a non-finite value")
                bad = [t for row in s.teacher_topk_ids for t in row if t < 0 or t >= vocab]
                if bad:
                    raise ValueError(
                        f"{where}: teacher_topk_ids holds {bad[0]}, outside the model's "
                        f"vocabulary (0..{vocab - 1}); was the teacher a different model?"
                    )
        if len(ks) > 1:
            raise ValueError(f"teacher top-K lists have different K within one update: {sorted(ks)}")

    # ------------------------------------------------------------------ the update

    def _recompute_if_long(self, batch: Sequence[Sample]) -> None:
        """Activation checkpointing on for a micro-batch of long sequences, off otherwise: kept
        activations grow with every token (about 1.7 GB per 1k tokens on the embedded model), so an
        agent's multi-thousand-token turns would not fit a CPU machine's memory; short chat turns
        keep the faster path. docs/training.md, "Memory"."""
        limit = self.tc.recompute_above_tokens
        longest = max(s.num_tokens for s in batch)
        want = longest > limit
        if want == self._recomputing:
            return
        with warnings.catch_warnings():
            # transformers 5 renames these; the old names warn, the new ones may be missing on 4.x
            warnings.filterwarnings("ignore", message=".*checkpointing.*", category=FutureWarning)
            if want:
                self.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                self.model.gradient_checkpointing_disable()
        self._recomputing = want

    def _micro_step(
        self,
        batch: Sequence[Sample],
        old_lp: Sequence[Tensor | None],
        ref_lp: Sequence[Tensor] | None,
        denom: float,
    ) -> tuple[Tensor, dict[str, float], int]:
        """Forward + loss of one micro-batch (backward is the caller's); returns loss, metrics, tokens.

        ``old_lp`` None for a row: the weights have not moved since the update began, so this very
        forward gives the row's proximal log-probs (detached)."""
        dev = next(self.model.parameters()).device
        bsz = len(batch)
        max_r = max(len(s.response_ids) for s in batch)

        def pad(rows: Sequence[Sequence[float]] | Sequence[Tensor]) -> Tensor:
            t = torch.zeros((bsz, max_r), dtype=torch.float32)
            for i, r in enumerate(rows):
                v = torch.as_tensor(r, dtype=torch.float32)
                t[i, : v.shape[0]] = v
            return t.to(dev)

        self._recompute_if_long(batch)
        topk_rows = [self._uses_topk(s) for s in batch]
        gather = None
        if any(topk_rows):
            gather = [
                torch.tensor(s.teacher_topk_ids, dtype=torch.long) if u else None
                for s, u in zip(batch, topk_rows, strict=True)
            ]
        stats = self.token_stats(
            self.model,
            [s.prompt_ids for s in batch],
            [s.response_ids for s in batch],
            chunk_size=self.tc.logprob_chunk_size,
            with_entropy=True,
            gather_ids=gather,
            pad_id=self.pad_id,
            stop_ids=self.stop_ids if self.tc.stop_kl_coef > 0 else None,
        )
        rollout = pad([s.rollout_logprobs for s in batch])
        proximal: list[Tensor] = [
            o if o is not None else stats.logprobs[i, : len(s.response_ids)].detach()
            for i, (o, s) in enumerate(zip(old_lp, batch, strict=True))
        ]
        mask = pad([s.loss_mask for s in batch]) * stats.mask
        # The RL scalar: the advantage (reward minus its group / running baseline) or the raw reward.
        rewards = torch.tensor([s.rl_signal or 0.0 for s in batch], dtype=torch.float32, device=dev)
        has_reward = torch.tensor(
            [s.rl_signal is not None and self.tc.binary_rl_weight > 0 for s in batch], device=dev
        )
        # The per-token OPD advantage applies to samples with teacher log-probs that are not trained
        # by top-K distillation instead (the top-K loss is that sample's OPD part).
        has_teacher = torch.tensor(
            [
                self.tc.opd_enabled and s.teacher_logprobs is not None and not u
                for s, u in zip(batch, topk_rows, strict=True)
            ],
            device=dev,
        )
        teacher = pad([s.teacher_logprobs if s.teacher_logprobs is not None else [] for s in batch])
        # OPD's per-token reward: teacher - rollout, or teacher - the student now ([training]
        # opd_reference; on a stale sample the first counts again what later updates already moved).
        prox = pad(proximal)
        student = prox if self.tc.opd_reference == "proximal" else rollout
        # which tokens repeat an earlier run of their response: found once, for both readers below
        again = self._repeated(batch) if self.tc.opd_repeats == "skip" or self.tc.repeat_penalty > 0 else None
        opd = opd_advantage(
            teacher,
            student,
            has_teacher,
            mask,
            opd_adv_clip=self.tc.opd_adv_clip,
            baseline=self.tc.opd_baseline,
            skip=self._opd_skipped(batch, pad, again),
        )
        rl_scale = 1.0
        if self.tc.term_balance == "balanced":
            found = balanced_rl_scale(rewards, has_reward, opd, has_teacher, mask)
            # A micro-batch with only one of the parts keeps the last factor: the mix stays even
            # whichever samples a micro-batch happens to hold.
            if found is not None:
                self.rl_scale = found
            rl_scale = self.rl_scale
        adv = compute_advantages(
            rewards,
            has_reward,
            opd,
            binary_rl_weight=self.tc.binary_rl_weight,
            opd_weight=self.tc.opd_weight,
            rl_scale=rl_scale,
        )
        if self.tc.repeat_penalty > 0 and again is not None:
            # Unlikelihood of loops: a token that says again what its response already said is
            # pushed down whatever the other parts say (docs/training.md, "Pushing a loop's tokens down").
            adv = adv - self.tc.repeat_penalty * pad([[float(r) for r in row] for row in again]) * mask
        teacher_topk = topk_mask = None
        if gather is not None:
            k = stats.gathered.shape[-1] if stats.gathered is not None else 0
            teacher_topk = torch.zeros((bsz, max_r, k), dtype=torch.float32)
            for i, (s, u) in enumerate(zip(batch, topk_rows, strict=True)):
                if u:
                    teacher_topk[i, : len(s.response_ids)] = torch.tensor(s.teacher_topk_logprobs)
            teacher_topk = teacher_topk.to(dev)
            topk_mask = (
                torch.tensor(topk_rows, dtype=torch.float32, device=dev).unsqueeze(-1).expand(-1, max_r)
            )
        ref_logp = ref_stop = None
        if ref_lp is not None and self.tc.stop_kl_coef > 0:  # [R, 2]: with the stop log-prob (_score)
            ref_logp, ref_stop = pad([r[:, 0] for r in ref_lp]), pad([r[:, 1] for r in ref_lp])
        elif ref_lp is not None:
            ref_logp = pad(ref_lp)
        behaviour_weight = None
        denominator = rollout
        if self.tc.off_policy_correction == "decoupled":
            # Decoupled PPO (eq. 2'): clip against the policy this update started from (old_lp, scored
            # in the no-grad pass), and correct the version gap between that proximal policy and
            # the one that sampled the tokens with a truncated importance weight.
            denominator = prox
            log_w = (denominator - rollout).clamp(max=math.log(self.tc.behaviour_weight_cap))
            behaviour_weight = torch.exp(log_w)
        out = ppo_loss(
            stats.logprobs,
            denominator,
            adv,
            mask,
            clip_low=self.tc.clip_ratio,
            clip_high=self.tc.eps_high,
            sample_weight=torch.tensor([s.weight for s in batch], dtype=torch.float32, device=dev),
            logp_ref=ref_logp,
            kl_coef=self.tc.kl_coef,
            entropy=stats.entropy,
            entropy_coef=self.tc.entropy_coef,
            student_topk=stats.gathered,
            teacher_topk=teacher_topk,
            topk_mask=topk_mask,
            topk_coef=self.tc.opd_weight,
            denom=denom,
            behaviour_weight=behaviour_weight,
            stop_logp=stats.stop_logprobs,
            stop_logp_ref=ref_stop,
            stop_kl_coef=self.tc.stop_kl_coef,
        )
        out.metrics.setdefault("behaviour_weight_mean", 1.0)  # no correction: every token weighs 1
        gap = (prox - rollout).abs()
        out.metrics["logprob_gap"] = float((gap * mask).sum() / mask.sum().clamp(min=1))
        return out.loss, out.metrics, out.num_tokens

    def train_update(
        self, samples: list[Sample], interrupted: Callable[[], bool] | None = None
    ) -> dict[str, float]:
        """One PPO update on ``samples`` (normally ``batch_size`` of them); returns its metrics.

        ``interrupted``: asked before each micro-batch; once it says True the update stops there,
        takes back the optimiser steps it applied and raises :class:`UpdateInterrupted`. Taking back
        needs a copy of the trainable weights and optimiser state, made before the first step only
        when more steps follow: with LoRA that is the adapter's size; with full weights (``lora =
        false``) it would double the trainer's memory, so an update that has stepped is finished
        instead. One process only: across processes (FSDP) every rank must run the same steps.

        Metrics: loss, pg_loss, kl, clip_frac, ppo_kl, entropy, topk_kl, stop_kl, grad_norm, tokens_per_s,
        logprob_gap (mean |trainer log-prob before the update - rollout log-prob| over trained
        tokens), num_tokens (trained tokens), optimizer_steps, skipped_steps (mini-batches whose loss
        or gradient was not finite: their step is dropped, never applied), num_processes. A batch
        with no trained token (all loss masks zero) changes nothing and reports zeros.

        The same loop serves the multi-process trainer: which rows this process trains
        (:meth:`_my_rows`), extra micro-steps that keep collectives aligned (:meth:`_pad_micro_steps`),
        the backward scale (:meth:`_backward`), clipping (:meth:`_clip_grads`) and agreement across
        processes (:meth:`_all_ok`, :meth:`_sum_over_processes`) are its hooks.
        """
        stop = interrupted if self.world == 1 else None
        self._stoppable = True  # whether a stop request may end the update now (see _stop_in_passes)
        try:
            with self._stop_in_passes(stop):
                return self._train_update(samples, stop)
        finally:
            self._stoppable = False

    @contextlib.contextmanager
    def _stop_in_passes(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """Ask ``stop`` at every decoder layer, forward and backward, while an update runs: a pass
        over a multi-thousand-token agent turn takes minutes on a busy CPU, and a stop request must
        not wait for it (the launcher kills a trainer that takes two). What the update applied is
        taken back as for a stop between micro-batches; asked only while that is possible."""
        if stop is None:
            yield
            return

        last = time.monotonic()

        def check(*_: object) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < self.stop_check_interval_s:  # the boundaries ask too; a pass asks seldom
                return
            last = now
            if self._stoppable and stop():
                raise UpdateInterrupted("stopped inside a pass")

        layers = [m for m in self.model.modules() if type(m).__name__.endswith("DecoderLayer")]
        handles = [layer.register_forward_pre_hook(check) for layer in layers]
        handles += [layer.register_full_backward_pre_hook(check) for layer in layers]
        try:
            with warnings.catch_warnings():
                # torch notes that the first layer's inputs need no gradient (LoRA freezes the
                # embeddings): true, and the hook only asks to stop, so the note is noise
                warnings.filterwarnings(
                    "ignore", message="Full backward hook is firing", category=UserWarning
                )
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _train_update(self, samples: list[Sample], stop: Callable[[], bool] | None) -> dict[str, float]:
        """:meth:`train_update`'s body; ``stop``: its ``interrupted`` when it can be honoured."""
        t0 = time.perf_counter()
        active = self._begin_update(samples)
        keys = PER_STEP_METRICS + TOKEN_METRICS
        n_per_step = len(PER_STEP_METRICS)
        # Sums over applied optimiser steps: per-step parts (already divided by the mini-batch's token
        # count), token-weighted parts, then trained tokens. One tensor, so one all-reduce at the end.
        totals = torch.zeros(len(keys) + 1, dtype=torch.float64)
        skipped = 0
        grad_norms: list[float] = []
        undo: _Undo | None = None
        applied = 0  # optimiser steps of this update so far
        if active:
            mb = self.tc.mini_batch_size
            if stop is not None and stop():
                raise UpdateInterrupted("stopped before the update began")
            self._take_threads()
            old_lp, ref_lp = self._score_old_and_ref(active, first_mini_batch=min(mb, len(active)))
            lengths = [s.num_tokens for s in active]
            for start in range(0, len(active), mb):
                idx = list(range(start, min(start + mb, len(active))))
                # The whole mini-batch's trained tokens: every process divides by the same number.
                denom = float(sum(sum(1 for m in active[i].loss_mask if m) for i in idx))
                mine = self._my_rows(idx, lengths)
                micros = micro_batches([lengths[i] for i in mine], self.tc.micro_batch_tokens) if mine else []
                self.optimizer.zero_grad(set_to_none=True)
                step = torch.zeros_like(totals)
                finite = True
                for micro in micros:
                    if stop is not None and (applied == 0 or undo is not None) and stop():
                        self._take_back(undo)
                        raise UpdateInterrupted(
                            f"stopped in mini-batch {start // mb}; {applied} step(s) taken back"
                        )
                    rows = [mine[j] for j in micro]
                    self._take_threads()
                    try:  # a stop inside the passes (_stop_in_passes): taken back as above
                        loss, m, n_tok = self._micro_step(
                            [active[i] for i in rows],
                            [old_lp[i] for i in rows],
                            [ref_lp[i] for i in rows] if ref_lp is not None else None,
                            denom,
                        )
                        # A non-finite loss is noted, not skipped here: under FSDP every process must
                        # run the same backward passes; the whole step is dropped below instead.
                        finite = finite and bool(torch.isfinite(loss.detach()))
                        self._backward(loss)
                    except UpdateInterrupted:
                        self._take_back(undo)
                        raise UpdateInterrupted(
                            f"stopped inside mini-batch {start // mb}; {applied} step(s) taken back"
                        ) from None
                    m["loss"] = float(loss.detach())
                    for k, key in enumerate(keys):
                        step[k] += m.get(key, 0.0) * (n_tok if k >= n_per_step else 1)
                    step[-1] += n_tok
                for _ in range(self._pad_micro_steps(len(micros))):  # aligns collectives, adds no gradient
                    loss, _m, _n = self._micro_step(
                        active[:1], old_lp[:1], ref_lp[:1] if ref_lp is not None else None, 1.0
                    )
                    (loss * 0.0).backward()
                norm = self._clip_grads()
                if not self._all_ok(finite and math.isfinite(norm)):
                    # One bad step must not corrupt the weights or the AdamW moments: drop it, say so.
                    if self.rank == 0:
                        print(
                            f"[train] warning: non-finite {'loss' if not finite else 'gradient'} in "
                            f"mini-batch {start // mb}; optimiser step skipped",
                            flush=True,
                        )
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                grad_norms.append(norm)
                if stop is not None and applied == 0 and self.tc.lora and start + mb < len(active):
                    undo = self._undo_point()
                self.optimizer.step()
                applied += 1
                self._stoppable = undo is not None  # an applied step only an undo point can take back
                totals += step
            self.optimizer.zero_grad(set_to_none=True)
            if grad_norms:
                self.policy_version += 1
        totals = self._sum_over_processes(totals)
        sums = {key: float(totals[k]) for k, key in enumerate(keys)}
        return self._end_update(samples, active, t0, sums, float(totals[-1]), grad_norms, skipped)

    def _opd_skipped(
        self,
        batch: Sequence[Sample],
        pad: Callable[[list[list[float]]], Tensor],
        repeated: list[list[bool]] | None,
    ) -> Tensor | None:
        """``[B, R]``: 1 where a token gets no OPD advantage (``opd_stop_token`` / ``opd_repeats`` =
        ``"skip"``), else 0; None when neither skips anything. ``repeated``: :meth:`_repeated` of
        ``batch``, found by the caller whenever ``opd_repeats = "skip"``."""
        stops, repeats = self.tc.opd_stop_token == "skip", self.tc.opd_repeats == "skip"
        if not (stops or repeats):
            return None
        again = (
            repeated if repeats and repeated is not None else [[False] * len(s.response_ids) for s in batch]
        )
        return pad(
            [
                [float((stops and t in self.stop_ids) or r) for t, r in zip(s.response_ids, a, strict=True)]
                for s, a in zip(batch, again, strict=True)
            ]
        )

    @staticmethod
    def _repeated(batch: Sequence[Sample]) -> list[list[bool]]:
        """Per sample and response token: whether it repeats an earlier run of ``REPEAT_WINDOW``
        tokens of the same response (:func:`~openclaw_rl.runtime.metrics.repeated_items`)."""
        return [repeated_items(s.response_ids, REPEAT_WINDOW) for s in batch]

    def _undo_point(self) -> _Undo:
        """A copy of what the coming optimiser steps change (see :meth:`train_update`)."""
        return _Undo(
            params=[p.detach().clone() for p in self.params],
            optimizer_state=copy.deepcopy(self.optimizer.state_dict()),
        )

    def _take_back(self, undo: _Undo | None) -> None:
        """Restore the weights and optimiser state of ``undo`` (None: nothing was applied)."""
        self.optimizer.zero_grad(set_to_none=True)
        if undo is None:
            return
        with torch.no_grad():
            for p, saved in zip(self.params, undo.params, strict=True):
                p.copy_(saved)
        self.optimizer.load_state_dict(undo.optimizer_state)

    def _take_threads(self) -> None:
        """Use as many torch threads for the next pass as :attr:`thread_budget` allows now."""
        if self.thread_budget is None:
            return
        n = self.thread_budget()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)

    # -- hooks of the update loop; the single-process versions (FSDPTrainer overrides them) --

    def _my_rows(self, idx: list[int], lengths: Sequence[int]) -> list[int]:
        """The rows of a mini-batch this process trains: all of them."""
        return idx

    def _pad_micro_steps(self, n_micro: int) -> int:
        """Extra no-gradient micro-steps to run after this process's own: none."""
        return 0

    def _backward(self, loss: Tensor) -> None:
        loss.backward()

    def _clip_grads(self) -> float:
        """Clip the gradients to ``max_grad_norm``; returns their norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.params, self.tc.max_grad_norm))

    def _all_ok(self, ok: bool) -> bool:
        """Whether every process may apply this step."""
        return ok

    def _sum_over_processes(self, totals: Tensor) -> Tensor:
        return totals

    def _begin_update(self, samples: list[Sample]) -> list[Sample]:
        """Validate a batch; return the samples with at least one trained token."""
        if not samples:
            raise ValueError("train_update needs at least one sample")
        self._validate(samples)
        return [s for s in samples if any(s.loss_mask)]

    def _score_old_and_ref(
        self, active: list[Sample], first_mini_batch: int = 0
    ) -> tuple[list[Tensor | None], list[Tensor] | None]:
        """No-grad log-probs under the current (proximal) and, when :attr:`needs_reference`, the
        reference policy (with its stop log-probabilities when ``stop_kl_coef > 0``), then switch the
        model to training mode. The first ``first_mini_batch`` samples are
        not scored (None): their optimiser step starts from the proximal weights, so its own
        forward gives their proximal log-probs (one pass fewer for them: the same numbers)."""
        rest = active[first_mini_batch:]
        old_lp: list[Tensor | None] = [None] * first_mini_batch
        try:  # training mode again however the scoring ends (a stop inside it: _stop_in_passes)
            old_lp += self._score(self.model, rest) if rest else []
            ref_lp: list[Tensor] | None = None
            if self.needs_reference:
                with self._reference() as ref:
                    ref_lp = self._score(ref, active, stop=self.tc.stop_kl_coef > 0)
        finally:
            self.model.train()
        return old_lp, ref_lp

    def _end_update(
        self,
        samples: list[Sample],
        active: list[Sample],
        t0: float,
        sums: dict[str, float],
        n_trained: float,
        grad_norms: list[float],
        skipped: int,
    ) -> dict[str, float]:
        """Turn an update's sums into its metrics, count the step, log it, checkpoint on interval."""
        n_steps = len(grad_norms)
        elapsed = time.perf_counter() - t0
        metrics = {key: sums.get(key, 0.0) / max(n_steps, 1) for key in PER_STEP_METRICS}
        metrics.update({key: sums.get(key, 0.0) / max(n_trained, 1) for key in TOKEN_METRICS})
        metrics["grad_norm"] = sum(grad_norms) / max(n_steps, 1)
        metrics["tokens_per_s"] = sum(s.num_tokens for s in active) / elapsed if elapsed > 0 else 0.0
        metrics["num_tokens"] = float(n_trained)
        metrics["optimizer_steps"] = float(n_steps)
        metrics["num_samples"] = float(len(samples))
        self.step += 1
        metrics["step"] = float(self.step)
        # updates that changed the weights: not the published policy_version that serving, eval rows
        # and status name (a version is published every weight_sync_interval updates)
        metrics["weight_version"] = float(self.policy_version)
        metrics["skipped_steps"] = float(skipped)
        metrics["num_processes"] = float(self.world)
        metrics["rl_scale"] = self.rl_scale
        # Responses that ended by themselves rather than at max_tokens: a policy that has learned not
        # to stop (and so loops under greedy decoding) shows here first.
        metrics["stop_frac"] = sum(s.ended_by_itself(self.stop_ids) for s in samples) / max(1, len(samples))
        if self.rank == 0:
            log_update(metrics)
        if self.step % self.tc.checkpoint_interval == 0:
            self.save_checkpoint()
        return metrics

    # ------------------------------------------------------------------ export / checkpoints

    def _policy_meta(self, version: int) -> dict[str, Any]:
        """What ``openclaw_policy.json`` says about an exported policy (both trainers write it)."""
        return {
            "format": "openclaw-rl-policy/1",
            "kind": "lora" if self.tc.lora else "full",
            "version": version,
            "step": self.step,
            "base_model": str(self.base_dir),
            "run_name": self.cfg.global_.run_name,
        }

    def _checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint's ``trainer_state.json`` holds (FSDPTrainer adds its backend and shard count)."""
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "lora": self.tc.lora,
            "base_model": str(self.base_dir),
            "run_name": self.cfg.global_.run_name,
            "user": self.user,
            "saved_at": time.time(),
        }

    def _policy_weights(self) -> dict[str, Tensor] | None:
        """The weights an export writes; None: the model's own. FSDPTrainer gathers its shards here."""
        return None

    def _write_policy(self, directory: Path, version: int) -> None:
        """Write the loadable policy into ``directory`` (created if missing).

        Every process calls it (gathering the weights may be a collective); rank 0 alone writes."""
        weights = self._policy_weights()
        if self.rank != 0:
            return
        directory.mkdir(parents=True, exist_ok=True)
        extra: dict[str, Any] = {} if weights is None else {"state_dict": weights}
        self.model.save_pretrained(directory, safe_serialization=True, **extra)
        if not self.tc.lora:
            self.tokenizer.save_pretrained(directory)
        meta = self._policy_meta(version)
        (directory / POLICY_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    def export_policy(self, directory: Path, version: int) -> Path:
        """Write policy ``version`` to ``directory/v{version:06d}`` atomically and return that path.

        LoRA: a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``,
        ``base_model_name_or_path`` pointing at the base model directory). Full training: a Hugging
        Face model directory (``config.json`` + ``model.safetensors`` + tokenizer). Both carry
        ``openclaw_policy.json`` = {format, kind, version, step, base_model, run_name}. Re-exporting
        an existing version replaces it (in one atomic swap where the filesystem allows).
        """
        return publish(Path(directory), f"v{version:06d}", lambda tmp: self._write_policy(tmp, version))

    def save_checkpoint(self) -> Path:
        """Save weights (adapter or full), optimizer state, step and version; returns the directory."""
        pub = Publication(self.checkpoint_root, checkpoint_name(self.step))
        tmp = pub.begin()
        try:
            self._write_policy(tmp / POLICY_SUBDIR, self.policy_version)
            torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        except BaseException:  # a full disk, a kill: the half-written copy must not take more room
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = self._publish_checkpoint(pub)
        print(f"[train] checkpoint saved: {final}", flush=True)
        return final

    def _publish_checkpoint(self, pub: Publication) -> Path:
        """The publishing process, once the checkpoint's files are in ``pub.tmp``: write the state file
        (last, it marks the directory complete), put it in place, move ``latest``, prune."""
        (pub.tmp / STATE_FILE).write_text(json.dumps(self._checkpoint_state(), indent=2), encoding="utf-8")
        final = pub.commit(pointer=self.checkpoint_root / POINTER_FILE)
        self._prune(keep=pub.name)
        return final

    def _prune(self, keep: str) -> None:
        """Keep the newest KEEP_CHECKPOINTS complete checkpoints (never the one just written)."""
        prune_checkpoints(self.checkpoint_root, keep, KEEP_CHECKPOINTS)

    def save_checkpoint_once(self) -> None:
        """Save a checkpoint of this step, unless the newest one already is of it (an update saves
        one every ``checkpoint_interval``): the end of a run, or a per-user update, writes it once."""
        latest = self.latest_checkpoint()
        if latest is None or latest.name != checkpoint_name(self.step):
            self.save_checkpoint()

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint the pointer names, or the newest complete one if the pointer is missing."""
        return latest_checkpoint(self.checkpoint_root)

    def resume(self) -> bool:
        """Load the latest checkpoint (weights, optimizer, step, version); False when there is none,
        :class:`CheckpointError` (one line naming the checkpoint and the file) when it cannot be read."""
        ckpt = self.latest_checkpoint()
        if ckpt is None:
            return False
        try:
            self._load_checkpoint(ckpt)
        except CheckpointError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError, pickle.UnpicklingError, SafetensorError) as exc:
            # safetensors' header errors, torch.load's refusals, a truncated JSON: what each says is
            # the detail; the checkpoint is the news.
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"checkpoint {ckpt} cannot be resumed ({type(exc).__name__}: {reason}); "
                "move it aside to resume from the one before, or start without --resume"
            ) from None
        log.info("[train] resumed from %s (step=%d, policy_version=%d)", ckpt, self.step, self.policy_version)
        return True

    def _load_checkpoint(self, ckpt: Path) -> None:
        from safetensors.torch import load_file

        state = json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))
        mismatch = config_mismatch(ckpt, self.tc)
        if mismatch:
            raise CheckpointError(mismatch)
        policy = ckpt / POLICY_SUBDIR
        if self.tc.lora:
            from peft import set_peft_model_state_dict

            adapter = load_file(str(policy / "adapter_model.safetensors"))
            result = set_peft_model_state_dict(self.model, adapter)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(
                    f"checkpoint {ckpt}: adapter does not match the model "
                    f"(e.g. {unexpected[0]}); were lora_rank/target_modules changed?"
                )
        else:
            weights: dict[str, Any] = {}
            for f in sorted(policy.glob("*.safetensors")):
                weights.update(load_file(str(f)))
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            if unexpected or set(missing) - tied:
                raise ValueError(
                    f"checkpoint {ckpt}: weights do not match the model "
                    f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})"
                )
        self.optimizer.load_state_dict(
            torch.load(ckpt / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        )
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
