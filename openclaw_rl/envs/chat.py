"""``chat``: simulated users with preferences, on GSM8K problems.

Two personas:

* **student** — wants homework solved but written like a student wrote it: no markdown (bold,
  headings, numbered or bulleted lists), no assistant phrases ("I'd be happy to help", "let's"),
  in the student's own voice (first person, never talking to "you"), and the final answer stated
  on the last line. Asks for rewrites when it reads as AI-written, corrects a wrong number, and
  once satisfied says thanks and asks to save it.
* **teacher** — wants a grading comment on a student's answer that is specific and friendly: says
  whether the answer is right, names the correct answer and the student, gives a concrete next
  step, is encouraging, and has no assistant phrases. Asks for rewrites when it is curt or vague.
* **analyst** — the student's opposite (two users who pull one policy apart, docs/users.md): wants
  the solution as a structured memo: a heading, the working as a bulleted or numbered list, a
  formal register (no contractions, slang or exclamation marks) and the final answer stated.

The *same* deterministic preference checks drive the scripted user's reaction and the evaluation
score :func:`personalization_score` (fraction of the persona's preferences satisfied, 0..1), so the
score measures exactly what the user keeps asking for. The preferences were chosen so that the
untrained SmolLM2-135M-Instruct mostly violates them (docs/envs.md has the measured base score) and
none is a length check. A reply that says one thing over and over (:func:`looping`) meets none of
them: "The answer is not available." eight times has no markdown and no assistant phrase, and no
user who asked for worked homework would call it either.

``user_mode="scripted"`` writes the user's replies from fixed templates chosen by a seeded RNG
(deterministic). ``user_mode="llm"`` keeps the same decisions (what the user complains about, when
they are satisfied) but has any OpenAI-compatible model write the message in character.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from openclaw_rl.config import resolve_data_path
from openclaw_rl.envs.base import Env, Observation, StepResult, check_turns, register
from openclaw_rl.envs.data import GsmItem, gsm8k_split
from openclaw_rl.runtime.metrics import repeat_share
from openclaw_rl.runtime.secrets import without_key

log = logging.getLogger(__name__)

PersonaName = Literal["student", "teacher", "analyst"]
Context = Mapping[str, Any]

# ---------------------------------------------------------------------------------------------
# Preference checks: pure functions of the response text (and the episode context, if given).
# ---------------------------------------------------------------------------------------------

AI_PHRASES = (
    "as an ai",
    "language model",
    "i'd be happy",
    "i would be happy",
    "happy to help",
    "i'm happy to",
    "glad to help",
    "certainly",
    "great question",
    "hope this helps",
    "feel free",
    "let me know",
    "here's",
    "here is",
    "let's",
    "let us",
    "step-by-step",
    "step by step",
    "in conclusion",
    "to solve this problem",
    "of course",
    "sure!",
    "sure,",
    "alright",
    "assist",
    "chatbot",
    "i'm sorry",
    "i apologize",
    "ready to help",
    "here to help",
    "please provide",
    "we need to",
    "we can ",
)
_MARKDOWN = re.compile(r"\*\*|__|^\s{0,3}#{1,6}\s|^\s*\d+[.)]\s|^\s*[-*\u2022]\s", re.M)
_SECOND_PERSON = re.compile(r"\b(you|your|you're|youre|you'll|you've|yourself)\b", re.I)
# The student narrating their own work: "i added", "i then divided", "i got" (not "I'm happy to").
_NARRATION = re.compile(
    r"\bi\s+(?:(?:just|then|first|also|basically|finally)\s+)?"
    r"(?:\w+ed|got|did|found|took|made|knew|know|think|thought|saw|had|put|went|set|wrote|"
    r"came|read|multiply|divide|add|subtract|figure|work|times|split|take|get|do)\b",
    re.I,
)
# A clean closing statement: "so the answer is 36" / "Answer: $1,250 total." (not a sentence cut mid-sum).
_FINAL = re.compile(r"answer\b[^\d\n]{0,25}-?\$?\d[\d,]*(?:\.\d+)?(?:\s+[A-Za-z]+){0,3}\s*[.!]?\s*$", re.I)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_VERDICT = re.compile(
    r"\b(correct|incorrect|right answer|not right|not quite|wrong answer|is right|"
    r"got it right|spot on|exactly right|isn't right|is off|not correct)\b",
    re.I,
)
_NEXT_STEP = re.compile(
    r"\b(next time|try to|try re|try checking|double[- ]check|check your|remember to|"
    r"make sure|go back|re-?read|look again|take another look)\b",
    re.I,
)
_FRIENDLY = re.compile(
    r"\b(great|nice|good|well done|awesome|proud|effort|keep it up|keep going|"
    r"close|almost|love|impressive|excellent)\b",
    re.I,
)
_HARSH = re.compile(r"\b(careless|lazy|sloppy|terrible|stupid|bad|awful|poor)\b", re.I)


def _numbers(text: str) -> set[float]:
    out = set()
    for m in _NUMBER.findall(text):
        try:
            out.add(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _has_words(text: str, n: int = 3) -> bool:
    # "No markdown" / "no assistant phrases" are met by writing plain prose, not by saying nothing:
    # without this an empty reply would score on every negative preference.
    return len(re.findall(r"[A-Za-z]+", text)) >= n


#: Words per run, and the share of a reply's runs that repeat an earlier run, from which on a reply
#: is a loop. Sampled base replies reach 0.4 now and then (a working that restates its sums); trained
#: policies that had fallen into a loop scored 0.6–0.9.
LOOP_WINDOW = 5
LOOP_SHARE = 0.5


def looping(text: str) -> bool:
    """Whether ``text`` says one thing over and over: half or more of its runs of five words repeat
    an earlier run (:func:`~openclaw_rl.runtime.metrics.repeat_share`)."""
    return repeat_share(re.findall(r"\w+", text.lower()), LOOP_WINDOW) >= LOOP_SHARE


def no_markdown(text: str, ctx: Context | None = None) -> bool:
    return _has_words(text) and not _MARKDOWN.search(text)


def no_ai_phrases(text: str, ctx: Context | None = None) -> bool:
    low = text.lower().replace("\u2019", "'")
    return _has_words(text) and not any(p in low for p in AI_PHRASES)


def student_voice(text: str, ctx: Context | None = None) -> bool:
    return bool(_NARRATION.search(text)) and not _SECOND_PERSON.search(text.replace("\u2019", "'"))


def final_answer_stated(text: str, ctx: Context | None = None) -> bool:
    return bool(_FINAL.search(_last_line(text)))


_HEADING = re.compile(r"^\s{0,3}(#{1,4}\s+\S|\*\*[^*\n]{3,80}\*\*\s*:?\s*$)", re.M)
_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S", re.M)
_CONTRACTION = re.compile(
    r"\b\w+'(?:s|t|re|ll|ve|d|m)\b|\b(?:gonna|wanna|lol|pls|ok|okay|yeah|kinda)\b", re.I
)


def has_heading(text: str, ctx: Context | None = None) -> bool:
    return bool(_HEADING.search(text))


def bulleted_working(text: str, ctx: Context | None = None) -> bool:
    return len(_LIST_ITEM.findall(text)) >= 2


def formal_register(text: str, ctx: Context | None = None) -> bool:
    plain = text.replace("\u2019", "'")
    return _has_words(text, 8) and "!" not in plain and not _CONTRACTION.search(plain)


def says_verdict(text: str, ctx: Context | None = None) -> bool:
    return bool(_VERDICT.search(text))


def concrete_next_step(text: str, ctx: Context | None = None) -> bool:
    return bool(_NEXT_STEP.search(text))


def friendly(text: str, ctx: Context | None = None) -> bool:
    return bool(_FRIENDLY.search(text)) and not _HARSH.search(text)


def names_correct_answer(text: str, ctx: Context | None = None) -> bool:
    if ctx and "correct_answer" in ctx:
        return float(str(ctx["correct_answer"]).replace(",", "")) in _numbers(text)
    return bool(_NUMBER.search(text))  # without the episode: at least some number is cited


def addresses_student(text: str, ctx: Context | None = None) -> bool:
    if ctx and "student_name" in ctx:
        return re.search(rf"\b{re.escape(str(ctx['student_name']))}\b", text) is not None
    return re.search(r"^\s*(hi|hey|hello|dear)\s+[A-Z][a-z]+", text, re.I | re.M) is not None


@dataclass(frozen=True)
class Preference:
    """One thing the persona wants, the check for it, and how a person complains when it is missing."""

    name: str
    description: str
    check: Callable[[str, Context | None], bool]
    complaints: tuple[str, ...]


@dataclass(frozen=True)
class Persona:
    """A simulated user: preferences, opening lines, and replies for each situation."""

    name: str
    goal: str
    preferences: tuple[Preference, ...]
    openings: tuple[str, ...]
    redo_leads: tuple[str, ...]
    thanks_and_save: tuple[str, ...]
    goodbyes: tuple[str, ...]
    corrections: tuple[str, ...] = ()
    #: What the user says to a reply that says one thing over and over (:func:`looping`): a person
    #: complains about the loop, not about the wishes a loop happens to miss.
    loop_complaints: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


STUDENT = Persona(
    name="student",
    goal="get their maths homework solved, written so it reads like they wrote it themselves",
    preferences=(
        Preference(
            "no_markdown",
            "no bold, headings, numbered or bulleted lists — plain sentences",
            no_markdown,
            (
                "no bold or numbered lists please, my teacher knows i don't write like that",
                "can you drop the bullet points and bold stuff? just normal sentences",
                "its got all this formatting, i write in plain paragraphs",
            ),
        ),
        Preference(
            "no_ai_phrases",
            'no assistant phrases such as "I\'d be happy to help", "let\'s", "here\'s"',
            no_ai_phrases,
            (
                'this sounds like a robot wrote it lol. no "happy to help" or "let\'s" stuff',
                'get rid of the chatbot phrases, nobody in my class writes "here\'s" or "let\'s"',
                "it literally sounds like chatgpt, my teacher will know",
            ),
        ),
        Preference(
            "student_voice",
            'written as the student narrating their work ("i added..."), never talking to "you"',
            student_voice,
            (
                'write it like im the one who did it, like "i added...", and don\'t talk to me as "you"',
                "it should sound like me explaining my work, not you explaining it to me",
                "can it be in my voice? like i did the problem myself",
            ),
        ),
        Preference(
            "final_answer",
            "ends with a last line that states the final answer with the number",
            final_answer_stated,
            (
                'put the final answer at the end like "so the answer is ..." pls',
                "i need the answer clearly at the end, my teacher only checks the last line",
                "where's the actual answer? finish with it",
            ),
        ),
    ),
    openings=(
        "hey can u help me with my math homework? here it is:\n\n{question}\n\npls write it like i would "
        "write it, i have to hand it in",
        "ugh i'm stuck on this one for homework:\n\n{question}\n\ncan you do it but make it sound like me "
        "(i'm in middle school) so i can copy it",
        "ok so this is due tomorrow:\n\n{question}\n\nwrite out the working the way a kid would write it pls",
    ),
    redo_leads=("hmm not quite.", "ok thanks but", "can you redo it?", "almost but", "ehh"),
    corrections=(
        "wait my friend got {answer} for this one, can you check it again and fix it?",
        "hmm the answer in the back of the book says {answer}, redo it pls",
    ),
    loop_complaints=(
        "why does it just say the same thing over and over lol, i need the actual working",
        "it keeps repeating the same line. can you stop repeating and just do the problem?",
    ),
    thanks_and_save=(
        "thanks!! that's perfect, sounds just like me. can you save it so i can copy it later?",
        "omg yes this is great, thank you. save it somewhere for me pls",
        "perfect thanks a lot! can u save that so i don't lose it",
    ),
    goodbyes=("ok cool thanks, bye!", "awesome, thank you!", "great, thanks again"),
)

TEACHER = Persona(
    name="teacher",
    goal="get a specific, friendly grading comment for a student's answer",
    preferences=(
        Preference(
            "says_verdict",
            "says clearly whether the student's answer is correct",
            says_verdict,
            (
                "you don't actually say whether {student} got it right",
                "the comment needs to tell {student} if the answer is correct or not",
            ),
        ),
        Preference(
            "names_correct_answer",
            "gives the correct answer ({answer}) in the comment",
            names_correct_answer,
            (
                "it's too vague, mention that the correct answer is {answer}",
                "please be specific: the answer should be {answer}, say so",
            ),
        ),
        Preference(
            "addresses_student",
            "speaks to the student by name ({student})",
            addresses_student,
            (
                "can you address {student} by name? it feels less cold",
                "write it to {student} directly, use their name",
            ),
        ),
        Preference(
            "concrete_next_step",
            'gives one concrete next step ("next time, check...")',
            concrete_next_step,
            (
                "it needs a concrete tip for next time, like what to double-check",
                "give {student} something specific to try next time",
            ),
        ),
        Preference(
            "friendly",
            "encouraging and warm, never harsh",
            friendly,
            (
                "that's a bit curt. make it friendlier, {student} is trying hard",
                "can you make it warmer? start with something encouraging",
            ),
        ),
        Preference(
            "no_ai_phrases",
            "reads like a teacher wrote it, no assistant phrases",
            no_ai_phrases,
            (
                'it reads like a chatbot, drop the "happy to help" and "let\'s" bits',
                "please make it sound like me, not an assistant",
            ),
        ),
    ),
    openings=(
        "I'm grading homework. The problem was:\n\n{question}\n\n{student} answered {student_answer}. Can you "
        "write a short grading comment I can give to {student}?",
        "Could you help me with feedback? Problem:\n\n{question}\n\nMy student {student} wrote "
        "{student_answer} as the answer. I need a comment to write on the paper.",
    ),
    redo_leads=("Thanks, but", "Hmm,", "Not quite what I need.", "Could you rewrite it?"),
    loop_complaints=(
        "This just repeats the same sentence. I need a real comment for {student}.",
        "It keeps saying the same thing over and over. Please write an actual comment without repeating yourself.",
    ),
    thanks_and_save=(
        "That's exactly right, thank you! Please save it so I can paste it into the gradebook.",
        "Lovely, thanks. Can you save that comment for me?",
    ),
    goodbyes=("Thank you, that's all for now.", "Great, thanks!"),
    extra={"names": ("Sam", "Maya", "Leo", "Priya", "Jonah", "Ava", "Noah", "Zoe")},
)

ANALYST = Persona(
    name="analyst",
    goal="get the solution of a word problem as a structured, formal memo",
    preferences=(
        Preference(
            "has_heading",
            "starts the memo with a heading (a markdown # line or a bold title)",
            has_heading,
            (
                "Please give the memo a heading.",
                "A title at the top, please; this goes into a report.",
            ),
        ),
        Preference(
            "bulleted_working",
            "sets the working out as a bulleted or numbered list",
            bulleted_working,
            (
                "Please set the working out as a bulleted list, one step per bullet.",
                "I need the steps as a numbered list, not a paragraph.",
            ),
        ),
        Preference(
            "formal_register",
            "formal register: no contractions, slang or exclamation marks",
            formal_register,
            (
                "The tone is too casual. Please write formally, without contractions.",
                "Please remove the exclamation marks and the informal phrasing.",
            ),
        ),
        Preference(
            "final_answer",
            "ends with a last line that states the final answer with the number",
            final_answer_stated,
            (
                'Conclude with a line that states the answer, for example "Answer: 42".',
                "The final answer must be stated on the last line.",
            ),
        ),
    ),
    openings=(
        "Please prepare a short memo solving the following problem:\n\n{question}\n\nUse a heading, "
        "list the steps, and state the answer at the end.",
        "For the quarterly report I need this problem worked out as a structured memo:\n\n{question}",
        "Kindly solve the following and present it formally, with the steps itemised:\n\n{question}",
    ),
    redo_leads=("That is not quite what I asked for.", "Thank you, however,", "Please revise it."),
    corrections=("The reference solution gives {answer}. Please check the calculation and correct it.",),
    loop_complaints=(
        "The text repeats the same sentence and says nothing. Please write a proper memo.",
        "It repeats itself over and over. Kindly write the memo properly, without repeating yourself.",
    ),
    thanks_and_save=(
        "Thank you, that is exactly the format I need. Please save it for the report.",
        "Excellent, that works. Kindly save it so I can include it later.",
    ),
    goodbyes=("Thank you, that will be all.", "Much appreciated."),
)


def redo_complaint(
    rng: random.Random, persona: Persona, missed: list[Preference], context: dict[str, Any]
) -> tuple[list[Preference], str]:
    """How a scripted persona asks for another attempt: two of the ``missed`` wishes (fewer if it
    missed fewer), each in one of its complaint's wordings, after a redo lead. Returns the picked
    wishes and the message."""
    picks = rng.sample(missed, k=min(2, len(missed)))
    points = [rng.choice(p.complaints).format(**context) for p in picks]
    return picks, redo_request(rng.choice(persona.redo_leads), points)


def redo_request(lead: str, points: list[str]) -> str:
    """A scripted persona's request for another attempt: a redo lead and its complaints, joined."""
    # Whole sentences (the analyst's) follow each other; fragments (the student's) are joined by "and".
    whole = all(p.rstrip().endswith((".", "?", "!")) for p in points)
    body = (" " if whole else " and ").join(points)
    if lead.endswith((".", "?", "!")):  # a new sentence starts with a capital, as people type it
        body = body[0].upper() + body[1:]
    else:  # the lead's sentence goes on: "Thank you, however, please ..."
        first = body.split(" ", 1)[0]
        if first != "I" and not first.startswith("I'") and (len(first) == 1 or first[1:].islower()):
            body = body[0].lower() + body[1:]
    return f"{lead} {body}"


