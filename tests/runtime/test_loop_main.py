"""How a loop process logs: its event lines, not one line per HTTP request of its libraries."""

from __future__ import annotations

import subprocess
import sys


def test_a_loops_log_keeps_its_event_lines_and_drops_the_http_libraries_chatter():
    """The API judge asks vote_count times per turn: httpx's (and newer openai SDKs' httpx2)
    "HTTP Request: POST ..." line per request, and openai's retries, were half of a run's log."""
    code = (
        "import logging\n"
        "from openclaw_rl.runtime.loop_main import event_lines\n"
        "event_lines()\n"
        "for name in ('httpx', 'httpx2', 'openai'):\n"
        "    logging.getLogger(name).info('HTTP Request: POST http://judge/v1/chat/completions')\n"
        "logging.getLogger('httpx2').warning('the judge is unreachable')\n"
        "logging.getLogger('openclaw_rl.judge').info('[rollout] step=1 reward=1')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["the judge is unreachable", "[rollout] step=1 reward=1"], out.stdout
