"""The local LLM judge: a causal LM in this process (``[prm_service] backend = "local"``).

Evaluative votes do not generate free text. The judge prompt asks for one answer word
(``GOOD`` / ``BAD`` / ``UNCLEAR``); one forward pass gives the model's next-token probabilities of
those words' first tokens, restricted to ``reward_space`` and renormalised; ``vote_count``
independent votes are then sampled from that distribution at ``temperature``. One forward pass
instead of ``vote_count`` generations keeps a CPU judge affordable, and the distribution is kept in
every vote's ``raw`` text.

Hint votes do generate (the hint is text): ``vote_count`` samples of up to ``HINT_MAX_TOKENS`` tokens,
parsed for the ``VERDICT`` line and the marked hint.

Measured (bench/judge.py): the embedded SmolLM2-135M judges at about its base rate — prefer the
``minilm`` backend on the embedded setup, and this one with a larger local model.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from openclaw_rl.config import EMBEDDED_MODEL, Config
from openclaw_rl.judge.base import Judge
from openclaw_rl.judge.prompts import ANSWER_WORDS, evaluative_messages, hint_messages, parse_hint_vote
from openclaw_rl.judge.teacher import model_lock, shared_model
from openclaw_rl.judge.voting import restrict, sample_from_distribution
from openclaw_rl.runtime.chat_format import prompt_ids
from openclaw_rl.types import NextState, Vote

HINT_MAX_TOKENS = 96
#: Judge prompts are truncated from the left of the pair text beyond this many tokens.
MAX_PROMPT_TOKENS = 1536


def judge_model_name(cfg: Config) -> str:
    """``[prm_service] model``, or the policy's model when the judge model was left at its default."""
    prm = cfg.prm_service
    if "model" not in prm.model_fields_set and prm.model == EMBEDDED_MODEL:
        return cfg.policy_service.model
    return prm.model


class LocalJudge(Judge):
    """Scores from answer-word probabilities; hints from sampled generations."""

    name = "local"

    def __init__(self, cfg: Config, teacher: object | None = None, model: Any = None, tokenizer: Any = None):
        super().__init__(cfg, teacher)
        if model is None or tokenizer is None:
            model, tokenizer = shared_model(
                judge_model_name(cfg), device=cfg.policy_service.device, dtype=cfg.policy_service.dtype
            )
        self.model, self.tokenizer = model, tokenizer
        self.rng = random.Random(cfg.global_.seed)
        self.answer_ids = self._answer_token_ids()

    def _answer_token_ids(self) -> dict[int, int]:
        ids: dict[int, int] = {}
        for score, word in ANSWER_WORDS.items():
            toks = self.tokenizer.encode(word, add_special_tokens=False)
            if not toks:
                raise ValueError(f"tokenizer produced no tokens for answer word {word!r}")
            ids[score] = toks[0]
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"answer words {ANSWER_WORDS} share a first token under this tokenizer: {ids}")
        return ids

    def _prompt(self, messages: list[dict[str, str]]) -> list[int]:
        ids = prompt_ids(self.tokenizer, messages)
        # Keep the end (the answer instruction sits in the system prompt at the start, but the
        # generation prompt and the most recent text are at the end); trim the middle if too long.
        if len(ids) > MAX_PROMPT_TOKENS:
            half = MAX_PROMPT_TOKENS // 2
            ids = ids[:half] + ids[-half:]
        return ids

    def answer_distribution(self, response: str, next_state: NextState) -> dict[int, float]:
        """Blocking: probabilities of the allowed scores after the judge prompt."""
        import torch

        ids = self._prompt(
            evaluative_messages(response, next_state, short_answer=True, reward_space=self.prm.reward_space)
        )
        with model_lock, torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids], device=self.model.device)).logits[0, -1].float()
        probs = torch.softmax(logits, dim=-1)
        raw = {score: float(probs[tok]) for score, tok in self.answer_ids.items()}
        return restrict(raw, self.prm.reward_space)

    async def score_votes(self, response: str, next_state: NextState) -> list[Vote]:
        dist = await asyncio.to_thread(self.answer_distribution, response, next_state)
        return sample_from_distribution(
            dist, self.prm.vote_count, self.prm.temperature, self.rng, describe="answer-word probabilities: "
        )

    def _generate(self, messages: list[dict[str, str]], n: int) -> list[str]:
        import torch

        ids = torch.tensor([self._prompt(messages)], device=self.model.device)
        temperature = self.prm.temperature
        sample = temperature > 0
        with model_lock, torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=HINT_MAX_TOKENS,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=None,
                top_k=None,
                # Greedy decoding gives one answer; the n votes are then that answer n times.
                num_return_sequences=n if sample else 1,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        texts = [self.tokenizer.decode(seq[ids.shape[1] :], skip_special_tokens=True) for seq in out]
        return texts if sample else texts * n

    async def hint_votes(self, response: str, next_state: NextState) -> list[Vote]:
        replies = await asyncio.to_thread(
            self._generate, hint_messages(response, next_state), self.prm.vote_count
        )
        votes = []
        for r in replies:
            verdict, hint = parse_hint_vote(r)
            votes.append(Vote(raw=r, score=verdict, hint=hint))
        return votes
