"""Teacher log-probs for hindsight-guided on-policy distillation.

The hint is appended to the last user message of the turn's prompt under :data:`HINT_HEADING`
(or to its system message, ``[prm_service] hint_placement = "system"``);
the prompt is rendered as the serving engine renders it (:mod:`openclaw_rl.runtime.chat_format`: the
same chat template, the turn's tools, earlier tool calls as the policy read them), and
the ORIGINAL ``turn.response_ids`` — the tokens the policy actually sampled — are scored under
that enhanced prompt. The response is never re-tokenised from text: re-tokenising would shift the
teacher's log-probs out of alignment with the student's ``response_logprobs``.

Two teachers:

* :class:`LocalTeacher` — a causal LM in this process (by default the policy's frozen base model,
  ``cfg.policy_service.model``), scored with the trainer's memory-lean
  :func:`openclaw_rl.runtime.logprobs.sequence_logprobs`.
* :class:`ApiTeacher` — an OpenAI-compatible ``/v1/completions`` endpoint with prompt log-prob
  support (``echo=True`` + ``logprobs``, as vLLM and SGLang offer). Chat-only APIs have none; the
  teacher then fails with :class:`TeacherUnavailable`, whose message says OPD needs a local or
  log-prob-capable teacher.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any

from openclaw_rl.config import HintPlacement
from openclaw_rl.judge.errors import JudgeUnavailable, TeacherUnavailable
from openclaw_rl.judge.prompts import HINT_HEADING
from openclaw_rl.runtime.chat_format import message_text, prompt_ids
from openclaw_rl.types import Turn

log = logging.getLogger("openclaw_rl.judge")

_models: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_models_lock = threading.Lock()
#: One forward pass at a time per process: CPU torch already uses every allowed thread.
model_lock = threading.Lock()


def shared_model(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """``(model, tokenizer)`` loaded once per process, so a local judge and the teacher that name
    the same model share one copy."""
    from openclaw_rl.runtime.models import load_model

    key = (name, device, dtype)
    with _models_lock:
        if key not in _models:
            _models[key] = load_model(name, device=device, dtype=dtype)
        return _models[key]


@dataclass
class TeacherOutput:
    """Teacher log-probs of one turn's response tokens under the hint-enhanced prompt."""

    logprobs: list[float]
    topk_ids: list[list[int]] | None
    topk_logprobs: list[list[float]] | None
    context_len: int  # prompt tokens added by the hint


