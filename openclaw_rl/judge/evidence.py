"""Structured evidence in a next state, read deterministically before the classifier is asked.

Terminals, tools and test runners print machine formats that say plainly whether an action worked:
an exit code, a Python / JS / Java / Rust / Go traceback, an HTTP status, a test summary, a compiler
error, ``command not found``. :func:`read_evidence` finds them with line-anchored rules — the forms
this project's own environments produce (``CommandResult.as_observation``'s ``exit code: N`` /
``stdout:`` / ``stderr:`` / ``[sandbox] killed: ...``; the tool env's ``error: ...`` and
``wrote N bytes to F``; the GUI env's ``Error: ...`` and ``Check: passed / FAILED``) and the common
generic ones (``[exit 0]``, ``returncode=2``, ``exit status 1``, ``HTTP/1.1 404 Not Found``,
``3 passed, 1 failed``, ``main.c:8:14: error: ...``) — and combines them:

* a **non-zero exit code** is decisive: -1 (the command failed, whatever else it printed);
* otherwise, only negative signals (a traceback, an error line, a failed test summary, HTTP 4xx/5xx,
  ...) give -1 and only positive ones (exit code 0, tests passed, HTTP 2xx, a build that finished,
  ...) give +1 — so ``exit code: 0`` with empty output (a silent success) and a build with warnings
  only are +1;
* a **JSON result that contradicts the response** (:mod:`openclaw_rl.judge.claims`: the response
  says "booked the 3pm slot", the result ``{"status": "ok", "booked": "16:00"}``; other times, dates,
  weekdays, addresses, amounts, counts, states, zero effect, failed items) is decisive -1, whatever
  its status says — a status is the success of *some* action, not necessarily the one reported; one
  that holds the values the response states (and no failure) is a positive signal;
* positive and negative signals together (a script that printed a traceback but exited 0), or no
  signal at all, are **not decisive**: the embedding classifier judges the state — except in a
  **long log** (12 or more lines), whose last signal-bearing lines (within the last 6) decide when
  they agree (a retried download early on, ``Successfully installed`` at the end; an exit code 0
  alone does not count); and a long log whose failure lines all come before its last 6 lines is
  left to the classifier.

Every rule is anchored to a whole line (or a machine-only token such as ``error[E0308]``), so prose
— "error handling added", "0 failed", "no errors this time" — does not trigger it; counts are read,
so ``0 failed`` is not a failure. The rules read any role: a user who pastes a traceback reports a
failure, and the tool env without native tool calls relays tool results as user messages.

How this interacts with ``vote_count``: decisive evidence is deterministic, so every one of the
``vote_count`` votes reads the same evidence and agrees — the judge returns ``vote_count`` identical
votes (``raw`` names the rule and the line), and the majority is the evidence's score. Evidence whose
score is outside ``reward_space`` is ignored (the classifier decides).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from openclaw_rl.judge.claims import compare, failed_items

EVIDENCE_VERSION = (
    "evidence-v3"  # part of the embedded head's cache key (the head trains on non-decisive lines)
)


@dataclass(frozen=True)
class Signal:
    """One piece of evidence: the rule that fired, its score and the line it read."""

    score: int  # +1 or -1
    rule: str
    line: str


@dataclass(frozen=True)
class Evidence:
    """What :func:`read_evidence` found. ``score`` is +1 / -1 when decisive, else None."""

    score: int | None
    signals: tuple[Signal, ...] = field(default_factory=tuple)
    reason: str = ""

    @property
    def decisive(self) -> bool:
        return self.score is not None

    def describe(self) -> str:
        """Short text for a vote's ``raw``: the rule and the line that decided."""
        return self.reason


_M = re.MULTILINE
_I = re.IGNORECASE

