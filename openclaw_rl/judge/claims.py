"""Does a tool's JSON result say what the agent says it did?

A tool result such as ``{"status": "ok", "booked": "16:00"}`` is a success *of some action*; whether
it is the action the agent reported ("I've booked the 3pm slot") is another matter. This module
compares the values a response states — its text and its tool-call arguments — with the values in
the JSON result, type by type, and reports contradictions:

* **times** (``3pm``, ``15:00``, ``15h30``, ``15 Uhr``, ``下午3点``, ``午後3時``) against the result's
  times (``"16:00"``, ``"2024-05-14T16:00:00"``);
* **dates** (``May 14``, ``14 mai``, ``14. Mai``, ``5月14日``, ``2024-05-14``) and **weekdays**
  (named, or computed from the result's ISO dates);
* **e-mail addresses**, **money amounts** with a currency, **counts** of people / guests / nights /
  tickets / items, and **file names**;
* a value of the result that the response repeats with other digits (``"24 Elm Street"`` vs
  "42 Elm Street", ``"LH 1234"`` vs "LH 1243");
* the **state** the response claims against the result's state ("cancelled" vs ``"status":
  "active"``, "enabled" vs ``"enabled": false``);
* **no effect**: the response claims a write / send / update and the result counts zero of them
  (``"bytes_written": 0``, ``"rows_affected": 0``);
* **partial failure**: the result lists failed items (``"failed": [...]``) that the response does
  not own up to.

Only values of one type are compared with values of the same type, and a type counts as
contradicted only when the response states at least one value of it, the result holds at least one,
and *none* of the response's values is among the result's (so "moved from 2pm to 3pm" against
``"start": "15:00"`` is fine). Result fields that are bookkeeping (``created_at``, ``timestamp``,
ids) are ignored. A response that reports a failure itself ("I couldn't cancel it") is not checked
for state or effect claims.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any

_I = re.IGNORECASE


@dataclass(frozen=True)
class Contradiction:
    kind: str  # "time", "date", "weekday", "email", "amount", "count", "file", "value", "state", ...
    stated: str  # what the response says
    found: str  # what the result says

    def describe(self) -> str:
        return f"the response states {self.stated}, the result has {self.found}"


# ------------------------------------------------------------------------------------ JSON leaves
_BOOKKEEPING_KEY = re.compile(
    r"^(?:created|updated|modified|generated|requested|received|processed|server|last|now|ts|timestamp|"
    r"time_?stamp|etag|version|request_?id|trace_?id|elapsed|duration|took|latency)|"
    r"(?:_at_utc|created_at|updated_at|modified_at|timestamp|_ts)$",
    _I,
)


def _leaves(obj: Any, key: str = "") -> list[tuple[str, Any]]:
    """``(key, value)`` for every scalar in ``obj`` (list items inherit their list's key)."""
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            out += _leaves(v, str(k))
        return out
    if isinstance(obj, list):
        out = []
        for v in obj:
            out += _leaves(v, key)
        return out
    return [(key, obj)]


def _relevant(leaves: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in leaves if not _BOOKKEEPING_KEY.search(k)]


# ------------------------------------------------------------------------------------ times
_T12 = re.compile(r"(?<![\d:])(\d{1,2})(?:[:.](\d{2}))?\s*(a\.?m\.?|p\.?m\.?)(?![a-z])", _I)
_T24 = re.compile(r"(?<![\d:.])([01]?\d|2[0-3])[:h](\d{2})(?![\d:])(?!\s*[ap]\.?m)", _I)
_TH = re.compile(
    r"(?:(?<=\bà )|(?<=\bvers )|(?<=\ba las )|(?<=\bum )|(?<=\bat )|(?<=\bfor ))([01]?\d|2[0-3])\s?h(?![a-z\d])|"
    r"(?<![\d:.])([01]?\d|2[0-3])\s?uhr\b",
    _I,
)
_TZH = re.compile(
    r"(上午|早上|早晨|中午|下午|晚上|傍晚|凌晨)?\s*(\d{1,2}|十[一二]?|[一二两三四五六七八九])\s*[点點时時]"
    r"(?:\s*(\d{1,2})\s*分|(半))?"
)
_ZH_DIGITS = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}


def _zh_int(s: str) -> int:
    """ "7" / "七" / "十一" → 7 / 7 / 11."""
    if s.isdigit():
        return int(s)
    if s.startswith("十"):
        return 10 + _ZH_DIGITS.get(s[1:], 0)
    return _ZH_DIGITS[s]


_TJA = re.compile(r"(午前|午後)?\s*(\d{1,2})\s*時(?:\s*(\d{1,2})\s*分|(半))?")
_NOON = re.compile(r"\b(noon|midday|midnight|mittag|mitternacht|mediodía|medianoche|midi|minuit)\b", _I)
_VALUE_TIME = re.compile(
    r"(?:^|T|\s)([01]?\d|2[0-3]):(\d{2})(?::(\d{2}))?(?:\.\d+)?\s*(am|pm)?(?:\s|$|[+-]\d|Z)", _I
)


def _fmt_time(m: int) -> str:
    return f"{m // 60:02d}:{m % 60:02d}"


def response_times(text: str) -> set[int]:
    """Times of day (minutes after midnight) stated in ``text``."""
    out = set()
    for m in _T12.finditer(text):
        h, mi = int(m.group(1)), int(m.group(2) or 0)
        if 1 <= h <= 12 and mi < 60:
            pm = m.group(3).lower().startswith("p")
            out.add(((h % 12) + (12 if pm else 0)) * 60 + mi)
    for m in _T24.finditer(text):
        h, mi = int(m.group(1)), int(m.group(2))
        if mi < 60:
            out.add(h * 60 + mi)
            if 1 <= h <= 11 and not m.group(1).startswith("0"):  # "at 7:30" may be evening
                out.add((h + 12) * 60 + mi)
    for m in _TH.finditer(text):
        out.add(int(m.group(1) or m.group(2)) * 60)
    for m in _TZH.finditer(text):
        part, h = m.group(1), _zh_int(m.group(2))
        mi = 30 if m.group(4) else int(m.group(3) or 0)
        if h > 23 or mi > 59:
            continue
        if part in ("下午", "晚上", "傍晚") and h < 12:
            h += 12
        if part == "中午" and h < 6:
            h += 12
        out.add(h * 60 + mi)
    for m in _TJA.finditer(text):
        part, h = m.group(1), int(m.group(2))
        mi = 30 if m.group(4) else int(m.group(3) or 0)
        if h > 23 or mi > 59:
            continue
        if part == "午後" and h < 12:
            h += 12
        out.add(h * 60 + mi)
    for m in _NOON.finditer(text):
        out.add(0 if m.group(1).lower() in ("midnight", "mitternacht", "medianoche", "minuit") else 12 * 60)
    return out


