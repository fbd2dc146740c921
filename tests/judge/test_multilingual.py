"""The embedded judge on next states in other languages and styles, with the real multilingual
encoder (no mocks): Chinese / Japanese / German / Spanish / French replies, emoji, a correction
inside thanks, a tool JSON result that contradicts what the agent said, a long log that ends in
success. Plus the pieces that need no encoder: emoji spelling, head + tail clipping, the claim
comparison and the long-log tail rule."""

from __future__ import annotations

import asyncio
import json

import pytest

from openclaw_rl.config import Config, PrmServiceConfig
from openclaw_rl.judge import make_judge
from openclaw_rl.judge.claims import contradictions
from openclaw_rl.judge.encoders import clip_long, embed_text, looks_english, spell_emoji
from openclaw_rl.judge.evidence import read_evidence
from openclaw_rl.judge.minilm import LEXICAL_CUES, MiniLMJudge, lexical_features
from openclaw_rl.types import NextState

# Fresh phrasings: in neither the training lines nor a held-out set.
USER_CASES = [
    ("zh", "不对，你把周二写成周三了，重新改一下", -1),
    ("zh", "太好了，问题解决了，谢谢！", 1),
    ("zh", "错了。", -1),  # 错 alone: once read as praise (the classifier knew it from 不错 / 不报错)
    ("zh", "完全错误！", -1),
    ("zh", "嗯，没错，就这样", 1),
    ("ja", "ありがとうございます、おかげで間に合いました", 1),
    ("ja", "違います、それは去年のデータです", -1),
    ("de", "Nein, das ist die falsche Datei, ich meinte config.yaml", -1),
    ("de", "Vielen Dank, das hat super funktioniert", 1),
    ("es", "Sigue sin funcionar, me da el mismo error de antes", -1),
    ("es", "¡Muchísimas gracias, quedó perfecto!", 1),
    ("fr", "Non, ce n'est pas la bonne réponse, c'est 42", -1),
    ("fr", "Merci infiniment, ça marche du tonnerre", 1),
    ("en", "🙏🙏 you saved me", 1),
    ("en", "thanks! though the invoice should say March, not May", -1),
]

BOOKING = "I've booked the 3pm slot with Dr. Okafor for you."
BOOKED_OTHER = json.dumps({"status": "ok", "booked": "16:00", "doctor": "Okafor"})
BOOKED_SAME = json.dumps({"status": "ok", "booked": "15:00", "doctor": "Okafor"})


def _long_log(final: str) -> str:
    lines = ["$ ./gradlew build", "> Configure project :app"]
    lines += [f"> Task :app:compile{n}Java" for n in ("Debug", "Release", "Test", "Bench")]
    lines += ["warning: [deprecation] getFoo() in Bar has been deprecated"] * 3
    lines += [f"> Task :app:step{i}" for i in range(40)]
    lines += ["error: retrying download of gradle-wrapper.jar (attempt 1 of 3)"]
    lines += [f"> Task :app:package{i}" for i in range(10)]
    return "\n".join([*lines, final, "Total time: 2 mins 3.2 secs"])


@pytest.fixture(scope="module")
def judge():
    cfg = Config(prm_service=PrmServiceConfig(backend="minilm", temperature=0.0, vote_count=3))
    return make_judge(cfg)


# ------------------------------------------------------------------ with the real encoder (slow)
@pytest.mark.slow
def test_the_default_judge_is_the_multilingual_classifier(judge):
    assert isinstance(judge, MiniLMJudge) and judge.name == "minilm"  # the config key users have
    assert judge.classifier.recipe.encoder == "usem3+minilm@en"
    assert judge.classifier.embedder.dim == 512 + 384


@pytest.mark.slow
@pytest.mark.parametrize("lang, text, expected", USER_CASES, ids=[f"{c[0]}-{c[2]:+d}" for c in USER_CASES])
def test_replies_in_other_languages_and_styles(judge, lang, text, expected):
    res = asyncio.run(judge.score("(previous answer)", NextState(role="user", content=text)))
    assert res.score == expected, (lang, text, [v.raw for v in res.votes])


@pytest.mark.slow
def test_a_chinese_correction_gets_a_hint_from_its_own_words(judge):
    res = asyncio.run(
        judge.score("周三开会", NextState(role="user", content="不对，你把周二写成周三了，重新改一下"))
    )
    assert res.score == -1 and res.hint is not None and "周二" in res.hint


