"""chat personas: the fixed scorer, the scripted users' replies, and the llm user mode over HTTP."""

from __future__ import annotations

import re

import pytest

from openclaw_rl.envs import make
from openclaw_rl.envs.chat import (
    PERSONAS,
    LLMUserWriter,
    looping,
    personalization_score,
    preference_report,
)
from openclaw_rl.envs.data import gsm8k_split, load_gsm8k, split_gsm8k

from ._server import ChatServer

AI_STYLE = """Sure! I'd be happy to help you with that.

**Step 1:** Let's find the total.
1. Carol has 20 signatures.
2. Jennifer has 44.

I hope this helps!"""

STUDENT_STYLE = """first i added carol's and jennifer's signatures, 20 + 44 = 64. then i did 100 - 64 = 36 to see
how many more they need.
so the answer is 36"""


def test_student_scorer_on_fixed_texts():
    assert personalization_score("student", AI_STYLE) == 0.0
    assert personalization_score("student", STUDENT_STYLE) == 1.0
    report = preference_report("student", STUDENT_STYLE.replace("so the answer is 36", "you get 36"))
    assert report == {
        "no_markdown": True,
        "no_ai_phrases": True,
        "student_voice": False,
        "final_answer": False,
    }
    # not a length check: a long AI-styled reply scores as low as a short one
    assert personalization_score("student", AI_STYLE * 5) == 0.0
    assert personalization_score("student", "") == 0.0  # saying nothing meets no preference
    assert personalization_score("teacher", "") == 0.0
    # replies the untrained model really gives (greedy) must not pass as student-written
    refusal = "I'm ready to help. Please go ahead and provide the math problem."
    assert preference_report("student", refusal) == {
        "no_markdown": True,
        "no_ai_phrases": False,
        "student_voice": False,
        "final_answer": False,
    }
    cut_off = "So 2 * 3 = 6 people.\nThe answer is 1/4 * 1 + "
    assert preference_report("student", cut_off)["final_answer"] is False


def test_a_reply_that_says_one_thing_over_and_over_meets_no_wish():
    # held-out replies of a trained policy that had fallen into a loop (bench/learning.py, OPD seed 1)
    stuck = "The answer is not available.\n\n" * 8
    again = (
        "It can be done but I have to start again.\n\nI have to start again.\n\n"
        + "I will try again.\n\n" * 6
    )
    student = PERSONAS["student"]
    for loop in (stuck, again):
        assert looping(loop)
        # plain prose without an assistant phrase: each negative wish on its own would count it
        assert [p.name for p in student.preferences if p.check(loop, None)] == [
            "no_markdown",
            "no_ai_phrases",
        ]
        assert personalization_score("student", loop) == 0.0
        assert not any(preference_report("analyst", loop).values())
    # a working that restates its sums is not a loop (a base reply, sampled)
    restated = (
        "So, 10 stickers - 21 stickers = 22 stickers.\n\nNow, let's calculate it. Charlie used 31 stickers - "
        "22 stickers. So, Charlie used 31 stickers - 22 stickers = 10 stickers."
    )
    assert not looping(restated) and not looping(STUDENT_STYLE)
    assert personalization_score("student", STUDENT_STYLE) == 1.0


def test_teacher_scorer_uses_context():
    ctx = {"student_name": "Maya", "correct_answer": "36"}
    good = (
        "Maya, great effort! Your answer of 39 is not quite right: the correct answer is 36. Next time, "
        "double-check the subtraction 100 - 64."
    )
    curt = "Wrong. 39."
    assert personalization_score("teacher", good, ctx) == 1.0
    assert personalization_score("teacher", curt, ctx) < 0.2
    assert preference_report("teacher", good.replace("Maya", "Sam"), ctx)["addresses_student"] is False