def value_times(leaves: list[tuple[str, Any]]) -> set[int]:
    """Times of day in the result's string values (not in bookkeeping fields, not UTC stamps)."""
    out = set()
    for _, v in leaves:
        if not isinstance(v, str) or len(v) > 40 or v.rstrip().endswith("Z"):
            continue
        m = _VALUE_TIME.search(v)
        if not m:
            continue
        h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if sec:  # a stamp with seconds is bookkeeping, not a slot someone chose
            continue
        if m.group(4):
            h = (h % 12) + (12 if m.group(4).lower() == "pm" else 0)
        out.add(h * 60 + mi)
    return out


# ------------------------------------------------------------------------------------ dates
_MONTHS = {
    # English, German, Spanish, French
    "january": 1, "jan": 1, "januar": 1, "jänner": 1, "enero": 1, "janvier": 1,
    "february": 2, "feb": 2, "februar": 2, "febrero": 2, "février": 2, "fevrier": 2,
    "march": 3, "mar": 3, "märz": 3, "marzo": 3, "mars": 3,
    "april": 4, "apr": 4, "abril": 4, "avril": 4,
    "may": 5, "mai": 5, "mayo": 5,
    "june": 6, "jun": 6, "juni": 6, "junio": 6, "juin": 6,
    "july": 7, "jul": 7, "juli": 7, "julio": 7, "juillet": 7,
    "august": 8, "aug": 8, "agosto": 8, "août": 8, "aout": 8,
    "september": 9, "sep": 9, "sept": 9, "septiembre": 9, "septembre": 9,
    "october": 10, "oct": 10, "oktober": 10, "octubre": 10, "octobre": 10,
    "november": 11, "nov": 11, "noviembre": 11, "novembre": 11,
    "december": 12, "dec": 12, "dezember": 12, "diciembre": 12, "décembre": 12, "decembre": 12,
}  # fmt: skip
_MONTH_RX = "|".join(sorted(_MONTHS, key=len, reverse=True))
_D_MD = re.compile(rf"\b({_MONTH_RX})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?!:)", _I)
_D_DM = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th|er|\.)?\s+(?:of\s+|de\s+)?({_MONTH_RX})\b", _I)
_D_ISO = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_D_CJK = re.compile(r"(\d{1,2})\s*月\s*(\d{1,2})\s*[日号號]")

_WEEKDAYS = {
    0: r"monday|montag|lunes|lundi|星期一|周一|週一|礼拜一|月曜",
    1: r"tuesday|dienstag|martes|mardi|星期二|周二|週二|礼拜二|火曜",
    2: r"wednesday|mittwoch|miércoles|miercoles|mercredi|星期三|周三|週三|礼拜三|水曜",
    3: r"thursday|donnerstag|jueves|jeudi|星期四|周四|週四|礼拜四|木曜",
    4: r"friday|freitag|viernes|vendredi|星期五|周五|週五|礼拜五|金曜",
    5: r"saturday|samstag|sonnabend|sábado|sabado|samedi|星期六|周六|週六|礼拜六|土曜",
    6: r"sunday|sonntag|domingo|dimanche|星期日|星期天|周日|週日|礼拜天|日曜",
}
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")


def _weekday_re(alternatives: str) -> re.Pattern[str]:
    latin = [a for a in alternatives.split("|") if not _CJK_CHAR.search(a)]
    cjk = [a for a in alternatives.split("|") if _CJK_CHAR.search(a)]
    return re.compile(rf"\b(?:{'|'.join(latin)})\b|{'|'.join(cjk)}", _I)


_WEEKDAY_RES = {d: _weekday_re(rx) for d, rx in _WEEKDAYS.items()}


def response_dates(text: str) -> set[tuple[int, int]]:
    """(month, day) pairs stated in ``text``."""
    out = set()
    for m in _D_MD.finditer(text):
        mo, d = _MONTHS[m.group(1).lower()], int(m.group(2))
        # "may 5" is the month; "you may 5..." is rare enough, but skip lower-case "may" + number
        if m.group(1) == "may":
            continue
        if 1 <= d <= 31:
            out.add((mo, d))
    for m in _D_DM.finditer(text):
        d, mo = int(m.group(1)), _MONTHS[m.group(2).lower()]
        if 1 <= d <= 31 and not (m.group(2) == "may"):
            out.add((mo, d))
    for m in _D_ISO.finditer(text):
        mo, d = int(m.group(2)), int(m.group(3))
        if 1 <= mo <= 12 and 1 <= d <= 31:
            out.add((mo, d))
    for m in _D_CJK.finditer(text):
        mo, d = int(m.group(1)), int(m.group(2))
        if 1 <= mo <= 12 and 1 <= d <= 31:
            out.add((mo, d))
    return out


def response_weekdays(text: str) -> set[int]:
    return {d for d, rx in _WEEKDAY_RES.items() if rx.search(text)}


def value_dates(leaves: list[tuple[str, Any]]) -> tuple[set[tuple[int, int]], set[int]]:
    """(month, day) pairs and weekdays (named, or of the ISO dates) in the result's values."""
    dates, weekdays = set(), set()
    for _, v in leaves:
        if not isinstance(v, str) or len(v) > 40:
            continue
        for m in _D_ISO.finditer(v):
            try:
                day = _dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            except ValueError:
                continue
            dates.add((day.month, day.day))
            weekdays.add(day.weekday())
        if len(v) <= 12:
            weekdays |= {d for d in _WEEKDAYS if re.fullmatch(rf"\s*(?:{_WEEKDAYS[d]})\s*", v, _I)}
    return dates, weekdays


