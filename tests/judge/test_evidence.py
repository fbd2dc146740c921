"""Evidence rules: exit codes, tracebacks, HTTP statuses, test summaries, compiler / shell errors —
in the formats this project's environments produce and common generic ones — and the tricky
negatives that must not fire. Pure regex work: no model is loaded."""

from __future__ import annotations

import pytest

from openclaw_rl.envs.sandbox import CommandResult
from openclaw_rl.judge.evidence import read_evidence, signals


def observation(exit_code: int, stdout: str = "", stderr: str = "", notes: list[str] | None = None) -> str:
    """What the terminal env / the tool env's python tool really show the agent."""
    return CommandResult(
        command="cmd", stdout=stdout, stderr=stderr, exit_code=exit_code, elapsed_s=0.1, notes=notes or []
    ).as_observation()


@pytest.mark.parametrize(
    "text, expected",
    [
        # the sandbox's own format (terminal env, tool env's python tool)
        (observation(0), 1),  # silent success
        (observation(0, "42\n"), 1),
        (observation(0, "done\n", "x.py:3: DeprecationWarning: old api\n"), 1),  # warnings only
        (observation(1), -1),  # failure with no output at all
        (observation(2, "", "ls: cannot access 'x': No such file or directory\n"), -1),
        (observation(127, "", "bash: line 1: jq: command not found\n"), -1),
        (observation(124, "working\n", "", ["killed: wall-clock timeout of 10s exceeded"]), -1),
        (observation(1, "3 passed\n"), -1),  # a non-zero exit decides
        ("[tool python result]\n" + observation(0, "7\n"), 1),  # relayed as a user message
        # generic exit-code formats
        ("[exit 0]", 1),
        ("[exit code 0]", 1),
        ("$ touch a\n[exit code 0]", 1),
        ("Process finished with exit code 0", 1),
        ("exit status 0", 1),
        ("returncode=0", 1),
        ("rc=0", 1),
        ("$ true\n$ echo $?\n0", 1),
        ("[exit 1]", -1),
        ("exit code: 2", -1),
        ("Exit Status 3", -1),
        ("returncode=2\nstderr: boom", -1),
        ("return code: 1", -1),
        ("Process exited with code 1", -1),
        ("Error: Process completed with exit code 1.", -1),
        ("exit status 2", -1),
        ("$ make\n$ echo $?\n2", -1),
    ],
)
def test_exit_codes(text, expected):
    assert read_evidence("tool", text).score == expected


@pytest.mark.parametrize(
    "text",
    [
        "Traceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    f()\nKeyError: 'id'",
        "ZeroDivisionError: division by zero",
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        "requests.exceptions.HTTPError: 502 Server Error: Bad Gateway for url: http://x/y",
        "TypeError: Cannot read properties of undefined (reading 'map')\n    at render (/app/src/List.js:14:22)",
        "Uncaught ReferenceError: x is not defined",
        'Exception in thread "main" java.lang.IllegalStateException: closed\n\tat com.x.Main.run(Main.java:9)',
        "thread 'main' panicked at src/lib.rs:4:5:\nattempt to divide by zero",
        "panic: runtime error: index out of range [5] with length 3\n\ngoroutine 1 [running]:",
        "Segmentation fault (core dumped)",
    ],
)
def test_tracebacks_are_negative(text):
    ev = read_evidence("tool", text)
    assert ev.score == -1, ev


@pytest.mark.parametrize(
    "text, expected",
    [
        ("HTTP/1.1 200 OK\nContent-Type: text/html", 1),
        ("HTTP/2 204", 1),
        ("201 Created", 1),
        ("status=200 body={}", 1),
        ('{"status": 200, "body": {"id": 3}}', 1),
        ("POST /api/items -> 201", 1),
        ("HTTP/1.1 404 Not Found", -1),
        ("HTTP 500 Internal Server Error", -1),
        ("Status: 403 Forbidden", -1),
        ("429 Too Many Requests", -1),
        ("GET /users/9 -> 404", -1),
        ("curl: (22) The requested URL returned error: 503", -1),
        ("curl: (7) Failed to connect to localhost port 80: Connection refused", -1),
        ('{"error": {"code": 401, "message": "bad key"}}', -1),
        ("HTTP/1.1 301 Moved Permanently", None),  # a redirect says nothing either way
    ],
)
def test_http_statuses(text, expected):
    assert read_evidence("tool", text).score == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("===== 14 passed in 0.82s =====", 1),
        ("===== 31 passed, 2 skipped, 0 failed in 3.40s =====", 1),  # "0 failed" is not a failure
        ("Tests:       8 passed, 8 total", 1),
        ("  12 passing (230ms)", 1),
        ("test result: ok. 6 passed; 0 failed; 0 ignored", 1),
        ("ok  \tgithub.com/acme/calc\t0.012s", 1),
        ("PASS  src/utils.test.ts", 1),
        ("Ran 4 tests in 0.003s\n\nOK", 1),
        ("All 12 checks passed.", 1),
        ("===== 3 passed, 1 failed in 0.5s =====", -1),
        ("Tests:       1 failed, 19 passed, 20 total", -1),
        ("  2 passing (20ms)\n  1 failing", -1),
        ("test result: FAILED. 3 passed; 1 failed; 0 ignored", -1),
        ("FAILED tests/test_api.py::test_create - assert 500 == 201", -1),
        ("ERROR tests/test_db.py - ModuleNotFoundError: No module named 'psycopg2'", -1),
        ("--- FAIL: TestParse (0.00s)\nFAIL", -1),
        ("FAIL  src/cart.test.js", -1),
        ("Ran 5 tests in 0.010s\n\nFAILED (failures=1, errors=1)", -1),
        ("===== 1 error in 0.31s =====", -1),
    ],
)
def test_test_summaries(text, expected):
    assert read_evidence("tool", text).score == expected


