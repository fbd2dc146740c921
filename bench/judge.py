"""Judge accuracy and throughput on a held-out labelled set.

The cases below were written separately from the training lines in ``openclaw_rl/judge/data``
(no line is shared; the script checks) in three styles: chat (simulated users and
personas), terminal (stdout / stderr / exit code) and tool calls (return value or error trace).

It prints, side by side in one run:

* the embedded ``minilm`` judge's accuracy with ``vote_count`` 1 and 3, per style, and judged
  turns per second (score + hint, as the service runs it);
* the ``local`` LLM judge (SmolLM2-135M-Instruct by default; ``--local-model DIR`` for another) for
  comparison — unless ``--skip-local``.

Usage::

    .venv/bin/python bench/judge.py [--skip-local] [--local-model DIR] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl.config import Config, PrmServiceConfig  # noqa: E402
from openclaw_rl.judge.minilm import load_examples  # noqa: E402
from openclaw_rl.types import NextState  # noqa: E402

# (style, role, response, next_state, expected score)
CASES: list[tuple[str, str, str, str, int]] = [
    # ---------------------------------------------------------------- chat: positive
    ("chat", "user", "Natalia sold 48 clips in April and half as many in May, so 72 in total.",
     "Yes, 72 is what I got too. Can we do the next one?", 1),
    ("chat", "user", "Here is a friendlier version of your email to the landlord.",
     "This is great, I'm sending it now. Thanks a lot!", 1),
    ("chat", "user", "The function now handles empty lists by returning 0.",
     "works now, appreciate it. could you also add type hints?", 1),
    ("chat", "user", "Your meeting is scheduled for Tuesday at 10am.",
     "perfect, and put a reminder the day before please", 1),
    ("chat", "user", "Photosynthesis turns light, water and CO2 into sugar and oxygen.",
     "oh that makes sense now. what about respiration?", 1),
    ("chat", "user", "I've drafted the cover letter in a warm, plain style.",
     "that reads like me, nice. ok now the thank-you note", 1),
    ("chat", "user", "Half of 350 is 175, minus 40 leaves 135 dollars.",
     "right on. I'll move to question 5", 1),
    ("chat", "user", "Sure — the train takes 2.5 hours, so you arrive at 4:30pm.",
     "great thanks, that helps me plan", 1),
    ("chat", "user", "Renamed the variables to snake_case throughout.",
     "looks clean. thanks, can you commit it?", 1),
    ("chat", "user", "Here's the recipe scaled to 6 servings.",
     "exactly what I wanted, cheers!", 1),
    ("chat", "user", "The answer is 9 pencils left.", "correct, well done! next question please", 1),
    ("chat", "user", "I summarised the article in two short paragraphs.",
     "much clearer than the original, thank you", 1),
    # ---------------------------------------------------------------- chat: negative
    ("chat", "user", "**Step 1:** Multiply 12 by 4.\n**Step 2:** Add 7.\n**Answer: 55**",
     "you sound like a textbook. drop the bold and the numbered steps, just talk to me", -1),
    ("chat", "user", "1. Open the app\n2. Tap settings\n3. Choose privacy",
     "ugh lists again. can you write this as normal sentences?", -1),
    ("chat", "user", "The total cost is $45.", "no, that's off — you forgot the tax, it should be more", -1),
    ("chat", "user", "Here's a 600-word overview of the French Revolution...",
     "way too much, I need like two sentences", -1),
    ("chat", "user", "Dear Sir or Madam, I hereby wish to inform you...",
     "too stiff. sound like a normal person please", -1),
    ("chat", "user", "She has 14 marbles left.",
     "that's not it. re-read it: she gives away a third, not 3", -1),
    ("chat", "user", "Sure! 😊 Here you go! 🎉", "please cut the emojis", -1),
    ("chat", "user", "In JavaScript you can use Array.map for that.",
     "I'm writing Rust though, not JS", -1),
    ("chat", "user", "The capital of Australia is Sydney.", "wrong. it's Canberra", -1),
    ("chat", "user", "Here is the table of results you asked for.",
     "let me say it differently: I want just the biggest number, nothing else", -1),
    ("chat", "user", "I apologize for the confusion! Let me try again. I apologize...",
     "enough apologising, just fix the answer", -1),
    ("chat", "user", "# Summary\n## Key points\n- point one",
     "no headings, it's a text message to my mom", -1),
    ("chat", "user", "The recipe needs 3 cups of flour.", "that doesn't match what I asked. do it again", -1),
    ("chat", "user", "Here's the code in Java.", "I said Go. redo it in Go", -1),
    # ---------------------------------------------------------------- chat: neutral
    ("chat", "user", "The answer is 35 minutes.", "btw do you know any good pizza places?", 0),
    ("chat", "user", "Sure, here is the poem.", "hmm ok", 0),
    ("chat", "user", "That function returns a list.", "gotta run, talk later", 0),
    ("chat", "user", "Paris is the capital of France.", "what's your name?", 0),
    ("chat", "user", "Here is the schedule.", "hang on, someone's at the door", 0),
    ("chat", "user", "The sum is 12.", "random question — is a tomato a fruit?", 0),
    # ---------------------------------------------------------------- terminal: positive
    ("terminal", "tool", "ls -la /var/log", "total 48\ndrwxr-xr-x  2 root root 4096 syslog\n[exit code 0]", 1),
    ("terminal", "tool", "python3 solve.py", "answer: 156\n[exit code 0]", 1),
    ("terminal", "tool", "pytest tests/test_io.py",
     "===== 14 passed in 1.02s =====\n[exit code 0]", 1),
    ("terminal", "tool", "git status", "On branch main\nnothing to commit, working tree clean\n[exit code 0]", 1),
    ("terminal", "tool", "du -sh data", "1.3G\tdata\n[exit code 0]", 1),
    ("terminal", "tool", "node build.js", "Build complete: dist/app.js (42 kB)\n[exit code 0]", 1),
    ("terminal", "tool", "head -n 2 users.csv", "id,name\n1,Ana\n[exit code 0]", 1),
    ("terminal", "tool", "cp a.txt b.txt && echo copied", "copied\n[exit code 0]", 1),
    # ---------------------------------------------------------------- terminal: negative
    ("terminal", "tool", "pyton3 solve.py", "bash: pyton3: command not found\n[exit code 127]", -1),
    ("terminal", "tool", "python3 solve.py",
     "Traceback (most recent call last):\n  File \"solve.py\", line 9\nNameError: name 'totl' is not defined\n[exit code 1]", -1),
    ("terminal", "tool", "pytest", "E   AssertionError: expected 5, got 4\n===== 1 failed, 9 passed =====\n[exit code 1]", -1),
    ("terminal", "tool", "cat config.yml", "cat: config.yml: No such file or directory\n[exit code 1]", -1),
    ("terminal", "tool", "gcc main.c", "main.c:12:5: error: unknown type name 'strin'\n[exit code 1]", -1),
    ("terminal", "tool", "chmod 777 /root", "chmod: changing permissions of '/root': Operation not permitted\n[exit code 1]", -1),
    ("terminal", "tool", "ssh build@host", "ssh: connect to host host port 22: Connection timed out\n[exit code 255]", -1),
    ("terminal", "tool", "pip install nump", "ERROR: No matching distribution found for nump\n[exit code 1]", -1),
    ("terminal", "tool", "tar xf backup.tar", "tar: backup.tar: Cannot open: No such file or directory\n[exit code 2]", -1),
    # ---------------------------------------------------------------- terminal: neutral
    ("terminal", "tool", "sleep 2", "[exit code 0]", 0),
    # ---------------------------------------------------------------- tool calls: positive
    ("tool_call", "tool", "get_weather(city='Oslo')", '{"city": "Oslo", "temp_c": -3, "sky": "snow"}', 1),
    ("tool_call", "tool", "calculator(expression='17*23')", '{"value": 391}', 1),
    ("tool_call", "tool", "send_message(to='tom', text='running late')", '{"delivered": true, "id": "m_771"}', 1),
    ("tool_call", "tool", "create_event(title='Dentist', date='2025-03-04')", '{"event_id": 5521, "status": "created"}', 1),
    ("tool_call", "tool", "read_file(path='notes.md')", '"# Notes\\n- buy milk\\n- call Ana"', 1),
    ("tool_call", "tool", "search_flights(from='LIS', to='BER')", '{"flights": [{"no": "TP540", "price": 129}]}', 1),
    ("tool_call", "tool", "write_file(path='out.txt', content='hi')", 'wrote 2 bytes to out.txt', 1),
    ("tool_call", "tool", "convert_currency(amount=10, to='JPY')", '{"amount": 1612.4, "currency": "JPY"}', 1),
    # ---------------------------------------------------------------- tool calls: negative
    ("tool_call", "tool", "get_weather(town='Oslo')", 'Error: unexpected keyword argument "town"', -1),
    ("tool_call", "tool", "calculator(expression='17*/23')", 'SyntaxError: invalid syntax at position 3', -1),
    ("tool_call", "tool", "read_file(path='/secret/keys')", 'PermissionError: access to /secret/keys is not allowed', -1),
    ("tool_call", "tool", "send_mesage(to='tom')", '{"error": "no such tool: send_mesage"}', -1),
    ("tool_call", "tool", "create_event(date='next tuesday')", '{"error": "date: expected ISO 8601 format"}', -1),
    ("tool_call", "tool", "fetch_url(url='http://intranet/x')", 'ConnectionError: Max retries exceeded with url: /x', -1),
    ("tool_call", "tool", "db_query(sql='SELEC * FROM t')", 'sqlite3.OperationalError: near "SELEC": syntax error', -1),
    ("tool_call", "tool", "divide(a=4, b=0)", 'Traceback (most recent call last):\nZeroDivisionError: float division by zero', -1),
    # ---------------------------------------------------------------- tool calls: neutral
    ("tool_call", "tool", "start_export(table='orders')", '{"job": "exp-12", "state": "queued"}', 0),
]


def check_held_out() -> None:
    """Fail loudly if a bench case also appears in the training data."""
    train = {e.next_state.strip().lower() for e in load_examples()}
    overlap = [c[3] for c in CASES if c[3].strip().lower() in train]
    if overlap:
        raise SystemExit(f"bench cases overlap the training data: {overlap}")


async def run_backend(cfg: Config, votes: int) -> tuple[list[int | None], float, int]:
    """Judge every case with ``votes`` votes: (scores, seconds, hints kept)."""
    from openclaw_rl.judge import make_judge

    cfg = cfg.model_copy(update={"prm_service": cfg.prm_service.model_copy(update={"vote_count": votes})})
    judge = make_judge(cfg)
    await judge.score("warm-up", NextState(role="user", content="warm-up"))
    start = time.perf_counter()
    scores: list[int | None] = []
    hints = 0
    for _style, role, response, state, _expected in CASES:
        result = await judge.score(response, NextState(role=role, content=state))
        scores.append(None if result.error else result.score)
        hints += result.hint is not None
    elapsed = time.perf_counter() - start
    await judge.close()
    return scores, elapsed, hints


def accuracy(scores: list[int | None], style: str | None = None) -> float:
    pairs = [(s, c[4]) for s, c in zip(scores, CASES, strict=True) if style is None or c[0] == style]
    return sum(s == e for s, e in pairs) / len(pairs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-local", action="store_true", help="skip the local LLM judge comparison")
    ap.add_argument("--local-model", default="smollm2-135m-instruct", help="model for the local backend")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    check_held_out()
    labels = Counter(c[4] for c in CASES)
    styles = Counter(c[0] for c in CASES)
    base = max(labels.values()) / len(CASES)
    print(f"held-out cases: {len(CASES)} ({dict(styles)}), labels {dict(labels)}, majority-class rate {base:.2f}")
    figures: dict[str, object] = {"cases": len(CASES), "base_rate": base}

    rows = [("minilm", Config(prm_service=PrmServiceConfig(backend="minilm")))]
    if not args.skip_local:
        # Evaluative accuracy only: the LLM's generated hints are not what is compared here, and
        # generating them on a CPU would dominate the run.
        rows.append(("local", Config(prm_service=PrmServiceConfig(
            backend="local", model=args.local_model, extract_instruction=False))))
    for name, cfg in rows:
        t0 = time.perf_counter()
        for votes in (1, 3):
            scores, elapsed, hints = asyncio.run(run_backend(cfg, votes))
            per_style = {s: round(accuracy(scores, s), 2) for s in styles}
            rate = len(CASES) / elapsed
            print(f"{name:7s} vote_count={votes}: accuracy {accuracy(scores):.2f} {per_style}  "
                  f"{rate:.1f} judged turns/s  hints kept {hints}", flush=True)
            figures[f"{name}_v{votes}"] = {"accuracy": accuracy(scores), "per_style": per_style,
                                           "turns_per_s": rate, "hints": hints}
        print(f"{name:7s} wall time incl. model load / head set-up: {time.perf_counter() - t0:.1f}s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