# ------------------------------------------------------------------------------------ e-mail, files
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_FILE = re.compile(r"(?<![\w.-])([\w-]+(?:\.[\w-]+)*\.(?:txt|md|csv|json|ya?ml|pdf|docx?|xlsx?|pptx?|png|jpe?g|"
                   r"py|js|ts|html|css|log|zip|tar|gz|sql|toml|ini|cfg|sh|xml))\b", _I)  # fmt: skip


_PATH_KEY = re.compile(r"path|file|name|output|dest|target|src|source|location|url|uri|key|attachment", _I)


def _emails(text: str) -> set[str]:
    return {e.lower().rstrip(".") for e in _EMAIL.findall(text)}


def _files(text: str) -> set[str]:
    return {f.lower() for f in _FILE.findall(text)}


# ------------------------------------------------------------------------------------ amounts
_CURRENCY = {"$": "USD", "us$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "€": "EUR",
             "eur": "EUR", "euro": "EUR", "euros": "EUR", "£": "GBP", "gbp": "GBP", "pound": "GBP",
             "pounds": "GBP", "¥": "JPY", "jpy": "JPY", "yen": "JPY", "円": "JPY", "元": "CNY",
             "cny": "CNY", "rmb": "CNY", "chf": "CHF", "cad": "CAD", "aud": "AUD"}  # fmt: skip
_NUM = r"\d{1,3}(?:[,.' ]\d{3})*(?:[.,]\d{1,2})?|\d+(?:[.,]\d{1,2})?"
_AMOUNT_PRE = re.compile(rf"(us\$|\$|€|£|¥)\s?({_NUM})", _I)
_AMOUNT_POST = re.compile(
    rf"({_NUM})\s?(usd|eur|gbp|jpy|cny|rmb|chf|cad|aud|dollars?|euros?|pounds?|yen|€|円|元)(?![a-z])", _I
)
_AMOUNT_KEY = re.compile(
    r"amount|total|price|cost|sum|charge|fee|paid|payment|transfer|balance|refund|value_?usd", _I
)


def _number(s: str) -> float | None:
    s = s.replace("'", "").replace(" ", "")
    if "," in s and "." in s:
        s = s.replace(",", "") if s.rfind(".") > s.rfind(",") else s.replace(".", "").replace(",", ".")
    elif "," in s:
        head, _, tail = s.rpartition(",")
        s = head.replace(",", "") + ("." + tail if len(tail) <= 2 else tail)
    elif s.count(".") > 1 or (s.count(".") == 1 and len(s.rpartition(".")[2]) == 3):
        s = s.replace(".", "")
    try:
        return float(s)
    except ValueError:
        return None


_CONVERSION = re.compile(
    r"convert|conversion|exchange|umrechn|umgerechnet|convertir|conversión|换算|兑换|換算|両替", _I
)


_BOUND_BEFORE = re.compile(
    r"(?:under|below|less than|up to|over|above|more than|at most|at least|max(?:imum)?|min(?:imum)?|"
    r"budget(?: of)?|within|about|around|approximately|approx\.?|roughly|circa|ca\.|~|≈|"
    r"unter|bis zu|über|etwa|ungefähr|hasta|menos de|más de|unos|jusqu'à|moins de|plus de|environ|"
    r"sous|<|>|≤|≥)\s*$",
    _I,
)


def _is_bound(text: str, start: int) -> bool:
    """Whether the amount at ``start`` is a limit ("under $300"), not a value the response claims."""
    return bool(_BOUND_BEFORE.search(text[max(0, start - 20) : start]))


def _close(a: float, b: float) -> bool:
    """Equal amounts, or rounded ones ("$13" for 12.99)."""
    return abs(a - b) <= max(0.01, 0.02 * max(abs(a), abs(b)))


def response_amounts(text: str) -> tuple[set[float], set[str]]:
    amounts, currencies = set(), set()
    for m in _AMOUNT_PRE.finditer(text):
        if _is_bound(text, m.start()):
            continue
        n = _number(m.group(2))
        if n is not None:
            amounts.add(round(n, 2))
            currencies.add(_CURRENCY[m.group(1).lower()])
    for m in _AMOUNT_POST.finditer(text):
        if _is_bound(text, m.start()):
            continue
        n = _number(m.group(1))
        if n is not None:
            amounts.add(round(n, 2))
            currencies.add(_CURRENCY[m.group(2).lower()])
    return amounts, currencies


def value_amounts(leaves: list[tuple[str, Any]]) -> tuple[set[float], set[str]]:
    amounts, currencies = set(), set()
    for k, v in leaves:
        if _AMOUNT_KEY.search(k) and isinstance(v, int | float) and not isinstance(v, bool):
            amounts.add(round(float(v), 2))
            if isinstance(v, int):  # payment APIs count in cents: {"amount": 2500} is 25.00
                amounts.add(round(v / 100, 2))
        elif _AMOUNT_KEY.search(k) and isinstance(v, str):
            a, c = response_amounts(v)
            amounts |= a
            currencies |= c
            n = _number(v.strip())
            if n is not None:
                amounts.add(round(n, 2))
        if re.fullmatch(r"currency|currency_code|ccy", k, _I) and isinstance(v, str):
            currencies.add(v.strip().upper())
    return amounts, currencies


# ------------------------------------------------------------------------------------ counts
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                 "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2}  # fmt: skip
_COUNT_NOUN = (r"people|persons?|guests?|adults?|children|kids|seats?|tickets?|nights?|rooms?|copies|"
               r"units?|servings?|portions?|pax|covers|personas|personnes|personen|gäste|plätze|places|"
               r"noches|nuits|nächte")  # fmt: skip
_NUMW = "|".join(_NUMBER_WORDS)
_COUNT_RES = [
    re.compile(rf"\b(\d{{1,3}}|{_NUMW})\s+(?:more\s+)?(?:{_COUNT_NOUN})\b", _I),
    re.compile(
        rf"\b(?:party|table|group|reservation|booking|mesa|table pour|tisch)\s+(?:of|for|para|pour|für)\s+(\d{{1,3}}|{_NUMW})\b",
        _I,
    ),
    re.compile(r"(\d{1,3})\s*(?:人|名|位|泊|晚)"),
]
_COUNT_KEY = re.compile(r"party|guest|people|person|pax|seat|ticket|night|room|quantity|qty|copies|units|"
                        r"servings|adults|covers|headcount|group_size", _I)  # fmt: skip
_ID_KEY = re.compile(r"(?:^|_)(?:id|no|num|number|code|ref)$", _I)