# ------------------------------------------------------------------------------------ exit codes
_EXIT_RES = [
    # CommandResult.as_observation: "exit code: 1"; "Exit status 2"; "exit code 0."
    re.compile(r"^\s*exit[ _](?:code|status)\s*[:=]?\s*(-?\d+)\s*\.?\s*$", _M | _I),
    # "[exit 0]", "[exit code 127]", "[exit status: 1]"
    re.compile(r"\[\s*exit(?:[ _](?:code|status))?\s*[:=]?\s*(-?\d+)\s*\]", _I),
    # "returncode=2", "return code: 1", "retcode 3", "rc=0"
    re.compile(r"^\s*(?:return[ _]?code|retcode|rc)\s*[:=]\s*(-?\d+)\b", _M | _I),
    # "Process exited with code 1", "Process finished with exit code 0", "exited with status 2"
    re.compile(
        r"\b(?:exited|finished|completed|terminated|returned|failed)\s+with\s+(?:exit\s+|return\s+)?"
        r"(?:code|status)\s*[:=]?\s*(-?\d+)\b",
        _I,
    ),
]
_ECHO_STATUS = re.compile(r"^\s*\$\s*echo\s+\$\?\s*\n\s*(-?\d+)\s*$", _M)

# ------------------------------------------------------------------------------- negative lines
_NEGATIVE_LINES: list[tuple[str, re.Pattern[str]]] = [
    ("traceback", re.compile(r"^\s*Traceback \(most recent call last\):", _M)),
    # Python / JS exception line: "KeyError: 'id'", "json.decoder.JSONDecodeError: ...",
    # "Uncaught ReferenceError: x is not defined", "ZeroDivisionError"
    (
        "exception",
        re.compile(
            r"^\s*(?:Uncaught\s+)?(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)"
            r"(?::\s.*)?\s*$",
            _M,
        ),
    ),
    ("exception", re.compile(r"^\s*Exception in thread \"", _M)),
    (
        "stack frame",
        re.compile(r"^\s+at [\w$.<>\[\] ]+\(?[^()\n]*(?:\.\w+|<anonymous>):\d+(?::\d+)?\)?\s*$", _M),
    ),
    ("panic", re.compile(r"^\s*thread '[^']*' panicked at", _M)),
    ("panic", re.compile(r"^\s*panic: ", _M)),
    ("panic", re.compile(r"^\s*goroutine \d+ \[running\]:", _M)),
    (
        "crash",
        re.compile(r"^\s*(?:Segmentation fault|Bus error|Aborted|Killed)\b(?: \(core dumped\))?\s*$", _M),
    ),
    ("crash", re.compile(r"\(core dumped\)", _M)),
    # "error: ...", "ERROR: ...", "Error: ...", "error[E0308]: ...", "fatal: ...", "E: ..."
    ("error line", re.compile(r"^\s*(?:error|fatal(?: error)?)(?:\[[\w-]+\])?\s*:\s*\S", _M | _I)),
    ("error line", re.compile(r"^\s*E: \S", _M)),
    ("error line", re.compile(r"^\s*npm ERR!", _M)),
    ("error line", re.compile(r"^\s*docker: Error response from daemon", _M)),
    # compilers: gcc / clang / javac "file.c:8:14: error: ...", tsc "file.ts(14,7): error TS2322",
    # rustc "error[E0308]", Go "./main.go:10:6: undefined: x", the linker, make
    ("compiler error", re.compile(r"^\s*\S+:\d+(?::\d+)?:\s*(?:fatal\s+)?error\b", _M | _I)),
    ("compiler error", re.compile(r"^\s*\S+\(\d+,\d+\):\s*error\s+TS\d+", _M)),
    ("compiler error", re.compile(r"\berror\[E\d{4}\]")),
    ("compiler error", re.compile(r"^\s*\S+\.go:\d+:\d+: ", _M)),
    ("compiler error", re.compile(r"undefined reference to [`']")),
    ("compiler error", re.compile(r"^\s*collect2: error", _M)),
    ("compiler error", re.compile(r"^\s*make(?:\[\d+\])?: \*\*\* .*Error \d+", _M)),
    ("compiler error", re.compile(r"^\s*[1-9]\d* errors?\s*$", _M)),
    (
        "build failed",
        re.compile(
            r"^\s*(?:BUILD FAILED|Failed to compile)\b|\berror: could not compile\b|"
            r"^\s*(?:\[ERROR\] )?BUILD FAILURE\b|^\s*FAILURE: Build failed\b|^\s*Build FAILED\.?\s*$|"
            r"^\s*[1-9]\d* Error\(s\)\s*$|^\s*npm error\b|^\s*Apply failed\b|^\s*Deployment failed\b",
            _M,
        ),
    ),
    # shells and coreutils
    ("command not found", re.compile(r"command not found\b", _I)),
    ("no such file", re.compile(r": No such file or directory\b")),
    ("permission denied", re.compile(r"(?:^|: )(?:Permission denied|permission denied:)", _M)),
    ("not permitted", re.compile(r": Operation not permitted\b")),
    (
        "shell error",
        re.compile(
            r"^\s*[\w.+-]+: (?:cannot|can't) (?:access|open|remove|create|stat|read|write|"
            r"find|execute|change)\b",
            _M,
        ),
    ),
    ("shell error", re.compile(r"^\s*[\w.+-]+: (?:invalid|unrecognized|illegal) option\b", _M)),
    ("connection error", re.compile(r"^\s*curl: \(\d+\)", _M)),
    ("connection error", re.compile(r"^\s*ssh: connect to host .*(?:refused|timed out)", _M)),
    (
        "sandbox limit",
        re.compile(
            r"^\s*\[sandbox\] (?:killed:|process ended by signal|file size limit|"
            r"disk quota exceeded)",
            _M,
        ),
    ),
    ("timeout", re.compile(r"^\s*\[?(?:killed after \d+\s*s|timed out after|timeout:)", _M | _I)),
    # test runners: pytest "FAILED tests/x.py::test_y", "ERROR tests/x.py - ...", go "--- FAIL:", "FAIL\tpkg",
    # jest "FAIL  src/x.test.js", unittest "FAILED (failures=1)", cargo "test result: FAILED."
    ("test failed", re.compile(r"^\s*FAILED\s+\S+::", _M)),
    ("test failed", re.compile(r"^\s*ERROR\s+\S+\.py\b", _M)),
    ("test failed", re.compile(r"^\s*--- FAIL:", _M)),
    ("test failed", re.compile(r"^\s*FAIL(?:\s+\S.*)?$", _M)),
    ("test failed", re.compile(r"^\s*FAILED \((?:failures|errors)=\d+", _M)),
    ("test failed", re.compile(r"\btest result: FAILED\b")),
    # the GUI env's checker verdict
    ("task check", re.compile(r"\bCheck: FAILED\b")),
    # deploy tools: a Helm release that failed, a rollout that gave up (Ansible's recap: _ansible_recap)
    ("deploy failed", re.compile(r"^\s*STATUS: (?:failed|pending-(?:install|upgrade|rollback))\s*$", _M)),
    ("deploy failed", re.compile(r"\bexceeded its progress deadline\b")),
]