def hinted_messages(
    messages: list[dict[str, Any]], hint: str, placement: HintPlacement = "user"
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``hint`` under the heading, where ``placement`` says.

    ``"user"``: appended to the last user message; a prompt with no user message gets a new user
    message holding only the hint (the teacher still sees the hint right before the response it
    scores). ``"system"``: appended to the leading system message, or made the system message when
    there is none, in place of the default a chat template would add ("You are a helpful AI
    assistant ..."; docs/judge.md, "Where the teacher reads the hint").
    """
    out = copy.deepcopy(messages)
    block = f"{HINT_HEADING}\n{hint.strip()}"
    if placement == "system":
        if out and out[0].get("role") == "system":
            out[0]["content"] = message_text(out[0].get("content")) + "\n\n" + block
        else:
            out.insert(0, {"role": "system", "content": block})
        return out
    for msg in reversed(out):
        if msg.get("role") == "user":
            msg["content"] = message_text(msg.get("content")) + "\n\n" + block
            return out
    at = len(out) - 1 if out and out[-1].get("role") == "assistant" else len(out)  # before a prefill
    out.insert(at, {"role": "user", "content": block})
    return out


_mismatch_warned = False


def hinted_prompt(
    tokenizer: Any, turn: Turn, hint: str, placement: HintPlacement = "user"
) -> tuple[list[int], int]:
    """``(enhanced prompt ids, tokens added by the hint)`` for ``turn``.

    Without the hint the teacher's prompt is the policy's own (``turn.prompt_ids``) when the turn was
    served here or by a vLLM / SGLang engine (both read prompts rendered by the same module); a
    difference (a hosted API renders its own) is said once, since every OPD advantage then carries it."""
    global _mismatch_warned
    base = prompt_ids(tokenizer, turn.messages, turn.tools, turn.continues_final)
    if base != turn.prompt_ids and turn.prompt_ids and not _mismatch_warned:
        _mismatch_warned = True
        log.warning(
            "[opd] the teacher's prompt for turn %s (%d tokens) is not the one the policy read (%d tokens): "
            "the policy was served by an engine that renders chats its own way, so the OPD part also "
            'carries that difference (docs/training.md, "The teacher reads what the policy read")',
            turn.key,
            len(base),
            len(turn.prompt_ids),
        )
    hinted = hinted_messages(turn.messages, hint, placement)
    enhanced = prompt_ids(tokenizer, hinted, turn.tools, turn.continues_final)
    return enhanced, max(0, len(enhanced) - len(base))


class LocalTeacher:
    """Scores response tokens with a causal LM in this process."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        topk: int = 0,
        chunk_size: int = 256,
        placement: HintPlacement = "user",
    ):
        self.model, self.tokenizer, self.topk, self.chunk_size = model, tokenizer, topk, chunk_size
        self.placement = placement

    def score_sync(self, turn: Turn, hint: str) -> TeacherOutput:
        """Blocking: one chunked forward pass over enhanced prompt + original response ids."""
        from openclaw_rl.runtime.logprobs import sequence_logprobs

        if not turn.response_ids:
            raise ValueError(f"turn {turn.key} has no response tokens to score")
        prompt, added = hinted_prompt(self.tokenizer, turn, hint, self.placement)
        with model_lock:
            lp, top_ids, top_lp = sequence_logprobs(
                self.model, prompt, turn.response_ids, topk=self.topk, chunk_size=self.chunk_size
            )
        return TeacherOutput(
            logprobs=[float(x) for x in lp.tolist()],
            topk_ids=top_ids.tolist() if top_ids is not None else None,
            topk_logprobs=top_lp.tolist() if top_lp is not None else None,
            context_len=added,
        )

    async def score(self, turn: Turn, hint: str) -> TeacherOutput:
        """Async wrapper: the forward pass runs in a worker thread, off the event loop."""
        return await asyncio.to_thread(self.score_sync, turn, hint)


class ApiTeacher:
    """Prompt log-probs from an OpenAI-compatible ``/v1/completions`` endpoint (vLLM / SGLang style).

    The token ids are sent as the prompt (a list of ints) with ``echo=True``, so the server scores
    exactly the ids the policy sampled; the chat template is rendered here with the policy's
    tokenizer.
    """

    def __init__(
        self, client: Any, model: str, tokenizer: Any, topk: int = 0, placement: HintPlacement = "user"
    ):
        self.client, self.model, self.tokenizer, self.topk = client, model, tokenizer, topk
        self.placement = placement

    async def score(self, turn: Turn, hint: str) -> TeacherOutput:
        import openai

        prompt, added = hinted_prompt(self.tokenizer, turn, hint, self.placement)
        n_p, n_r = len(prompt), len(turn.response_ids)
        try:
            resp = await self.client.completions.create(
                model=self.model,
                prompt=prompt + list(turn.response_ids),
                echo=True,
                max_tokens=1,
                logprobs=max(1, self.topk),
                temperature=0.0,
            )
        except openai.BadRequestError as exc:
            raise TeacherUnavailable(
                f"the API at {self.client.base_url} refused a prompt log-prob request ({exc.status_code}); "
                'OPD needs a local teacher ([prm_service] teacher = "policy_base") or an endpoint with '
                "prompt log-prob support (echo + logprobs on /v1/completions)"
            ) from None
        except openai.APIError as exc:  # an outage, not a missing feature: judge this turn again later
            from openclaw_rl.judge.api import describe_failure

            raise JudgeUnavailable(
                "teacher: "
                + describe_failure(
                    exc,
                    f"{self.client.base_url}completions",
                    self.client.max_retries,
                    key=self.client.api_key,
                )
            ) from None
        lp = resp.choices[0].logprobs if resp.choices else None
        token_lps = list(getattr(lp, "token_logprobs", None) or [])
        if len(token_lps) < n_p + n_r:
            raise TeacherUnavailable(
                f"the API at {self.client.base_url} returned no prompt log-probs ({len(token_lps)} of "
                f"{n_p + n_r} positions); OPD needs a local or log-prob-capable teacher"
            )
        resp_lps = [float(x) for x in token_lps[n_p : n_p + n_r]]
        top_ids = top_lps = None
        if self.topk > 0:
            tops = (getattr(lp, "top_logprobs", None) or [])[n_p : n_p + n_r]
            if len(tops) == n_r and all(tops):
                # The API keys top-K by token *text*; map back to ids with the same tokenizer.
                top_ids, top_lps = [], []
                for pos in tops:
                    ranked = sorted(pos.items(), key=lambda kv: -kv[1])[: self.topk]
                    top_ids.append([self.tokenizer.convert_tokens_to_ids(t) for t, _ in ranked])
                    top_lps.append([float(v) for _, v in ranked])
        return TeacherOutput(logprobs=resp_lps, topk_ids=top_ids, topk_logprobs=top_lps, context_len=added)