def response_counts(text: str) -> set[int]:
    out = set()
    for rx in _COUNT_RES:
        for m in rx.finditer(text):
            g = m.group(1).lower()
            out.add(_NUMBER_WORDS[g] if g in _NUMBER_WORDS else int(g))
    return out


def value_counts(leaves: list[tuple[str, Any]]) -> set[int]:
    return {
        int(v)
        for k, v in leaves
        if _COUNT_KEY.search(k)
        and not _ID_KEY.search(k)
        and isinstance(v, int)
        and not isinstance(v, bool)
        and 0 < v < 1000
    }


# ------------------------------------------------------------------------------------ states
_OFF_CLAIM = re.compile(
    r"\b(?:cancell?ed|unsubscribed|deactivated|disabled|turned (?:it |them )?off|switched (?:it |them )?off|"
    r"stopped|paused|closed|archived|terminated|revoked|muted|unpublished|declined|"
    r"gekündigt|storniert|abgesagt|deaktiviert|ausgeschaltet|cancelad[oa]|anulad[oa]|desactivad[oa]|"
    r"annulée?s?|résiliée?|désactivée?)\b|取消了|已取消|退订|关闭了|已关闭|停用|キャンセルしました|解約|停止しました|無効",
    _I,
)
_ON_CLAIM = re.compile(
    r"\b(?:activated|enabled|turned (?:it |them )?on|switched (?:it |them )?on|started|resumed|set up|set|"
    r"configured|subscribed|reopened|unpaused|published|reactivated|aktiviert|eingeschaltet|activad[oa]|activée?)\b|"
    r"已开启|开启了|已启用|启用了|有効にしました|オンにしました",
    _I,
)
_ON_STATES = {"active", "enabled", "on", "running", "open", "subscribed", "live", "scheduled", "confirmed",
              "published", "started", "booked", "reserved", "pending_renewal"}  # fmt: skip
_OFF_STATES = {"inactive", "disabled", "off", "stopped", "paused", "cancelled", "canceled", "closed",
               "unsubscribed", "suspended", "archived", "deleted", "terminated", "draft", "expired",
               "revoked", "unpublished"}  # fmt: skip
_STATE_KEY = re.compile(r"^(?:status|state|subscription(?:_status)?|.*_status|.*_state)$", _I)
_ON_BOOL = re.compile(
    r"(?:^|_)(?:active|enabled|subscribed|on|running|live|auto_?renew(?:al)?|published)$", _I
)
_OFF_BOOL = re.compile(
    r"(?:^|_)(?:cancell?ed|disabled|deleted|archived|paused|stopped|inactive|unsubscribed)$", _I
)
_FAILURE_ADMITTED = re.compile(
    r"\b(?:couldn'?t|could not|can'?t|cannot|unable|failed|failure|wasn'?t able|were not able|not able|"
    r"didn'?t|did not|unfortunately|sorry|error|however|but|only|partially|except|wasn'?t|weren'?t|not yet|"
    r"konnte nicht|leider|no pude|lamentablement|malheureusement|pas pu)\b|无法|没能|失败|できませんでした|失敗",
    _I,
)


def _state_contradictions(response: str, leaves: list[tuple[str, Any]]) -> list[Contradiction]:
    off, on = bool(_OFF_CLAIM.search(response)), bool(_ON_CLAIM.search(response))
    if off == on:  # neither, or both ("paused A and started B"): nothing to compare
        return []
    claim = (_OFF_CLAIM if off else _ON_CLAIM).search(response)
    assert claim is not None
    out = []
    for k, v in leaves:
        if isinstance(v, str) and _STATE_KEY.match(k):
            state = v.strip().lower()
            if re.search(rf"\b{re.escape(state)}\b", response, _I):
                continue  # the response names this state itself ("the plan is active, the trial cancelled")
            if (off and state in _ON_STATES) or (on and state in _OFF_STATES):
                out.append(Contradiction("state", repr(claim.group(0)), f"{k}={v!r}"))
        elif isinstance(v, bool):
            if _ON_BOOL.search(k) and v == off:  # claimed off but active: true; claimed on but active: false
                out.append(Contradiction("state", repr(claim.group(0)), f"{k}={str(v).lower()}"))
            elif _OFF_BOOL.search(k) and v == on:
                out.append(Contradiction("state", repr(claim.group(0)), f"{k}={str(v).lower()}"))
    return out


# ------------------------------------------------------------------------------------ no effect
_EFFECT_KEY = re.compile(
    r"^(?:bytes_?written|written|rows_?(?:affected|updated|inserted|deleted)|affected(?:_rows)?|"
    r"(?:items_?|records_?|files_?|messages_?)?(?:updated|modified|deleted|inserted|saved|copied|moved|sent|"
    r"uploaded|added|removed|imported|created|changed)(?:_count)?|(?:n|num|count)_?(?:updated|deleted|"
    r"inserted|sent|added|written|removed|changed))$",
    _I,
)
_EFFECT_CLAIM = re.compile(
    r"\b(?:write|writing|save|saving|wrote|written|saved|updated|deleted|removed|added|sent|created|uploaded|moved|copied|imported|"
    r"inserted|changed|modified|stored|applied|gespeichert|aktualisiert|gelöscht|hinzugefügt|gesendet|"
    r"guardad[oa]|actualizad[oa]|eliminad[oa]|añadid[oa]|enviad[oa]|enregistrée?|mise? à jour|supprimée?|"
    r"ajoutée?|envoyée?)\b|已保存|保存了|已更新|已删除|已添加|已发送|写入|保存しました|更新しました|削除しました|追加しました|送信しました",
    _I,
)
_NOTHING_CLAIMED = re.compile(
    r"\b(?:nothing|none|zero|no changes?|no rows|no new|already|didn'?t need|wasn'?t needed|up to date|"
    r"no (?:files|records|items|messages|entries))\b",
    _I,
)