# ------------------------------------------------------------------------------- positive lines
_POSITIVE_LINES: list[tuple[str, re.Pattern[str]]] = [
    ("tests passed", re.compile(r"\btest result: ok\.")),
    ("tests passed", re.compile(r"^\s*ok\s+\S+\s+(?:[\d.]+m?s|\(cached\))\s*$", _M)),
    ("tests passed", re.compile(r"^\s*PASS(?:\s+\S+)?\s*$", _M)),
    (
        "tests passed",
        re.compile(
            r"^\s*All (?:\d+ )?(?:tests|checks|specs|test cases) (?:passed|pass|succeeded)\b", _M | _I
        ),
    ),
    ("build finished", re.compile(r"^\s*Finished\s+`?\w+`?\s+(?:profile\s+)?\[", _M)),
    ("build finished", re.compile(r"^\s*BUILD SUCCESSFUL\b", _M)),
    ("build finished", re.compile(r"\bcompiled successfully\b", _I)),
    ("installed", re.compile(r"^\s*Successfully installed \S", _M)),
    (
        "succeeded",
        re.compile(
            r"^\s*(?:\W\s*)?Successfully (?:built|tagged|deployed|created|uploaded|pushed|compiled|published|"
            r"updated|applied|migrated|connected|authenticated|completed|finished|started|saved|wrote|"
            r"copied|removed|uninstalled|generated|signed|synced|restored|imported|exported)\b",
            _M | _I,
        ),
    ),
    ("migrated", re.compile(r"^\s*Applying \S+\.\.\. OK\s*$", _M)),
    (
        "server started",
        re.compile(r"^\s*(?:Server (?:is )?(?:running|listening|started)|Listening) (?:at|on) \S", _M | _I),
    ),
    ("installed", re.compile(r"^\s*(?:added|removed|changed) \d+ packages?\b.* in [\d.]+m?s\s*$", _M)),
    ("installed", re.compile(r"^\s*Setting up \S+ \(\S+\) \.\.\.", _M)),
    ("build finished", re.compile(r"^\s*(?:#\d+ )?naming to \S+(?: [\d.]+s)? done\s*$", _M)),
    ("build finished", re.compile(r"^\s*(?:\[INFO\] )?BUILD SUCCESS\s*$", _M)),
    ("build finished", re.compile(r"^\s*Build succeeded\.?\s*$", _M)),
    ("build finished", re.compile(r"^\s*(?:✨\s*)?Done in [\d.]+m?s\.?\s*$", _M)),
    ("build finished", re.compile(r"^\s*✓ (?:built in|Compiled|compiled)\b", _M)),
    ("applied", re.compile(r"^\s*Apply complete! Resources: \d+ added", _M)),
    ("applied", re.compile(r"\bsuccessfully rolled out\b", _M)),
    ("pushed", re.compile(r"^\s*[0-9a-f]{7,}\.\.[0-9a-f]{7,}\s+\S+ -> \S+\s*$", _M)),
    ("file written", re.compile(r"\bwrote \d+ bytes to \S", _I)),
    ("task check", re.compile(r"\bCheck: passed\b")),
    # deploy and migration tools: a deployed Helm release, a migration step ("Running upgrade a ->
    # b"), kubectl apply's per-object lines
    ("deployed", re.compile(r"^\s*STATUS: deployed\s*$", _M)),
    ("deployed", re.compile(r"^\s*Release \S+ has been upgraded\.", _M)),
    ("migrated", re.compile(r"\[alembic\.runtime\.migration\] Running (?:upgrade|downgrade) \S+ -> \S+")),
    ("migrated", re.compile(r"^\s*Liquibase command '\w+' was executed successfully\.", _M)),
    (
        "applied",
        re.compile(r"^\s*[\w.-]+/[\w.-]+ (?:created|configured|unchanged|deleted)\s*$", _M),
    ),
]
_UNITTEST_OK = re.compile(r"^\s*Ran \d+ tests? in [\d.]+s\s*\n(?:\s*\n)*\s*OK\b", _M)

