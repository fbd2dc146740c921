"""A next message that moves on to a new request and sets that request's own format.

"Is Paris bigger than Lyon? Answer yes or no." after an answer about Canberra is a new question, and
"Answer yes or no." belongs to it. Read alone, the embedding classifier cannot tell: a format
instruction after an answer is, most of the time, a correction of that answer ("Now answer in one
short sentence."), and the classifier never sees the answer. Training lines did not separate the two
on this encoder without moving their neighbours (bench/results/judge_multilingual.txt), so this is a
rule that reads the response too:

a user message whose first request (a question, or a sentence that opens with a request verb) is
about a *different subject* from the response — at least two content words of its own, at most a
third of them shared with the response — and carries no sign of referring back ("again", "instead",
"your answer", a correction, a complaint), followed only by short instructions about the form of an
answer ("Answer yes or no.", "One word.", "Keep it under 20 words."): those are the new request's
own. The judge then reads the message up to the new request, and takes no
hint from the instructions after it. The same instruction after a question about the *same*
subject ("Is Paris bigger than Lyon? Answer yes or no." after a paragraph comparing the two cities)
is a redo in another format and is read whole, as before.

Conservative by construction: any doubt (a correction cue anywhere, a back-reference in the request,
too few words of its own, a request that is the whole message) leaves the message as it is. Words are
compared as lower-cased word forms, and CJK text as character pairs (it has no spaces).
"""

from __future__ import annotations

import re

# The request opens the message: a question, or a sentence led by a request verb (after a short
# "ok," / "thanks!" / "now" / "next:" lead-in, which may be its own sentence).
_SENTENCES = re.compile(r"[^.!?。！？\n]+[.!?。！？]*\s*|[.!?。！？]+\s*")
_QUESTION_END = re.compile(r"[?？]\s*$")
_LEAD = re.compile(
    r"^\W*(?:(?:ok(?:ay)?|thanks?|thank you|thx|great|cool|nice|perfect|got it|good|alright|and|also|"
    r"now|next|then|btw|by the way|new (?:question|task)|another (?:one|question|thing))\b[\s,:;!.-]*)+",
    re.IGNORECASE,
)
_REQUEST_VERB = re.compile(
    r"^(?:please\s+|pls\s+|can you\s+|could you\s+|would you\s+)?(?:write|draft|compose|create|make|"
    r"generate|translate|summari[sz]e|list|name|give me|tell me|explain|describe|define|calculate|"
    r"compute|convert|find|suggest|recommend|plan|outline|spell|count|sort|compare|solve)\b"
    r"|^(?:请|帮我|给我|写|翻译|列出|解释|计算|告诉我|推荐)",
    re.IGNORECASE,
)
_ONLY_LEAD = re.compile(r"^\W*$")
# What may follow the request: instructions about the *form* of its answer only ("Answer yes or no.",
# "One word.", "Keep it under 20 words.", "只回答是或否。"). Anything else after a question (a remark, a
# reason, an opinion) may be about the response, and the message is read whole.
_FORMAT = re.compile(
    r"\b(?:yes or no|yes/no|one word|a (?:single )?word|in (?:one|a few|\d+) (?:words?|sentences?|lines?)|"
    r"one (?:short )?(?:sentence|line|paragraph)|a (?:single )?(?:sentence|line)|(?:a|the) (?:number|digit)|"
    r"digits?|number only|numbers only|just the (?:number|name|answer|result)|(?:under|max(?:imum)?|at most|"
    r"no more than|less than|fewer than) \d+ (?:words?|sentences?|lines?|characters?)|\d+ (?:words?|"
    r"sentences?|lines?|bullets?|items?|points?) (?:max|or (?:less|fewer))|bullet(?:s| points?| list)|"
    r"numbered list|as a (?:list|table)|in a table|json|lower ?case|upper ?case|all caps|no (?:explanation|"
    r"comments?|intro(?:duction)?|preamble)|short answer|briefly|keep it (?:short|brief)|"
    r"sí o no|en una (?:palabra|frase)|oui ou non|en un (?:mot|phrase)|en une phrase|ja oder nein|"
    r"in einem (?:wort|satz)|mit einem wort)\b"
    r"|是或否|是还是否|一句话|一个词|一个字|只回答|只要数字|只给|数字|不超过\d+个?字|简短|用列表|"
    r"はいかいいえ|一言で|一文で|数字だけ|だけで答え",
    re.IGNORECASE,
)
_FORMAT_MAX_WORDS = 12  # "Answer yes or no." / "Keep it under 20 words, no intro." — not a paragraph