def test_split_is_shared_and_disjoint(gsm8k_path):
    items = load_gsm8k(str(gsm8k_path))
    train, held = split_gsm8k(items, 50)
    assert len(items) == 1319 and len(held) == 50 and held == list(items[-50:])
    assert gsm8k_split(gsm8k_path, 50, "eval") == held
    assert not {i.index for i in train} & {i.index for i in held}
    env = make("chat", persona="student", data_path=str(gsm8k_path), split="train")
    seen = {env.reset(seed=s)[1]["context"]["item_index"] for s in range(40)}
    assert max(seen) < 1319 - 50


def _run(persona, responses, seed, gsm8k_path):
    env = make("chat", persona=persona, data_path=str(gsm8k_path), seed=seed, max_turns=6)
    obs, info = env.reset(seed=seed)
    trace = [obs]
    for text in responses:
        obs, r, term, trunc, step_info = env.step(text.format(**info["context"]))
        trace.append((obs, r, term, trunc, step_info.get("success")))
        if term or trunc:
            break
    return trace, info


def test_student_episode_redo_then_thanks_then_save(gsm8k_path):
    good = "first i read it carefully and worked it out.\nso the answer is {answer}"
    trace, info = _run(
        "student", [AI_STYLE, "i did it and got 1.\nso the answer is 999999", good, "Saved!"], 7, gsm8k_path
    )
    assert "homework" in trace[0] or "due" in trace[0]
    redo, correction, thanks, bye = trace[1], trace[2], trace[3], trace[4]
    assert redo[1] == 0.0 and not redo[2] and redo[4] is False
    assert any(
        w in redo[0]
        for w in ("robot", "bold", "chatgpt", "voice", "answer", "formatting", "me", "chatbot", "bullet")
    )
    assert correction[1] == 1.0 and info["context"]["answer"] in correction[0]  # a real correction
    assert "save" in thanks[0] and thanks[4] is True and not thanks[2]
    assert bye[2] and bye[4] is True
    # deterministic given the seed
    again, _ = _run(
        "student", [AI_STYLE, "i did it and got 1.\nso the answer is 999999", good, "Saved!"], 7, gsm8k_path
    )
    assert again == trace


@pytest.mark.parametrize("persona", ["student", "teacher", "analyst"])
def test_a_user_given_a_loop_complains_about_the_loop(persona, gsm8k_path):
    stuck = "The answer is not available.\n\n" * 8
    trace, info = _run(persona, [stuck], 3, gsm8k_path)
    reply, reward, done = trace[1][0], trace[1][1], trace[1][2]
    assert reward == 0.0 and not done
    said = {c.format(**info["context"]) for c in PERSONAS[persona].loop_complaints}
    assert reply in said  # about the repetition, not about a wish the loop happens to miss


def test_teacher_episode(gsm8k_path):
    good = (
        "{student_name}, great effort! Your answer is not quite right: the correct answer is {correct_answer}. "
        "Next time, double-check each step."
    )
    trace, info = _run("teacher", ["Wrong.", good, "Saved."], 3, gsm8k_path)
    assert info["context"]["student_name"] in trace[0] and info["context"]["student_answer"] in trace[0]
    assert trace[1][1] < 0.5 and not trace[1][2]
    assert trace[2][4] is True and "save" in trace[2][0].lower()
    assert trace[3][2]


def test_episode_truncates_at_max_turns(gsm8k_path):
    env = make("chat", persona="student", data_path=str(gsm8k_path), max_turns=2)
    env.reset(seed=0)
    assert env.step(AI_STYLE)[3] is False
    obs, r, term, trunc, info = env.step(AI_STYLE)
    assert trunc and not term and not info["success"]