# ------------------------------------------------------------------------------- test summaries
# "2 failed, 10 passed in 1.20s", "Tests: 1 failed, 19 passed, 20 total", "12 passing (230ms)",
# "6 passed; 0 failed; 0 ignored". The word must end the clause, so "12 failed logins" is no summary.
_COUNT = re.compile(
    r"\b(\d+)\s+(passed|passing|failed|failing|failures?|errors?)"
    r"(?=\s*(?:[,;.)=]|$|in\s+[\d.]+\s*m?s\b|\())",
    _M | _I,
)

# ------------------------------------------------------------------------------------ HTTP
_HTTP_REASON = (
    r"OK|Created|Accepted|No Content|Bad Request|Unauthorized|Payment Required|Forbidden|Not Found|"
    r"Method Not Allowed|Not Acceptable|Request Timeout|Conflict|Gone|Unprocessable (?:Entity|Content)|"
    r"Too Many Requests|Internal Server Error|Not Implemented|Bad Gateway|Service Unavailable|"
    r"Gateway Timeout"
)
_HTTP_RES = [
    re.compile(r"^\s*HTTP/\d(?:\.\d)?\s+(\d{3})\b", _M),
    re.compile(rf"^\s*(?:HTTP\s+|Status:\s*|status:\s*)?(\d{{3}})\s+(?:{_HTTP_REASON})\b", _M),
    re.compile(r"^\s*(?:HTTP|status|status[_ ]code|http[_ ]status)\s*[:=]?\s*(\d{3})\b", _M | _I),
    re.compile(r"\b(\d{3}) (?:Client|Server) Error\b"),
    re.compile(r"\breturned error: (\d{3})\b"),
    re.compile(r"^\s*(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)\s+\S+\s*(?:->|=>|:|—|-)\s*(\d{3})\b", _M),
    re.compile(r"\"(?:status|status_code|statusCode)\"\s*:\s*(\d{3})\b"),
]

_JSON_BAD_STATUS = {"error", "failed", "failure", "fail", "rejected", "denied", "invalid"}
_JSON_GOOD_STATUS = {"ok", "success", "succeeded", "created", "done", "completed", "sent", "delivered"}


def _line_of(text: str, start: int) -> str:
    begin = text.rfind("\n", 0, start) + 1
    end = text.find("\n", start)
    return text[begin : end if end >= 0 else len(text)].strip()[:160]