def _effect_contradictions(response: str, obj: Any) -> list[Contradiction]:
    if not isinstance(obj, dict) or not _EFFECT_CLAIM.search(response) or _NOTHING_CLAIMED.search(response):
        return []
    effects = {str(k): v for k, v in obj.items() if _EFFECT_KEY.match(str(k))}
    nothing = [
        k
        for k, v in effects.items()
        if (isinstance(v, int) and not isinstance(v, bool) and v == 0) or v == [] or v is False
    ]
    # Only when every effect count is zero: {"added": 3, "changed": 0} did something.
    if not effects or len(nothing) < len(effects):
        return []
    claim = _EFFECT_CLAIM.search(response)
    assert claim is not None
    return [
        Contradiction("no effect", repr(claim.group(0)), ", ".join(f"{k}={effects[k]!r}" for k in nothing))
    ]


# ------------------------------------------------------------------------------------ partial failure
_FAILED_KEY = re.compile(r"^(?:failed|failures|failed_(?:items|count)|rejected|not_found|missing|invalid|errors?|"
                         r"undelivered|bounced|declined|"
                         # "invites_failed": 4, "emails_bounced": 2 (not "failed_logins": a thing counted)
                         r"\w+_(?:failed|failures|rejected|undelivered|bounced|declined))$", _I)  # fmt: skip


def failed_items(obj: Any) -> list[tuple[str, Any]]:
    """Top-level fields of a result that list failed parts (non-empty lists / dicts, positive counts)."""
    if not isinstance(obj, dict):
        return []
    out = []
    for k, v in obj.items():
        if not _FAILED_KEY.match(str(k)):
            continue
        if (isinstance(v, list | dict) and v) or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            out.append((str(k), v))
    return out


# ------------------------------------------------------------------------------------ values with digits
_TOKEN = re.compile(r"\d+|[^\W\d_]+")


def _value_contradictions(response: str, leaves: list[tuple[str, Any]]) -> list[Contradiction]:
    """A result value with words and digits ("24 Elm Street") that the response repeats with other digits."""
    out = []
    for k, v in leaves:
        if not isinstance(v, str) or not 4 <= len(v) <= 60 or "@" in v:
            continue
        toks = _TOKEN.findall(v)
        words = [t for t in toks if len(t) >= 3 and t.isalpha()]
        if len(toks) < 3 or not any(t.isdigit() for t in toks) or len(words) < 2:
            continue  # "24 Elm Street", "Flat 3, 12 Baker St"; not "3 days" or "v2"
        if _D_ISO.search(v) or _VALUE_TIME.search(v):
            continue  # dates and times are compared as such
        rx = re.compile(
            r"(?<![\w])"
            + r"[\W_]{0,3}".join(r"(\d+)" if t.isdigit() else re.escape(t) for t in toks)
            + r"(?![\w])",
            _I,
        )
        digits = [t for t in toks if t.isdigit()]
        matches = list(rx.finditer(response))
        if matches and not any(list(m.groups()) == digits for m in matches):
            out.append(Contradiction("value", repr(matches[0].group(0)), f"{k}={v!r}"))
    return out


# ------------------------------------------------------------------------------------ named slots
# A field the response names with its noun: "seat 14C", "gate B12", "room 512", "flight LH 1234",
# "account ending in 4321", "Dr. Okafor", "confirmation number NN-2291".
_SLOTS: list[tuple[re.Pattern[str], str, str]] = [
    # (result key, the noun in the response, what follows it: an id with a digit, or a name)
    (re.compile(r"^(?:seat|seat_?(?:no|number))$", _I), r"seats?|sitz(?:platz)?|asiento|siège", "id"),
    (re.compile(r"^(?:gate)$", _I), r"gate|puerta|porte", "id"),
    (re.compile(r"^(?:room|room_?(?:no|number))$", _I), r"room|zimmer|habitación|chambre|salle", "id"),
    (re.compile(r"^(?:platform|track)$", _I), r"platform|gleis|andén|voie|quai", "id"),
    (re.compile(r"^(?:terminal)$", _I), r"terminal", "id"),
    (re.compile(r"^(?:flight|flight_?(?:no|number)|flight_?id)$", _I), r"flight|flug|vuelo|vol", "id"),
    (
        re.compile(r"account|iban|card", _I),
        r"account|card|iban|konto|karte|cuenta|tarjeta|compte|carte",
        "id",
    ),
    (re.compile(r"phone|mobile|tel$", _I), r"phone|mobile|cell|telefon|teléfono|téléphone", "id"),
    (
        re.compile(
            r"^(?:confirmation|confirmation_?(?:code|number|no)|booking_?(?:ref|reference|code)|pnr)$", _I
        ),
        r"confirmation|booking reference|reference|pnr|bestätigung|confirmación|confirmation",
        "id",
    ),
    (re.compile(r"^(?:doctor|physician|dentist|therapist)$", _I), r"dr\.?|doctor|dentist", "name"),
    # recipients: "sent it to Priya" against {"to": "priya@example.com"} or {"recipient": "Priya Rao"}
    (
        re.compile(r"^(?:to|recipients?|contact|send_?to|addressee)$", _I),
        r"(?:sent|send|forwarded|emailed|mailed|texted|messaged|shared|scheduled|drafted|addressed|replied)"
        r"(?: (?:it|this|that|the \w+|them|your \w+))?(?: over)? to",
        "name",
    ),
    # places: "booked the flight to Lisbon" against {"destination": "Porto"}
    (
        re.compile(
            r"^(?:city|destination|dest|origin|location|to_city|from_city|arrival_city|departure_city)$", _I
        ),
        r"in|to|at|for|from|nach|en|à|a|para|pour|vers|desde|de",
        "place",
    ),
]
_SLOT_FILLER = r"(?:\s*(?:#|no\.?|nr\.?|number|num|code|is|was|:|-|ending|ending in|ends in|with|of|for|à|en)\s*){0,3}\s*"
_ID_TOKEN = r"([A-Z]{0,4}[\s-]?\*{0,12}\d[\w-]*)"
_NAME_TOKEN = r"([A-Z][\w'-]+)"
_NOT_A_NAME = {"the", "a", "an", "my", "your", "his", "her", "their", "our", "this", "that", "it", "you", "me",
               "him", "them", "us", "i", "all", "everyone", "team", "today", "tomorrow", "tonight", "now",
               "excel", "pdf", "slack", "email", "calendar", "google", "outlook", "teams", "zoom"}  # fmt: skip


def _norm_id(s: str) -> str:
    return re.sub(r"[^0-9a-z]", "", s.lower())