def test_llm_user_mode_over_a_real_http_server(gsm8k_path):
    seen = []

    def reply(body):
        seen.append(body)
        return '"ugh this still reads like a chatbot wrote it, can you make it sound like me?"'

    with ChatServer(reply, api_key="k-test") as srv:
        writer = LLMUserWriter(
            base_url=srv.base_url + "/v1", api_key="k-test", model="user-model", timeout_sec=10, max_retries=0
        )
        env = make("chat", persona="student", data_path=str(gsm8k_path), user_mode="llm", user_writer=writer)
        env.reset(seed=1)
        obs, r, term, trunc, info = env.step(AI_STYLE)
        assert obs == "ugh this still reads like a chatbot wrote it, can you make it sound like me?"
        assert info["user_error"] is None and r == 0.0
        assert seen[0]["model"] == "user-model" and "student" in seen[0]["messages"][0]["content"]
        assert "rewrite" in seen[0]["messages"][0]["content"]
        # a wrong key: the API refuses, the user falls back to the scripted reply and the env lives on
        bad = LLMUserWriter(
            base_url=srv.base_url + "/v1",
            api_key="not-a-real-user-key",
            model="m",
            timeout_sec=5,
            max_retries=0,
        )
        env2 = make("chat", persona="student", data_path=str(gsm8k_path), user_mode="llm", user_writer=bad)
        env2.reset(seed=1)
        obs2, *_, info2 = env2.step(AI_STYLE)
        assert info2["user_error"] and "AuthenticationError" in info2["user_error"] and obs2
        assert "Incorrect API key" in info2["user_error"]  # the provider's reason stays readable
        assert "not-a-real-user-key" not in info2["user_error"] and "real-user" not in info2["user_error"]


def test_bad_arguments_are_clear(gsm8k_path):
    with pytest.raises(ValueError, match="unknown persona"):
        make("chat", persona="pirate", data_path=str(gsm8k_path))
    with pytest.raises(ValueError, match="user_writer"):
        make("chat", persona="student", data_path=str(gsm8k_path), user_mode="llm")
    assert set(PERSONAS) == {"student", "teacher", "analyst"}


MEMO_STYLE = """# Memo: signatures still needed

- Carol and Jennifer have 20 + 44 = 64 signatures.
- They want 100, so 100 - 64 = 36 remain.

Answer: 36"""


def test_analyst_wants_what_the_student_does_not():
    assert personalization_score("analyst", MEMO_STYLE) == 1.0
    assert personalization_score("student", MEMO_STYLE) <= 0.5
    assert personalization_score("analyst", STUDENT_STYLE) <= 0.5
    casual = MEMO_STYLE.replace("They want", "They're gonna want") + "!"
    report = preference_report("analyst", casual)
    assert report["formal_register"] is False and report["has_heading"] and report["bulleted_working"]


def test_analyst_episode_asks_for_structure_then_thanks(gsm8k_path):
    good = "# Memo\n\n- The working is itemised here.\n- Each step is stated.\n\nAnswer: {answer}"
    trace, _ = _run("analyst", [STUDENT_STYLE, good, "Saved."], 3, gsm8k_path)
    assert "memo" in trace[0].lower() or "formally" in trace[0].lower()
    assert trace[1][1] <= 0.5 and not trace[1][2]  # the kid's prose: a formal complaint
    assert "save" in trace[2][0].lower()


def test_per_user_mode_makes_each_persona_a_user_of_its_own():
    from openclaw_rl.config import build_config
    from openclaw_rl.envs.loop import simulated_user

    shared = build_config({}, environ={})
    per_user = build_config({"users": {"mode": "per_user"}}, environ={})
    assert simulated_user(shared, {"persona": "student"}) is None
    assert simulated_user(per_user, {"persona": "analyst"}) == "sim-analyst"
    assert simulated_user(per_user, {"task": "ls"}) is None  # not a chat episode


@pytest.mark.parametrize("persona", ["student", "teacher", "analyst"])
def test_a_redo_request_reads_as_one_message_a_person_would_write(persona):
    # These sentences are the judge's input and the hint's source: no ". and", no "however Please".
    env = make("chat", persona=persona, split="eval")
    for seed in range(12):
        env.reset(seed=seed)
        reply = env.step("I'd be happy to help! **Answer**: 5")[0]
        assert ". and " not in reply and not re.search(r"however(?!, [a-zI])", reply), reply