# Signs that the message is about the response after all: the judge's own lexical cues
# (judge.minilm.LEXICAL_CUES, in every language it reads) for a correction, a complaint, a contrast or
# sarcasm anywhere in the message, or a redo in the request itself; and words in the request that
# point back at the response.
_CORRECTION_CUES = frozenset(
    {
        "wrong",
        "starts_no",
        "x_not_y",
        "i_meant",
        "should_be",
        "broken",
        "too_much",
        "contrast",
        "sarcasm",
        "emoji_neg",
    }
)
_BACK_REFERENCE = re.compile(
    r"\b(?:same|above|previous|earlier|last (?:one|answer|time)|your|you (?:said|wrote|gave|told|did|mean)|"
    r"it|this|these|those|them|rephrase|shorter|longer|simpler|das|dies|eso|esto|ça|cela)\b"
    r"|这|那|它|刚才|上面|你的|你说|それ|これ|さっき",
    re.IGNORECASE,
)

# Words a request is made of whatever its subject (question words, request verbs, format words):
# they say nothing about what the request is about.
_GENERIC = frozenset(
    """
    what which who whom whose when where why how are was were does did can could would will should
    the and for with about from into than then now next also please pls you your yours our ours
    give tell write make show explain list answer answers reply question questions number numbers word
    words sentence sentences line lines short brief simple plain just only one two three yes more
    less like some any this that these those there here its what's who's how's it's i'm ok okay thanks
    thank great cool keep under over use using format bullet bullets table json code example examples
    step steps working detail details version way get got have has had want need let let's know think
    all each every many much very really quite not but new another other thing things please kindly
    """.split()
)
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+")
_CJK_GENERIC = frozenset("回答 答案 一下 什么 怎么 为什么 是否 只回 告诉 请问 可以 一个 一句 ".split())


def _units(text: str) -> set[str]:
    """The content units of ``text``: lower-cased words of 3+ letters or any number, not generic;
    CJK runs as overlapping character pairs."""
    out: set[str] = set()
    plain = _CJK_RUN.sub(" ", text)
    for w in _WORD.findall(plain.lower()):
        if (w.isdigit() or len(w) >= 3) and w not in _GENERIC:
            out.add(w)
    for run in _CJK_RUN.findall(text):
        for i in range(len(run) - 1):
            pair = run[i : i + 2]
            if pair not in _CJK_GENERIC:
                out.add(pair)
    return out


def _is_request(sentence: str) -> bool:
    body = _LEAD.sub("", sentence).strip()
    return bool(body) and bool(_QUESTION_END.search(sentence) or _REQUEST_VERB.search(body))


def request_part(content: str, response: str) -> str | None:
    """The part of a user's ``content`` the judge should read when it opens a new request on another
    subject than ``response`` and then adds that request's own instructions; None when the message is
    to be read whole (it refers back to the response, the request is all of it, or there is doubt).
    """
    from openclaw_rl.judge.minilm import cues_in  # minilm imports this module: at call time

    if cues_in(content) & _CORRECTION_CUES:
        return None
    theirs = _units(response)
    if len(theirs) < 3:
        return None  # "Sydney.": too little to know the response's subject (a rephrased request?)
    sentences = [s for s in _SENTENCES.findall(content.strip()) if s.strip()]
    for k, sentence in enumerate(sentences):
        if _ONLY_LEAD.match(_LEAD.sub("", sentence)):
            continue  # "Thanks!" / "Next:" before the request
        if not _is_request(sentence):
            return None  # the message opens with something else: read it whole
        rest = sentences[k + 1 :]
        if not rest:
            return None  # nothing after the request to set aside
        if not all(_FORMAT.search(r) and len(r.split()) <= _FORMAT_MAX_WORDS for r in rest):
            return None  # something other than the new request's format follows it
        request = "".join(sentences[: k + 1]).strip()
        asked = _LEAD.sub("", sentence)
        if _BACK_REFERENCE.search(asked) or "redo" in cues_in(asked):
            return None
        own = _units(sentence)
        shared = own & theirs
        if len(own - shared) < 2 or len(shared) * 3 > len(own):
            return None
        return request
    return None