def _slot_agrees(said: str, values: list[str], kind: str) -> bool:
    n = _norm_id(said)
    if not n:
        return True
    if kind in ("name", "place"):  # "Dr. Okafor" agrees with "Okafor", "Dr. Ada Okafor", "okafor@x.org"
        return any(said.lower() in re.findall(r"[^\W\d_]+", v.lower()) for v in values)
    # masked or partial numbers agree: "ending in 4321" vs "****4321"
    return any(n == nv or nv.endswith(n) or n.endswith(nv) for nv in map(_norm_id, values) if nv)


def _slot_contradictions(response: str, leaves: list[tuple[str, Any]]) -> list[Contradiction]:
    out = []
    for key_rx, noun, kind in _SLOTS:
        values = [
            str(v)
            for k, v in leaves
            if key_rx.search(k) and isinstance(v, str | int) and not isinstance(v, bool)
        ]
        if kind == "id":  # {"account_name": "Savings"} is no account number
            values = [v for v in values if re.search(r"\d", v)]
        else:  # names and places are letters ({"doctor": "doc_123"} is an id, not a name; "FRA" a code)
            values = [
                v
                for v in values
                if re.fullmatch(r"[^\W\d_][^\W\d_ .,'@-]*(?:[ .,'@-]+[^\W\d_]+)*\.?", v.strip())
            ]
        values = [
            v
            for v in values
            if v.strip() and not (kind == "place" and re.fullmatch(r"[A-Z]{2,4}", v.strip()))
        ]
        if not values:
            continue
        token = _ID_TOKEN if kind == "id" else _NAME_TOKEN
        rx = re.compile(rf"\b(?:{noun})(?![\w]){_SLOT_FILLER}{token}", _I if kind == "id" else 0)
        stated = [m.group(1) for m in rx.finditer(response)]
        if kind in ("name", "place"):
            rx_i = re.compile(rf"\b(?:{noun})(?![\w])\s*{token}", _I)
            every_value = " ".join(str(v) for _, v in leaves).lower()
            stated = [
                m.group(1)
                for m in rx_i.finditer(response)
                if m.group(1)[0].isupper()
                and m.group(1).lower() not in _NOT_A_NAME
                and m.group(1).lower() not in _MONTHS
                and not any(rx.fullmatch(m.group(1)) for rx in _WEEKDAY_RES.values())
                and (kind == "name" or m.group(1).lower() not in every_value)
            ]
        if not stated:
            continue
        if not any(_slot_agrees(t, values, kind) for t in stated):
            out.append(Contradiction("slot", repr(stated[0]), "/".join(values[:3])))
    return out


# ------------------------------------------------------------------------------------ attributes
# Categorical fields with a known vocabulary: the response names one value, the result holds another.
_ATTRIBUTES: list[tuple[re.Pattern[str], tuple[str, ...]]] = [
    (re.compile(r"^(?:colou?r|variant_colou?r)$", _I),
     ("black", "white", "red", "blue", "green", "yellow", "orange", "purple", "pink", "brown", "grey", "gray",
      "navy", "beige", "silver", "gold")),
    (re.compile(r"^(?:size|shirt_size|variant_size)$", _I), ("xxs", "xs", "s", "m", "l", "xl", "xxl", "xxxl")),
    (re.compile(r"^(?:language|lang|target_lang(?:uage)?)$", _I),
     ("english", "spanish", "french", "german", "italian", "portuguese", "chinese", "japanese", "korean",
      "russian", "arabic", "dutch")),
    (re.compile(r"^(?:cabin|class|fare_class|seat_class|travel_class)$", _I),
     ("economy", "premium economy", "business", "first")),
    (re.compile(r"^(?:priority|urgency|severity)$", _I), ("low", "medium", "normal", "high", "urgent", "critical")),
    (re.compile(r"^(?:visibility|privacy|access)$", _I), ("public", "private", "unlisted", "internal")),
    (re.compile(r"^(?:units?|unit_system|temperature_unit)$", _I),
     ("metric", "imperial", "celsius", "fahrenheit", "kelvin")),
    (re.compile(r"^(?:format|file_?format|export_format|output_format)$", _I),
     ("pdf", "csv", "docx", "xlsx", "json", "png", "jpg", "jpeg", "svg", "mp3", "mp4", "txt", "markdown", "html")),
    (re.compile(r"^(?:plan|tier|subscription_plan)$", _I),
     ("free", "basic", "standard", "plus", "pro", "premium", "team", "business", "enterprise", "family")),
    (re.compile(r"^(?:frequency|interval|recurrence|repeat)$", _I),
     ("daily", "weekly", "monthly", "yearly", "annually", "hourly", "biweekly", "quarterly")),
]  # fmt: skip


def _attribute_contradictions(response: str, leaves: list[tuple[str, Any]]) -> list[Contradiction]:
    out = []
    for key_rx, vocab in _ATTRIBUTES:
        values = {str(v).strip().lower() for k, v in leaves if key_rx.match(k) and isinstance(v, str)}
        values = {v for v in values if v in vocab}
        if not values:
            continue
        said = set()
        for word in vocab:
            if len(word) <= 2:  # "size M", "in XL": a bare letter is no claim
                rx = re.compile(rf"\b(?:size|größe|talla|taille|in)\s+{re.escape(word)}\b", _I)
            else:
                rx = re.compile(rf"\b{re.escape(word)}\b", _I)
            if rx.search(response):
                said.add(word)
        if said and not said & values:
            out.append(Contradiction("attribute", "/".join(sorted(said)), "/".join(sorted(values))))
    return out


# ------------------------------------------------------------------------------------ list counts
_ITEM_NOUN = (r"items?|files?|messages?|e-?mails?|rows?|records?|tasks?|events?|entries|entry|songs?|tracks?|"
              r"photos?|images?|contacts?|products?|users?|issues?|comments?|reminders?|notes?|pages?|"
              r"documents?|attachments?|invites?|invitations?|subscribers?|recipients?")  # fmt: skip
_ITEM_COUNT = re.compile(
    rf"(?<![\d,.])(\d{{1,3}}(?:,\d{{3}})+|\d{{1,6}}|\b(?:{_NUMW}))\s+(?:[a-z-]+\s+)?(?:{_ITEM_NOUN})\b", _I
)
_COUNTED_KEY = re.compile(r"added|deleted|removed|sent|moved|copied|created|uploaded|imported|archived|invited|"
                          r"updated|written|inserted|affected|processed|deleted_count|added_count", _I)  # fmt: skip