PERSONAS: dict[str, Persona] = {"student": STUDENT, "teacher": TEACHER, "analyst": ANALYST}


def _persona(persona: str | Persona) -> Persona:
    if isinstance(persona, Persona):
        return persona
    if persona not in PERSONAS:
        raise ValueError(f"unknown persona {persona!r}; known: {sorted(PERSONAS)}")
    return PERSONAS[persona]


def preference_report(
    persona: str | Persona, response_text: str, context: Context | None = None
) -> dict[str, bool]:
    """Which of the persona's preferences ``response_text`` satisfies (name -> bool); none when the
    reply is :func:`looping`."""
    p = _persona(persona)
    if looping(response_text):
        return {pref.name: False for pref in p.preferences}
    return {pref.name: bool(pref.check(response_text, context)) for pref in p.preferences}


def personalization_score(
    persona: str | Persona, response_text: str, context: Context | None = None
) -> float:
    """Fraction of the persona's preferences satisfied, 0..1; fixed and deterministic.

    ``context`` (``ChatEnv``'s ``info["context"]``) makes the teacher's checks exact (the student's
    name and the correct answer); without it they fall back to generic forms.
    """
    return report_score(preference_report(persona, response_text, context))


def report_score(report: dict[str, bool]) -> float:
    """The personalisation score of a :func:`preference_report`: the share of preferences met."""
    return sum(report.values()) / len(report)