@pytest.mark.slow
def test_tool_json_that_contradicts_the_stated_action_is_negative(judge):
    res = asyncio.run(judge.score(BOOKING, NextState(role="tool", content=BOOKED_OTHER)))
    assert res.score == -1
    assert all("contradicts the response" in v.raw for v in res.votes)
    assert res.hint is not None and "15:00" in res.hint and "16:00" in res.hint
    ok = asyncio.run(judge.score(BOOKING, NextState(role="tool", content=BOOKED_SAME)))
    assert ok.score == 1 and ok.hint is None


@pytest.mark.slow
def test_a_long_log_ending_in_success_is_positive(judge):
    res = asyncio.run(
        judge.score(
            "ran the build", NextState(role="environment", content=_long_log("BUILD SUCCESSFUL in 2m 3s"))
        )
    )
    assert res.score == 1, [v.raw for v in res.votes]
    bad = asyncio.run(
        judge.score(
            "ran the build", NextState(role="environment", content=_long_log("BUILD FAILED in 2m 3s"))
        )
    )
    assert bad.score == -1, [v.raw for v in bad.votes]


# ------------------------------------------------------------------ no encoder needed (fast)
def test_emoji_are_spelled_out_for_the_encoder():
    assert spell_emoji("👍") == "(thumbs up sign)"
    assert spell_emoji("谢谢👍👍") == "谢谢 (thumbs up sign)"
    assert spell_emoji("🤦‍♂️ again") == "(face palm) again"  # joiner, gender and variation selector dropped
    assert spell_emoji("plain text, no emoji") == "plain text, no emoji"
    assert embed_text("  👎 ") == "(thumbs down sign)"


def test_long_outputs_keep_head_and_tail():
    log = _long_log("BUILD SUCCESSFUL in 2m 3s")
    clipped = clip_long(log)
    assert len(clipped) < len(log) and clipped.startswith("$ ./gradlew build")
    assert "BUILD SUCCESSFUL in 2m 3s" in clipped and clipped.endswith("Total time: 2 mins 3.2 secs")
    assert clip_long("short") == "short"


def test_only_english_replies_are_given_to_the_english_encoder():
    for text in ("thanks, that works", "nope, still broken", "lgtm", "👍"):
        assert looks_english(text), text
    for text in (
        "谢谢",
        "ありがとう",
        "Danke, das ist gut",
        "Merci beaucoup",
        "¡Gracias!",
        "Grazie mille",
        "Спасибо",
    ):
        assert not looks_english(text), text


def cues(text: str) -> set[str]:
    """The names of the lexical cues that fire on ``text``."""
    return {n for (n, _), v in zip(LEXICAL_CUES, lexical_features(text), strict=False) if v}


def test_lexical_cues_read_other_languages():
    assert {"wrong"} <= cues("错了，应该是五点")
    assert {"thanks"} <= cues("ありがとう")
    assert {"wrong"} <= cues("Das ist falsch")
    assert {"thanks", "contrast"} <= cues("Merci, mais c'est mardi")
    assert {"emoji_pos"} <= cues("👍")
    assert {"emoji_neg"} <= cues("👎")
    assert "wrong" not in cues("thanks, perfect")


def test_lexical_cues_read_a_request_to_drop_words_as_a_change_request():
    # A user who quotes what to drop ("happy to help") or asks whether something is "correct or not"
    # is asking for a change, whatever the quoted or asked-about words say.
    for text in ('please drop the "glad to help" line', "get rid of the sign-off", "cut the intro"):
        assert "redo" in cues(text), text
    assert "praise" not in cues("tell her whether the total is correct or not")
    assert "praise" in cues("that's correct, thanks")