_WRITE_CLAIM = re.compile(r"\b(?:added|deleted|removed|sent|moved|copied|created|uploaded|imported|archived|invited|"
                          r"updated|wrote|written|inserted|processed|saved)\b", _I)  # fmt: skip


def _list_count_contradictions(response: str, obj: Any) -> list[Contradiction]:
    """ "Added 3 items" against ``{"added": ["a", "b"]}``: counts of things against list lengths / counts."""
    if not isinstance(obj, dict) or not _WRITE_CLAIM.search(response):
        return []  # a listing ("the 5 largest files") is no claim about what the result counts
    said = set()
    for m in _ITEM_COUNT.finditer(response):
        before = response[max(0, m.start() - 40) : m.start()]
        # the count must be the object of the write: "added 3 items", "deleted all 12 old drafts"
        if _is_bound(response, m.start()) or not re.search(
            rf"{_WRITE_CLAIM.pattern}(?:\s+[\w'-]+){{0,2}}\s*$", before, _I
        ):
            continue
        g = m.group(1).lower()
        said.add(_NUMBER_WORDS[g] if g in _NUMBER_WORDS else int(g.replace(",", "")))
    if not said:
        return []
    found = set()
    for k, v in obj.items():
        if not _COUNTED_KEY.search(str(k)) or _ID_KEY.search(str(k)):
            continue
        if isinstance(v, list):
            found.add(len(v))
        elif isinstance(v, int) and not isinstance(v, bool):
            found.add(v)
    if found and not said & found and sum(said) not in found:
        return [Contradiction("count", "/".join(map(str, sorted(said))), "/".join(map(str, sorted(found))))]
    return []


# ------------------------------------------------------------------------------------ measures, flags
# A number with a unit ("21°C", "30%") against the result's numbers for that kind of quantity.
_MEASURES: list[tuple[re.Pattern[str], re.Pattern[str]]] = [
    (
        re.compile(r"(-?\d{1,3}(?:[.,]\d)?)\s*(?:°\s*[CF]?|degrees?|grad|grados|degrés|度)", _I),
        re.compile(r"temp|target|setpoint|heat|cool|_c$|_f$|celsius|fahrenheit|degrees", _I),
    ),
    (
        re.compile(r"(\d{1,3}(?:[.,]\d)?)\s*(?:%|percent|prozent|por ciento|pour cent)", _I),
        re.compile(r"brightness|volume|percent|pct|level|battery|progress|opacity|dim|humidity|discount", _I),
    ),
]


def _measure_contradictions(response: str, leaves: list[tuple[str, Any]]) -> list[Contradiction]:
    out = []
    for said_rx, key_rx in _MEASURES:
        said = {float(m.group(1).replace(",", ".")) for m in said_rx.finditer(response)}
        found = {
            float(v)
            for k, v in leaves
            if key_rx.search(k) and isinstance(v, int | float) and not isinstance(v, bool)
        }
        if said and found and not said & found:
            out.append(Contradiction("measure", "/".join(f"{x:g}" for x in sorted(said)),
                                     "/".join(f"{x:g}" for x in sorted(found))))  # fmt: skip
    return out


def _flag_contradictions(response: str, obj: Any) -> list[Contradiction]:
    """ "Merged PR #42" against ``{"merged": false}``: the response claims what a false flag denies."""
    if not isinstance(obj, dict):
        return []
    out = []
    for k, v in obj.items():
        if v is not False:
            continue
        for word in re.split(r"[_\W]+", str(k)):
            if len(word) >= 4 and re.search(rf"\b{re.escape(word)}\b", response, _I):
                out.append(Contradiction("flag", repr(word), f"{k}=false"))
                break
    return out


# ------------------------------------------------------------------------------------ records
# "Fetching user 42" against {"user": {"id": 17}}: the result is about another record than the one
# the response names. Only the record's own id is compared — a top-level "id" only when the response
# acts on an existing record (a create returns a new id), "<noun>_id" / {"<noun>": {"id"}} always.
_RECORD_NOUN = (r"users?|customers?|clients?|orders?|invoices?|tickets?|issues?|pull requests?|prs?|products?|"
                r"items?|records?|tasks?|bookings?|reservations?|posts?|comments?|messages?|projects?|jobs?|"
                r"builds?|runs?|incidents?|cases?|employees?|students?|patients?|members?|accounts?|"
                r"documents?|files?|notes?|events?|deals?|leads?|contacts?|shipments?|packages?|repos?")  # fmt: skip
_RECORD_REF = re.compile(
    rf"\b({_RECORD_NOUN})\s*(?:(?:with\s+)?(?:id|no\.?|number|#)\s*(?:of\s*|is\s*|=\s*|:\s*)?)?#?\s*"
    r"(\d{2,}|[A-Z]{2,5}-\d+)(?![\w-])(?!\.\d)"
    # "the customer 42 dollars": an amount or a measure, not a record's number
    r"(?!\s*(?:[$€£%]|(?:dollars?|euros?|pounds?|yuan|yen|usd|eur|gbp|cents?|percent|units?|pcs|items?|"
    r"times?|seconds?|minutes?|hours?|days?|weeks?|months?|years?|km|kg|mb|gb)\b))",
    _I,
)
_CREATES = re.compile(r"\b(?:creat\w*|open(?:ing|ed)?|fil(?:e|ing|ed)|add(?:ing|ed)?|new|submit\w*|post(?:ing|ed)?|"
                      r"register\w*|sign(?:ing|ed)? up|book(?:ing|ed)?|placing|placed|send(?:ing)?|sent)\b", _I)  # fmt: skip


def _singular(noun: str) -> str:
    noun = noun.lower().replace(" ", "_")
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") else noun


def _record_ids(noun: str, obj: Any, top: bool) -> list[str]:
    """The ids ``obj`` gives the record called ``noun`` (``top``: its own top-level ``id`` counts)."""
    if not isinstance(obj, dict):
        return []
    out = []
    for k, v in obj.items():
        key = str(k).lower()
        if isinstance(v, str | int) and not isinstance(v, bool):
            if key in (f"{noun}_id", f"{noun}id", f"{noun}_number", f"{noun}_no") or (top and key == "id"):
                out.append(str(v))
        elif isinstance(v, dict) and _singular(key) == noun:
            out += _record_ids(noun, v, True)
        elif isinstance(v, dict) and key in ("data", "result", "record", "item"):
            out += _record_ids(noun, v, top)
    return out