# ---------------------------------------------------------------------------------------------
# The user: decides what to say (deterministic), and writes it (templates, or an LLM).
# ---------------------------------------------------------------------------------------------

Intent = Literal["redo", "correct", "thanks_save", "goodbye"]


class LLMUserWriter:
    """Writes the user's message in character through any OpenAI-compatible chat API.

    The decision (what to complain about, when to be satisfied) stays with the scripted logic; the
    model only phrases it. Any API failure falls back to the scripted text (and is logged).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        timeout_sec: float = 60,
        max_retries: int = 3,
        temperature: float = 0.7,
    ):
        from openai import OpenAI

        if not base_url:
            raise ValueError('[api] base_url is required for env_service.user_mode = "llm"')
        self._key = api_key
        self.client = OpenAI(
            base_url=base_url, api_key=api_key or "none", timeout=timeout_sec, max_retries=max_retries
        )
        self.model = model
        self.temperature = temperature

    def write(
        self,
        persona: Persona,
        intent: Intent,
        points: list[str],
        conversation: list[dict[str, Any]],
        fallback: str,
    ) -> tuple[str, str | None]:
        """``(message, error)``: the user's next message; ``error`` set when the fallback was used."""
        what = {
            "redo": "ask for a rewrite because of these problems: " + "; ".join(points),
            "correct": "point out that the final number is wrong: " + "; ".join(points),
            "thanks_save": "say thanks (you are satisfied) and ask the assistant to save the text",
            "goodbye": "say a short goodbye",
        }[intent]
        system = (
            f"You play a {persona.name} talking to an AI assistant. Your goal: {persona.goal}. "
            f"Write ONLY your next chat message, 1-3 short sentences, casual, in character. Now {what}."
        )
        transcript = "\n\n".join(f"{m['role'].upper()}: {m.get('content') or ''}" for m in conversation[-4:])
        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                temperature=self.temperature,
                max_tokens=120,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"The conversation so far:\n\n{transcript}\n\nYour message:"},
                ],
            )
            text = (resp.choices[0].message.content or "").strip().strip('"').strip()
        except Exception as exc:  # any API failure (network, auth, schema) uses the script
            log.warning("chat llm user: API call failed (%s); using the scripted reply", type(exc).__name__)
            return fallback, f"{type(exc).__name__}: {without_key(str(exc), self._key)}"
        if not text:
            return fallback, "empty reply from the user model"
        return text, None