@pytest.mark.parametrize(
    "text",
    [
        "main.c:8:14: error: expected ';' before 'return'",
        "App.java:5: error: cannot find symbol\n1 error",
        "src/index.ts(14,7): error TS2322: Type 'string' is not assignable to type 'number'.",
        "error[E0308]: mismatched types\n --> src/lib.rs:12:20",
        "./main.go:10:6: undefined: fmt.Printl",
        "/usr/bin/ld: main.o: undefined reference to `sum'\ncollect2: error: ld returned 1 exit status",
        "make: *** [Makefile:12: build] Error 1",
        "bash: pyhton: command not found",
        "zsh: command not found: jq",
        "cat: notes.txt: No such file or directory",
        "rm: cannot remove 'build': Permission denied",
        "fatal: not a git repository (or any of the parent directories): .git",
        "npm ERR! code ENOENT",
        "E: Unable to locate package foo",
        "ERROR: No matching distribution found for torchh",
        # the tool env's and GUI env's own error observations
        "error: unknown tool 'browse'; available tools: python, calculator, file",
        "error: file: 'data.csv' does not exist or is not a regular file",
        "Step 4 of 15. Action: click 9\nError: click 9 failed: there is no element [9] on the page\n"
        "No visible change on the page.",
        "Step 8 of 20. Action: done\nYou declared the task done. Check: FAILED — the cart is empty.",
        '{"ok": false, "error": "order 5512 not found"}',
    ],
)
def test_compiler_shell_and_env_errors_are_negative(text):
    assert read_evidence("tool", text).score == -1


@pytest.mark.parametrize(
    "text",
    [
        "    Finished `release` profile [optimized] target(s) in 3.07s",
        "warning: unused variable: `n`\n --> src/main.rs:3:9\n\n    Finished `dev` profile [unoptimized] target(s) in 0.4s",
        "BUILD SUCCESSFUL in 12s",
        "webpack 5.88.2 compiled successfully in 2345 ms",
        "Successfully installed requests-2.31.0",
        "wrote 311 bytes to answer.txt",  # the tool env's file tool
        "Step 9 of 20. Action: done\nYou declared the task done. Check: passed — the note exists.",
        '{"ok": true, "id": 3}',
        '{"status": "ok"}',
        'Release "web" has been upgraded. Happy Helming!\nNAME: web\nSTATUS: deployed\nREVISION: 7',
        "INFO  [alembic.runtime.migration] Running upgrade 3f2a -> 9c1d, add orders index",
        "deployment.apps/api configured\nservice/api unchanged",
        "PLAY RECAP ****\nweb-01 : ok=12 changed=3 unreachable=0 failed=0 skipped=1\n"
        "web-02 : ok=12 changed=3 unreachable=0 failed=0 skipped=1",
    ],
)
def test_successes_are_positive(text):
    assert read_evidence("tool", text).score == 1


@pytest.mark.parametrize(
    "role, text",
    [
        # tricky negatives: prose, counts of zero, words inside identifiers — no decisive evidence
        ("user", "error handling added, thanks"),
        ("tool", "Added error handling to fetch_user()"),
        ("tool", "0 failed"),
        ("tool", "0 passed, 0 failed"),
        ("tool", "0 errors, 0 warnings"),
        ("tool", "found 0 vulnerabilities"),
        ("tool", "user,failed_logins\nalice,3"),
        ("tool", "12 failed logins in the last hour"),
        ("tool", "error_rate=0.02 latency_p99=180ms"),
        ("user", "no errors this time, thanks!"),
        ("user", "what does exit code 1 mean?"),
        ("user", "I'm getting a KeyError when I run it"),
        ("user", "the error is in worker.log, not app.log"),
        ("tool", "DeprecationWarning: datetime.utcnow() is deprecated"),
        ("tool", "warning: unused variable 'tmp' [-Wunused-variable]"),
        ("tool", "exit 1"),  # a line of a script, not a status
        ("tool", '{"error": null, "result": 3}'),
        ("tool", '{"status": "queued", "job": 5}'),
        ("tool", "FAILED"),
        ("tool", "OK"),
        ("environment", "Step 3 of 15. Action: click 4\nNo visible change on the page."),
    ],
)
def test_no_decisive_evidence(role, text):
    ev = read_evidence(role, text)
    assert ev.score is None, ev


def test_conflicting_evidence_is_not_decisive():
    # a script that printed a traceback but exited 0: the classifier decides
    text = observation(0, "", 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n')
    ev = read_evidence("environment", text)
    assert ev.score is None and {s.score for s in ev.signals} == {1, -1}
    assert "conflict" in ev.reason


def test_evidence_names_rule_and_line():
    ev = read_evidence("tool", "$ pytest\n===== 2 failed, 3 passed in 1.0s =====\n[exit code 1]")
    assert ev.score == -1 and "exit code 1" in ev.reason and "[exit code 1]" in ev.reason
    assert any(s.rule == "test summary" for s in signals("===== 2 failed, 3 passed in 1.0s ====="))


def test_an_ansible_recap_with_one_failed_host_is_a_failure_whatever_the_last_line():
    recap = (
        "PLAY RECAP ****\n"
        "web-01 : ok=5 changed=2 unreachable=0 failed=0 skipped=0\n"
        "web-02 : ok=4 changed=1 unreachable=0 failed=1 skipped=0\n"
        "web-03 : ok=5 changed=2 unreachable=0 failed=0 skipped=0"
    )
    ev = read_evidence("environment", recap)
    assert ev.score == -1 and "web-02" in ev.reason
    unreachable = recap.replace("unreachable=0 failed=1", "unreachable=1 failed=0")
    assert read_evidence("environment", unreachable).score == -1