@pytest.mark.parametrize(
    "response, result, kind",
    [
        ("I've booked the 3pm slot", {"status": "ok", "booked": "16:00"}, "time"),
        ("已为你预订下午3点的会议室", {"status": "ok", "time": "16:00"}, "time"),
        ("Termin um 15 Uhr ist gebucht", {"status": "ok", "slot": "2024-05-14T16:00:00"}, "time"),
        ("Réservé pour le 14 mai", {"status": "ok", "date": "2024-05-15"}, "date"),
        ("Posted it for Tuesday", {"scheduled": True, "publish_at": "2024-05-22T08:00:00"}, "weekday"),
        ("Sent it to mara@example.org", {"delivered": True, "to": "mark@example.org"}, "email"),
        ("Paid the €40 invoice", {"status": "completed", "amount": 400.0, "currency": "EUR"}, "amount"),
        ("Booked a table for 6", {"confirmation": "Q1", "party_size": 4}, "count"),
        ("I cancelled the gym membership", {"membership": "gym", "status": "active"}, "state"),
        (
            "Saved the notes to notes.md",
            {"ok": True, "path": "/tmp/notes.md", "bytes_written": 0},
            "no effect",
        ),
        ("Changed the address to 17 Oak Lane", {"updated": True, "line1": "71 Oak Lane"}, "value"),
        ("Added apples and pears", {"added": ["apples"], "failed": ["pears"]}, "partial failure"),
        ('[tool calls] book({"time": "09:30"})', {"status": "ok", "booked": "10:30"}, "time"),
        ("Your seat is 14C.", {"status": "confirmed", "seat": "21A"}, "slot"),
        ("Booked with Dr. Shah for Friday.", {"ok": True, "doctor": "Okafor"}, "slot"),
        ("Charged the card ending in 4421.", {"charged": True, "card": "****1244"}, "slot"),
        ("I turned off the hall lights.", {"device": "hall_lights", "state": "on"}, "state"),
        ("已经帮你订好了5月20日的位子。", {"status": "confirmed", "date": "2024-05-21"}, "date"),
        (
            "He reservado una mesa para 4 a las 21:00.",
            {"status": "ok", "party_size": 4, "time": "20:00"},
            "time",
        ),
        ("Ordered the blue hoodie in size M", {"status": "placed", "color": "red", "size": "M"}, "attribute"),
        ("Added 3 items to your cart", {"added": ["tea", "jam"]}, "count"),
        ("Sent it to Priya", {"sent": True, "to": "mark@acme.io"}, "slot"),
        ("Booked your flight to Lisbon on May 3", {"status": "confirmed", "destination": "Porto"}, "slot"),
    ],
)
def test_claims_that_the_result_contradicts(response, result, kind):
    found = contradictions(response, result)
    assert kind in {c.kind for c in found}, found
    ev = read_evidence("tool", json.dumps(result), response)
    assert ev.score == -1 and "contradicts the response" in ev.reason


@pytest.mark.parametrize(
    "response, result",
    [
        ("I've booked the 4pm slot", {"status": "ok", "booked": "16:00"}),
        ("Moved your call from 2pm to 3pm", {"status": "ok", "start": "2024-05-15T15:00:00"}),
        (
            "Reminder set for 9pm",
            {"id": "r1", "fires_at": "2024-05-14T21:00:00", "created_at": "2024-05-13T08:12:33Z"},
        ),
        ("Posted it for Tuesday", {"scheduled": True, "publish_at": "2024-05-21T08:00:00"}),
        ("Converted $10 to yen", {"amount": 1612.4, "currency": "JPY"}),
        ("I couldn't cancel it, it is still active", {"status": "active"}),
        ("Applied the plan", {"added": 3, "changed": 0, "destroyed": 0}),
        ("Saved it, nothing had changed so no bytes were written", {"ok": True, "bytes_written": 0}),
        ("get_weather(city='Oslo')", {"city": "Oslo", "temp_c": -3}),
        (
            "Your seat is 14C, gate B12, departing 09:40.",
            {"seat": "14C", "gate": "B12", "departure": "2024-07-02T09:40:00"},
        ),
        ("Paid €25.00 to Lena.", {"status": "succeeded", "amount": 2500, "currency": "eur"}),
        (
            "Charged $12.99 to the account ending in 4421.",
            {"account": "****4421", "amount": 12.99, "currency": "USD"},
        ),
        (
            "Booked Dr. Ada Okafor for June 7 at 2:15pm.",
            {"doctor": "Dr. Ada Okafor", "start": "2024-06-07T14:15:00"},
        ),
        ("I found 4 flights under $300.", {"results": [{"price": 289}, {"price": 250}], "count": 4}),
        ("I've paused your subscription until June.", {"status": "paused", "resume": "2024-06-01"}),
        ("Your plan is active now and the trial is cancelled.", {"plan": "pro", "status": "active"}),
        ("已经帮你订好了5月20日晚上7点的两人位。", {"date": "2024-05-20", "time": "19:00", "party_size": 2}),
        ("6月3日の午前10時で予約しました。", {"status": "ok", "start": "2024-06-03T10:00:00"}),
        ("J'ai programmé l'envoi pour lundi à 8h.", {"scheduled": True, "send_at": "2024-05-13T08:00:00"}),
        (
            "Saved the cleaned data to out/clean.csv (1,204 rows).",
            {"ok": True, "path": "out/clean.csv", "rows_written": 1204},
        ),
        ("Sent it to Priya", {"sent": True, "to": "priya@acme.io"}),
        (
            "I booked a table at Nopa for 8pm",
            {"restaurant": "Nopa", "time": "20:00", "city": "San Francisco"},
        ),
        ("Here's the weather for Monday in Paris", {"city": "Paris", "temp": 21}),
    ],
)
def test_consistent_or_unrelated_results_are_not_contradictions(response, result):
    assert contradictions(response, result) == []