def _exit_codes(text: str) -> list[tuple[int, str]]:
    out = []
    for rx in _EXIT_RES:
        for m in rx.finditer(text):
            out.append((int(m.group(1)), _line_of(text, m.start())))
    for m in _ECHO_STATUS.finditer(text):
        out.append((int(m.group(1)), f"echo $? -> {m.group(1)}"))
    return out


def _json_object(text: str) -> dict | None:
    s = text.strip()
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except (json.JSONDecodeError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


# Boolean outcome fields: ``{"delivered": false}`` is a failure, ``{"sent": true}`` a success. Item
# properties such as ``done`` / ``completed`` of a to-do are not outcomes and are not read.
_JSON_OUTCOME_KEYS = {"delivered", "sent", "saved", "booked", "scheduled", "confirmed", "published",
                      "uploaded", "paid", "charged", "written", "stored", "cancelled", "canceled",
                      "accepted"}  # fmt: skip


def _json_signals(text: str) -> list[Signal]:
    obj = _json_object(text)
    if obj is None:
        return []
    line = text.strip()[:160]
    out = []
    err = obj.get("error", obj.get("errors"))
    if err not in (None, "", [], {}, False):
        out.append(Signal(-1, "json error", line))
    for key in ("ok", "success", "succeeded"):
        if isinstance(obj.get(key), bool):
            out.append(Signal(1 if obj[key] else -1, f"json {key}", line))
    status = obj.get("status", obj.get("state"))
    if isinstance(status, str):
        if status.lower() in _JSON_BAD_STATUS:
            out.append(Signal(-1, "json status", line))
        elif status.lower() in _JSON_GOOD_STATUS:
            out.append(Signal(1, "json status", line))
    for key in sorted(_JSON_OUTCOME_KEYS & set(obj)):
        if isinstance(obj[key], bool):
            out.append(Signal(1 if obj[key] else -1, f"json {key}", line))
    failed = [k for k, _ in failed_items(obj) if k not in ("error", "errors")]
    if failed:
        out.append(Signal(-1, f"json {failed[0]}", line))
    return out


_RECAP_HOST = re.compile(r"^\s*\S+\s*:\s*ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", _M)


def _ansible_recap(text: str) -> list[Signal]:
    """One signal for an Ansible ``PLAY RECAP``: negative if any host failed or was unreachable."""
    hosts = list(_RECAP_HOST.finditer(text))
    if not hosts:
        return []
    bad = [m for m in hosts if int(m.group(1)) or int(m.group(2))]
    if bad:
        return [Signal(-1, "deploy failed", _line_of(text, bad[0].start()))]
    return [Signal(1, "deployed", _line_of(text, hosts[-1].start()))]


def signals(content: str) -> list[Signal]:
    """Every piece of evidence in ``content`` (may disagree; :func:`read_evidence` combines them)."""
    text = content.replace("\r\n", "\n")
    out: list[Signal] = []
    for code, line in _exit_codes(text):
        out.append(Signal(1 if code == 0 else -1, f"exit code {code}", line))
    for rule, rx in _NEGATIVE_LINES:
        m = rx.search(text)
        if m:
            out.append(Signal(-1, rule, _line_of(text, m.start())))
    for rule, rx in _POSITIVE_LINES:
        m = rx.search(text)
        if m:
            out.append(Signal(1, rule, _line_of(text, m.start())))
    if _UNITTEST_OK.search(text):
        out.append(Signal(1, "tests passed", "OK"))
    out += _ansible_recap(text)
    # Test summaries: counts read line by line and added up (mocha prints "2 passing" and
    # "1 failing" on separate lines); any failure or error makes the summary negative.
    bad_lines, good_lines, bad, good = [], [], 0, 0
    for line in text.splitlines():
        counts = _COUNT.findall(line)
        n_bad = sum(int(n) for n, w in counts if w.lower().startswith(("fail", "error")))
        n_good = sum(int(n) for n, w in counts if w.lower().startswith("pass"))
        bad, good = bad + n_bad, good + n_good
        if n_bad:
            bad_lines.append(line.strip()[:160])
        elif n_good:
            good_lines.append(line.strip()[:160])
    if bad:
        out.append(Signal(-1, "test summary", bad_lines[0]))
    elif good:
        out.append(Signal(1, "test summary", good_lines[0]))
    seen_http = set()
    for rx in _HTTP_RES:
        for m in rx.finditer(text):
            code = int(m.group(1))
            if m.start() in seen_http or not 100 <= code <= 599:
                continue
            seen_http.add(m.start())
            if 200 <= code < 300:
                out.append(Signal(1, f"HTTP {code}", _line_of(text, m.start())))
            elif code >= 400:
                out.append(Signal(-1, f"HTTP {code}", _line_of(text, m.start())))
    out += _json_signals(text)
    return out


CONTRADICTION_RULE = "contradicts the response"
CONFIRMS_RULE = "confirms the response"

#: A log of at least this many non-empty lines is "long": its last :data:`TAIL_LINES` lines decide
#: when the signals of the whole log disagree (a retried download, then "Successfully installed").
LONG_LOG_LINES = 12
TAIL_LINES = 6


def _tail_verdict(text: str) -> Signal | None:
    """The verdict of a long log's end: the last lines (at most :data:`TAIL_LINES`) that carry any
    signal, when those signals agree; an exit code 0 alone is passed over (a traceback followed by
    ``exit 0`` stays a conflict), else None."""
    lines = [ln for ln in text.replace("\r\n", "\n").splitlines() if ln.strip()]
    if len(lines) < LONG_LOG_LINES:
        return None
    for k in range(1, TAIL_LINES + 1):
        found = signals("\n".join(lines[-k:]))
        neg = [s for s in found if s.score == -1]
        pos = [s for s in found if s.score == 1]
        if neg and pos:
            return None
        if neg:
            return neg[-1]
        if [s for s in pos if not s.rule.startswith("exit code")]:
            return pos[-1]
    return None


def _failure_only_early(text: str) -> bool:
    """A long log whose failure lines all come before its last lines (a retried step, a warning
    printed as an error) and whose last lines show no failure: its verdict is not in the evidence."""
    lines = [ln for ln in text.replace("\r\n", "\n").splitlines() if ln.strip()]
    if len(lines) < LONG_LOG_LINES:
        return False
    return not [s for s in signals("\n".join(lines[-TAIL_LINES:])) if s.score == -1]


def read_evidence(role: str, content: str, response: str = "") -> Evidence:
    """The decisive score of ``content`` (+1 / -1), or ``Evidence(None)`` when the classifier must judge.

    ``role`` is accepted for symmetry with the classifier; the rules read every role alike.
    ``response`` is what the agent said and called (text and tool-call arguments): a JSON result
    that contradicts it (:mod:`openclaw_rl.judge.claims` — "booked 3pm" vs ``"booked": "16:00"``)
    is decisive -1 whatever its status says.
    """
    found = signals(content)
    if response:
        obj = _json_object(content)
        if obj is not None:
            wrong, agree = compare(response, obj)
            if agree and not [s for s in found if s.score == -1]:
                # the result echoes what the agent said it did ("booked 3pm" / "booked": "15:00")
                found.append(Signal(1, CONFIRMS_RULE, f"{', '.join(agree)} as stated"))
            if wrong:
                sig = tuple(Signal(-1, "contradicts the response", c.describe()) for c in wrong) + tuple(
                    found
                )
                return Evidence(
                    -1, sig, f"evidence: the result contradicts the response ({wrong[0].describe()})"
                )
    if not found:
        return Evidence(None)
    failed_exit = [s for s in found if s.rule.startswith("exit code") and s.score == -1]
    if failed_exit:
        s = failed_exit[-1]
        return Evidence(-1, tuple(found), f"evidence: {s.rule} ({s.line!r})")
    neg = [s for s in found if s.score == -1]
    pos = [s for s in found if s.score == 1]
    if neg and not pos and _failure_only_early(content):
        return Evidence(
            None, tuple(found), f"evidence: a long log's failure lines are not at its end ({neg[0].line!r})"
        )
    if neg and pos:
        tail = _tail_verdict(content)
        if tail is not None:
            return Evidence(tail.score, tuple(found), f"evidence: last lines: {tail.rule} ({tail.line!r})")
        return Evidence(
            None,
            tuple(found),
            "evidence conflicts: " + "; ".join(f"{s.rule} ({s.line!r})" for s in (neg[0], pos[0])),
        )
    s = (neg or pos)[0]
    return Evidence(s.score, tuple(found), f"evidence: {s.rule} ({s.line!r})")
