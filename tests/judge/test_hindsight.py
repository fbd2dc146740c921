"""A hint carries how to answer, not the answer: ``[prm_service] hint_facts = "mask"``."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_rl.config import Config, PrmServiceConfig, TrainingConfig
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.hindsight import figures, mask_unseen_figures, seen_text, with_earlier_hints
from openclaw_rl.types import NextState, Turn

PROBLEM = "Lily buys 12 apples at $1.50 each and 3 pears. How much does she spend?"


def test_a_figure_the_policy_never_saw_becomes_a_placeholder_and_the_rest_of_the_hint_stays():
    seen = seen_text([{"role": "user", "content": PROBLEM}], "i got 21 dollars")
    assert figures(seen) == {12.0, 1.5, 3.0, 21.0}
    assert mask_unseen_figures("Mention that the correct answer is 1,800.", seen) == (
        "Mention that the correct answer is ..."
    )
    # figures the conversation shows are not hindsight, whatever their spelling
    assert mask_unseen_figures("You used 12 apples at 1.50, then 21.0 is wrong", seen) == (
        "You used 12 apples at 1.50, then 21.0 is wrong"
    )
    # a comma after a figure is punctuation, not part of it; words and names are never touched
    assert mask_unseen_figures("Tell Lily the answer should be 18, say so.", seen) == (
        "Tell Lily the answer should be ..., say so."
    )
    assert (
        mask_unseen_figures('End with "Answer: 42" like that.', seen) == 'End with "Answer: ..." like that.'
    )
    assert mask_unseen_figures("No numbers here.", seen) == "No numbers here."


def test_earlier_hints_come_first_oldest_first_with_their_own_problems_figures_masked():
    seen = seen_text([{"role": "user", "content": PROBLEM}], "i got 21 dollars")
    earlier = ["End with the answer, like 'so the answer is 800'.", "No bold please.", "  "]  # newest first
    assert with_earlier_hints("Say it like I would, 12 apples and all.", earlier, seen) == (
        "- No bold please.\n- End with the answer, like 'so the answer is ...'.\n"
        "- Say it like I would, 12 apples and all."
    )
    # this turn's hint is never masked here (that is hint_facts' job) nor listed twice
    assert with_earlier_hints("no bold  PLEASE.", ["No bold please."], seen) == "no bold  PLEASE."
    assert with_earlier_hints("Mention 800.", [], seen) == "Mention 800."


def test_seen_text_reads_content_parts_as_the_teacher_does():
    parts = [{"role": "user", "content": [{"type": "text", "text": "there are 7 cats"}]}]
    assert figures(seen_text(parts, "")) == {7.0}


def _turn(reply: str, role: str = "user") -> Turn:
    return Turn(
        session_id="s",
        turn_index=0,
        messages=[{"role": "user", "content": PROBLEM}],
        prompt_ids=[1, 2],
        response_ids=[3],
        response_logprobs=[-1.0],
        response_text="Great question! The total is 21.",
        next_state=NextState(role=role, content=reply),
    )


def _hint(hint_facts: str, turn: Turn) -> str | None:
    cfg = Config(
        prm_service=PrmServiceConfig(backend="minilm", temperature=0.0, vote_count=3, hint_facts=hint_facts),
        training=TrainingConfig(opd_enabled=False),
    )
    result = asyncio.run(make_judge(cfg).judge(turn))
    assert result.error is None and result.score == -1
    return result.hint


@pytest.mark.slow  # loads the embedded judge's encoder
def test_the_judge_masks_the_users_answer_in_the_hint_only_when_told_to():
    turn = _turn("it's too vague, mention that the correct answer is 22.5 and say it to Lily")
    kept = _hint("keep", turn)
    masked = _hint("mask", turn)
    assert kept is not None and "22.5" in kept
    assert masked is not None and "22.5" not in masked and "correct answer is ..." in masked
    assert masked == kept.replace("22.5", "...")
    # an error a tool printed is what the agent must fix: its figures stay in the hint
    tool = _turn("Traceback (most recent call last):\nValueError: month must be in 1..13", role="tool")
    assert "13" in (_hint("mask", tool) or "")