def test_without_a_response_a_status_ok_result_is_still_positive():
    assert read_evidence("tool", BOOKED_OTHER).score == 1
    assert read_evidence("tool", BOOKED_OTHER, BOOKING).score == -1
    assert read_evidence("tool", BOOKED_SAME, BOOKING).score == 1


def test_a_result_that_echoes_the_stated_values_is_positive_evidence():
    plain = json.dumps({"booked": "15:00", "doctor": "Okafor"})  # no status field at all
    assert read_evidence("tool", plain).score is None  # the classifier would have to judge it
    ev = read_evidence("tool", plain, BOOKING)
    assert ev.score == 1 and "confirms the response" in ev.reason
    # not when the result also reports a failure, or the response admits one
    failed = json.dumps({"booked": "15:00", "error": "payment declined"})
    assert read_evidence("tool", failed, BOOKING).score == -1
    assert read_evidence("tool", plain, "I couldn't book the 3pm slot").score is None


def test_the_last_lines_of_a_long_log_decide_when_its_signals_disagree():
    ok = read_evidence("environment", _long_log("BUILD SUCCESSFUL in 2m 3s"))
    assert ok.score == 1 and "last lines" in ok.reason
    bad = read_evidence("environment", _long_log("BUILD FAILED in 2m 3s"))
    assert bad.score == -1
    # a short output with a traceback and exit 0 stays a conflict for the classifier
    short = "Traceback (most recent call last):\nKeyError: 'id'\n[exit code 0]"
    assert read_evidence("tool", short).score is None
    # more success lines of common tools
    for tail in (
        "added 1289 packages, and audited 1290 packages in 41s",
        "Successfully tagged registry.local/api:2.0",
        "Apply complete! Resources: 4 added, 1 changed, 0 destroyed.",
        "Setting up nginx-common (1.24.0-2) ...",
        "Done in 12.34s.",
    ):
        assert read_evidence("tool", tail).score == 1, tail


def _steps(body: list[str]) -> str:
    return "\n".join([f"step {i}: processing chunk {i}" for i in range(20)] + body)


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            [
                "npm warn deprecated glob@7.2.3: old",
                "added 812 packages, and audited 813 packages in 38s",
                "found 0 vulnerabilities",
            ],
            1,
        ),
        (
            [
                "Unpacking curl (7.88.1-10) ...",
                "Setting up curl (7.88.1-10) ...",
                "Processing triggers for man-db ...",
            ],
            1,
        ),
        (
            [
                "#12 writing image sha256:ab12 done",
                "#12 naming to docker.io/library/web:latest done",
                "#12 DONE 2.3s",
            ],
            1,
        ),
        (
            [
                "ERROR: Could not connect to mirror, retrying (1/3)",
                "Collecting requests",
                "Successfully installed requests-2.32.3",
            ],
            1,
        ),
        (
            ["ERROR: mirror timed out, retrying", *[f"copy {i}" for i in range(8)]],
            None,
        ),  # verdict not in the evidence
        (["npm ERR! code ERESOLVE", "npm ERR! A complete log of this run can be found in: /root/x.log"], -1),
        (
            [
                "Successfully installed a-1.0",
                "FAILED tests/test_api.py::test_login - AssertionError",
                "==== 1 failed, 9 passed ====",
            ],
            -1,
        ),
        (["FAILURE: Build failed with an exception.", "* What went wrong:", "BUILD FAILED in 12s"], -1),
    ],
)
def test_long_logs_are_judged_by_their_end(body, expected):
    assert read_evidence("environment", _steps(body)).score == expected