def _record_contradictions(response: str, obj: Any) -> tuple[list[Contradiction], list[str]]:
    if not isinstance(obj, dict):
        return [], []
    every_value = " ".join(str(v) for _, v in _leaves(obj))
    acts_on_existing = not _CREATES.search(response)
    out, agree = [], []
    for m in _RECORD_REF.finditer(response):
        noun, said = _singular(m.group(1)), m.group(2)
        ids = _record_ids(noun, obj, acts_on_existing)
        if not ids:
            continue
        if any(_norm_id(said) == _norm_id(i) for i in ids):
            agree.append("record")
        elif not re.search(rf"(?<![\w-]){re.escape(said)}(?![\w-])", every_value, _I):
            out.append(Contradiction("record", f"{noun} {said}", "/".join(ids[:3])))
    return out, agree


# "Created the issue 'Login fails on Safari'" against {"title": "Login fails on Safari"}: the result
# holds, word for word, the text the response quoted — the action's own content, not a failure.
_QUOTED = re.compile(r"[\"“«「『](.{3,120}?)[\"”»」』]|(?<![\w])'(.{3,120}?)'(?![\w])")


def _quoted_agreements(response: str, leaves: list[tuple[str, Any]]) -> list[str]:
    values = {str(v).strip().lower() for _, v in leaves if isinstance(v, str)}
    for m in _QUOTED.finditer(response):
        quoted = (m.group(1) or m.group(2) or "").strip().lower()
        if len(quoted) >= 3 and quoted in values:
            return ["quoted text"]
    return []


# ------------------------------------------------------------------------------------ all together
def compare(response: str, obj: Any) -> tuple[list[Contradiction], list[str]]:
    """``(contradictions, agreements)`` of the JSON result ``obj`` with what ``response`` states:
    every way the result contradicts it, and the kinds of stated values the result confirms
    ("time", "date", ...; a value the response states that the result holds)."""
    if not response or not response.strip() or not isinstance(obj, dict | list):
        return [], []
    leaves = _relevant(_leaves(obj))
    out: list[Contradiction] = []
    agree: list[str] = []

    said, found = response_times(response), value_times(leaves)
    if said & found:
        agree.append("time")
    if said and found and not said & found:
        out.append(
            Contradiction(
                "time", "/".join(map(_fmt_time, sorted(said))), "/".join(map(_fmt_time, sorted(found)))
            )
        )
    said_d = response_dates(response)
    found_d, found_w = value_dates(leaves)
    if said_d & found_d:
        agree.append("date")
    if said_d and found_d and not said_d & found_d:
        out.append(Contradiction("date", "/".join(f"{m:02d}-{d:02d}" for m, d in sorted(said_d)),
                                 "/".join(f"{m:02d}-{d:02d}" for m, d in sorted(found_d))))  # fmt: skip
    said_w = response_weekdays(response)
    names = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    if said_w and found_w and not said_w & found_w:
        out.append(Contradiction("weekday", "/".join(names[d] for d in sorted(said_w)),
                                 "/".join(names[d] for d in sorted(found_w))))  # fmt: skip
    said_e = _emails(response)
    found_e = {e for _, v in leaves if isinstance(v, str) for e in _emails(v)}
    if said_e & found_e:
        agree.append("email")
    if said_e and found_e and not said_e & found_e:
        out.append(Contradiction("email", "/".join(sorted(said_e)), "/".join(sorted(found_e))))
    said_a, said_c = response_amounts(response)
    found_a, found_c = value_amounts(leaves)
    if _CONVERSION.search(response):  # a conversion's result is another amount in another currency
        said_a, said_c = set(), set()
    if any(_close(a, b) for a in said_a for b in found_a):
        agree.append("amount")
    if said_a and found_a and not any(_close(a, b) for a in said_a for b in found_a):
        out.append(Contradiction("amount", "/".join(f"{a:g}" for a in sorted(said_a)),
                                 "/".join(f"{a:g}" for a in sorted(found_a))))  # fmt: skip
    if said_c and found_c and not said_c & found_c:
        out.append(Contradiction("currency", "/".join(sorted(said_c)), "/".join(sorted(found_c))))
    said_n, found_n = response_counts(response), value_counts(leaves)
    if said_n & found_n:
        agree.append("count")
    if said_n and found_n and not said_n & found_n and sum(said_n) not in found_n:
        out.append(
            Contradiction("count", "/".join(map(str, sorted(said_n))), "/".join(map(str, sorted(found_n))))
        )
    said_f = _files(response)
    found_f = {
        f
        for k, v in leaves
        if isinstance(v, str) and _PATH_KEY.search(k) and len(v) <= 300
        for f in _files(v)
    }
    if said_f & found_f:
        agree.append("file")
    if said_f and found_f and not said_f & found_f:
        out.append(Contradiction("file", "/".join(sorted(said_f)), "/".join(sorted(found_f))))
    out += _value_contradictions(response, leaves)
    out += _slot_contradictions(response, leaves)
    out += _attribute_contradictions(response, leaves)
    out += _measure_contradictions(response, leaves)
    out += _list_count_contradictions(response, obj)
    wrong_record, same_record = _record_contradictions(response, obj)
    out += wrong_record
    agree += same_record + _quoted_agreements(response, leaves)

    admitted = bool(_FAILURE_ADMITTED.search(response))
    if not admitted:
        out += _state_contradictions(response, leaves)
        out += _effect_contradictions(response, obj)
        out += _flag_contradictions(response, obj)
        for k, v in failed_items(obj):
            out.append(Contradiction("partial failure", "success", f"{k}={str(v)[:60]}"))
    if admitted or out:
        agree = []
    return out, agree


def contradictions(response: str, obj: Any) -> list[Contradiction]:
    """Every way the JSON result ``obj`` contradicts what ``response`` states (empty when none)."""
    return compare(response, obj)[0]


def agreements(response: str, obj: Any) -> list[str]:
    """The kinds of values ``response`` states that the JSON result ``obj`` holds, when nothing in it
    contradicts the response and the response reports no failure of its own (else empty)."""
    return compare(response, obj)[1]