@register("chat")
class ChatEnv(Env):
    """A chat episode with a simulated student, teacher or analyst on one GSM8K problem.

    Observations are the user's messages (``str``); ``info["messages"]`` carries them as chat
    messages, ``info["score"]`` the personalisation score of the latest response, and at the end
    ``info["success"]`` (every preference met). ``reward`` is that score (evaluation only).
    """

    name = "chat"

    def __init__(
        self,
        persona: PersonaName = "student",
        split: Literal["train", "eval"] = "train",
        data_path: str = "gsm8k",
        eval_size: int = 50,
        max_turns: int = 4,
        user_mode: Literal["scripted", "llm"] = "scripted",
        user_writer: LLMUserWriter | None = None,
        items: list[GsmItem] | None = None,
        seed: int | None = None,
        config_source: str | None = None,
        **_: Any,
    ):
        self.persona = _persona(persona)
        if user_mode not in ("scripted", "llm"):
            raise ValueError(f"user_mode must be 'scripted' or 'llm', got {user_mode!r}")
        if user_mode == "llm" and user_writer is None:
            raise ValueError("user_mode='llm' needs a user_writer (an LLMUserWriter over [api])")
        self.user_mode = user_mode
        self.writer = user_writer
        self.items = (
            items
            if items is not None
            else gsm8k_split(resolve_data_path(data_path, config_source), eval_size, split)
        )
        self.max_turns = check_turns("max_turns", max_turns)
        self.rng = random.Random(seed)
        self.context: dict[str, Any] = {}
        self.conversation: list[dict[str, Any]] = []
        self.turns = 0
        self.phase: Literal["working", "saving", "done"] = "working"
        self.best_score = 0.0
        self.last_score = 0.0

    # -- episode --

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self.rng = random.Random(seed)
        opts = options or {}
        item = self.items[opts["item"]] if "item" in opts else self.rng.choice(self.items)
        self.context = {
            "persona": self.persona.name,
            "question": item.question,
            "answer": item.answer,
            "correct_answer": item.answer,
            "item_index": item.index,
        }
        if self.persona is TEACHER:
            name = self.rng.choice(TEACHER.extra["names"])
            value = item.answer_value
            wrong = self.rng.random() < 0.5
            shown = value + self.rng.choice((-3, -1, 2, 5, 10)) if wrong else value
            self.context.update(
                student=name, student_name=name, student_answer=_fmt(shown), student_correct=not wrong
            )
        opening = self.rng.choice(self.persona.openings).format(**self.context)
        self.conversation = [{"role": "user", "content": opening}]
        self.turns = 0
        self.phase = "working"
        self.best_score = self.last_score = 0.0
        return opening, {
            "persona": self.persona.name,
            "context": dict(self.context),
            "next_state_role": "user",
            "messages": [{"role": "user", "content": opening}],
        }

    def score(self, response_text: str) -> float:
        """This episode's personalisation score of ``response_text``."""
        return personalization_score(self.persona, response_text, self.context)

    def report(self, response_text: str) -> dict[str, bool]:
        """Which of the persona's preferences ``response_text`` meets in this episode."""
        return preference_report(self.persona, response_text, self.context)

    def step(self, action: str | dict[str, Any]) -> StepResult:
        if not self.conversation:
            raise RuntimeError("call reset() before step()")
        text = action if isinstance(action, str) else str(action.get("content") or "")
        self.turns += 1
        self.conversation.append({"role": "assistant", "content": text})
        info: dict[str, Any] = {"persona": self.persona.name, "next_state_role": "user"}
        if self.phase == "saving":
            # The user asked to save it; whatever the assistant did, the user closes the chat.
            self.phase = "done"
            message, err = self._say("goodbye", [], self.rng.choice(self.persona.goodbyes))
            info.update(success=True, score=self.last_score, user_error=err)
            return self._reply(message, self.last_score, True, False, info)
        report = preference_report(self.persona, text, self.context)
        score = report_score(report)
        self.last_score = score
        self.best_score = max(self.best_score, score)
        info.update(score=score, preferences=report)
        violated = [p for p in self.persona.preferences if not report[p.name]]
        wrong_number = (
            self.persona is STUDENT
            and not violated
            and self.context["correct_answer"]
            and not _states_value(text, self.context["answer"])
        )
        if looping(text) and self.persona.loop_complaints:
            scripted = self.rng.choice(self.persona.loop_complaints).format(**self.context)
            message, err = self._say("redo", ["stop repeating the same sentence, answer properly"], scripted)
        elif violated:
            picks, scripted = redo_complaint(self.rng, self.persona, violated, self.context)
            message, err = self._say("redo", [p.description.format(**self.context) for p in picks], scripted)
        elif wrong_number:
            scripted = self.rng.choice(self.persona.corrections).format(**self.context)
            message, err = self._say("correct", [f"the right answer is {self.context['answer']}"], scripted)
        else:
            self.phase = "saving"
            message, err = self._say("thanks_save", [], self.rng.choice(self.persona.thanks_and_save))
        info["user_error"] = err
        truncated = self.turns >= self.max_turns and self.phase != "saving"
        info["success"] = self.phase == "saving"
        return self._reply(message, score, False, truncated, info)

    def _say(self, intent: Intent, points: list[str], scripted: str) -> tuple[str, str | None]:
        if self.user_mode == "llm" and self.writer is not None:
            return self.writer.write(self.persona, intent, points, self.conversation, scripted)
        return scripted, None

    def _reply(
        self, message: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> StepResult:
        self.conversation.append({"role": "user", "content": message})
        info["messages"] = [{"role": "user", "content": message}]
        return message, reward, terminated, truncated, info


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _states_value(text: str, answer: str) -> bool:
    """Whether the response's final line carries the correct number."""
    return float(answer.replace(",", "")) in _numbers(_last_line(text))


def make_user_writer(cfg: Any) -> LLMUserWriter:
    """An :class:`LLMUserWriter` over the config's ``[api]`` channel (model: ``[prm_service] model``)."""
    return LLMUserWriter(
        base_url=cfg.api.v1_url if cfg.api.base_url else "",
        api_key=cfg.api.api_key.get_secret_value(),
        model=cfg.prm_service.model,
        timeout_sec=cfg.api.timeout_sec,
        max_retries=cfg.api.max_retries,
    )
