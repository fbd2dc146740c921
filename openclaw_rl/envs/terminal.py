"""``terminal``: small shell tasks run for real in the bubblewrap sandbox.

Each episode is one task from :data:`TASKS` (files, text processing, archives, git, python
scripts). The agent answers with a shell command (a fenced ``bash`` block, or the raw text); the
command runs in the episode's own :class:`~openclaw_rl.envs.sandbox.Sandbox` and the next state is
its stdout, stderr and exit code. After every command the task's checker looks at the sandbox
(files, a command re-run inside the sandbox, or the command's stdout); solved ends the episode with
``info["success"] = True`` and reward 1.

Every task carries an ``oracle`` command that solves it and a ``wrong`` command that does not; the
tests run both, which proves each checker can tell them apart. A fixed subset (:data:`EVAL_TASKS`)
is held out for evaluation and never drawn for training episodes.
"""

from __future__ import annotations

import random
import re
import shlex
import tarfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from openclaw_rl.envs.base import Env, Observation, StepResult, check_turns, register
from openclaw_rl.envs.sandbox import CommandResult, Sandbox, SandboxLimits, check_available

Checker = Callable[[Sandbox, CommandResult], bool]

SYSTEM_PROMPT = (
    "You are working in a Linux shell inside /work. Reply with exactly one shell command in a "
    "```bash code block. You will see its exit code, stdout and stderr. There is no network."
)

_SHELL = ("", "bash", "sh", "shell", "console", "zsh")  # fence labels whose block is a command
_PYTHON = ("python", "python3", "py")


def extract_command(text: str) -> str:
    """The command in the agent's reply: its first ``bash`` (or ``sh``, unlabelled...) fenced block,
    else the raw text when the reply has no fence at all ("" when it has fences but no shell block).

    Fences pair in order, so a block's closing fence never opens another. A block whose closing
    fence never came (the reply was cut at ``max_tokens``) runs as far as it got, rather than as a
    shell syntax error over the fence itself; a ``python`` block runs with ``python3``. Indentation
    common to a block's lines (a block under a list item) and a leading ``$ `` prompt marker on each
    line (models often copy it) are dropped.
    """
    blocks: list[tuple[str, list[str]]] = []
    inside: list[str] | None = None
    for line in text.splitlines():
        fence = line.strip().startswith("```")
        if inside is None and fence:
            inside = []
            blocks.append((line.strip()[3:].strip().lower(), inside))
        elif inside is not None and fence:
            inside = None
        elif inside is not None:
            inside.append(line)
    if not blocks:
        body, lang = text, ""
    else:
        found = next(((lang, lines) for lang, lines in blocks if lang in _SHELL or lang in _PYTHON), None)
        if found is None:
            return ""
        lang, block = found
        body = textwrap.dedent("\n".join(block))
    if lang in _PYTHON:
        return f"python3 -c {shlex.quote(body.strip())}"
    lines = [re.sub(r"^\s*\$ ", "", ln) for ln in body.strip().splitlines()]
    return "\n".join(lines).strip()


def _runs_anything(command: str) -> bool:
    """Whether ``command`` has a line that is not blank or a shell comment."""
    return any(ln.strip() and not ln.strip().startswith("#") for ln in command.splitlines())


@dataclass(frozen=True)
class Task:
    """One shell task: set-up, an instruction, a checker, and two commands for the tests."""

    name: str
    category: Literal["files", "text", "archives", "git", "python"]
    instruction: str
    check: Checker
    oracle: str
    wrong: str
    files: dict[str, str] = field(default_factory=dict)
    setup: str = ""  # a shell command run inside the sandbox after ``files`` are written


# ---- checker helpers (all read through the sandbox, which never follows links out of /work) ----


def _stdout_is(expected: str) -> Checker:
    return lambda sb, last: last.exit_code == 0 and last.stdout.strip() == expected


def _file_is(rel: str, expected: str) -> Checker:
    return lambda sb, last: (sb.read_file(rel) or "").strip() == expected.strip()


def _run_is(command: str, expected: str) -> Checker:
    def check(sb: Sandbox, last: CommandResult) -> bool:
        r = sb.run(command)
        return r.exit_code == 0 and r.stdout.strip() == expected.strip()

    return check


def _all(*checks: Checker) -> Checker:
    return lambda sb, last: all(c(sb, last) for c in checks)


def _tar_members(sb: Sandbox, rel: str) -> set[str]:
    try:
        with tarfile.open(sb.path(rel), "r:*") as tf:
            return {m.name.removeprefix("./") for m in tf.getmembers()}
    except (tarfile.TarError, OSError, PermissionError):
        return set()


ACCESS_LOG = (
    "\n".join(
        [
            "10.0.0.5 - GET /index.html 200",
            "10.0.0.7 - GET /about.html 200",
            "10.0.0.5 - POST /login 302",
            "192.168.1.9 - GET /index.html 404",
            "10.0.0.7 - GET /index.html 200",
            "172.16.0.2 - GET /faq 200",
            "10.0.0.5 - GET /logout 200",
        ]
    )
    + "\n"
)
APP_LOG = "INFO start\nERROR disk full\nINFO retry\nWARN slow\nERROR disk still full\nINFO done\n"
WORDS = "the cat sat on the mat and the dog ate the cat food while a cat slept\n"
SALES = "region,item,amount\nnorth,pens,12\nsouth,paper,30\nnorth,ink,7\neast,pens,51\n"
FIZZ = "\n".join(
    "FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
    for i in range(1, 16)
)
_REPO3 = (
    "git init -q repo && cd repo && for i in 1 2 3; do echo $i > f$i.txt && git add . && "
    'git commit -qm "commit $i"; done'
)

TASKS: list[Task] = [
    # files
    Task(
        "create_file",
        "files",
        "Create a file hello.txt containing the single line: hello world",
        _file_is("hello.txt", "hello world"),
        "echo 'hello world' > hello.txt",
        "echo 'hello' > hello.txt",
    ),
    Task(
        "make_dirs",
        "files",
        "Create the directories project/src and project/tests and an empty file project/README.md.",
        lambda sb, last: (
            sb.path("project/src").is_dir()
            and sb.path("project/tests").is_dir()
            and sb.read_file("project/README.md") == ""
        ),
        "mkdir -p project/src project/tests && touch project/README.md",
        "mkdir -p project/src",
    ),
    Task(
        "rename_ext",
        "files",
        "Rename every .txt file in notes/ to the same name with a .md extension.",
        lambda sb, last: (
            sorted(p.name for p in sb.path("notes").iterdir()) == ["a.md", "b.md", "c.md"]
            and sb.read_file("notes/b.md") == "bee\n"
        ),
        'cd notes && for f in *.txt; do mv "$f" "${f%.txt}.md"; done',
        "cd notes && mv a.txt a.md",
        files={"notes/a.txt": "ay\n", "notes/b.txt": "bee\n", "notes/c.txt": "see\n"},
    ),
    Task(
        "delete_logs",
        "files",
        "Delete every file ending in .log anywhere under logs/, but keep all other files.",
        lambda sb, last: (
            not sb.exists("logs/a.log")
            and not sb.exists("logs/sub/b.log")
            and sb.exists("logs/keep.txt")
            and sb.exists("logs/sub/keep.cfg")
        ),
        "find logs -name '*.log' -type f -delete",
        "rm -rf logs/*",
        files={
            "logs/a.log": "x\n",
            "logs/keep.txt": "k\n",
            "logs/sub/b.log": "y\n",
            "logs/sub/keep.cfg": "c\n",
        },
    ),
    Task(
        "copy_largest",
        "files",
        "Copy the largest file in data/ to largest.dat (keep the original).",
        lambda sb, last: sb.read_file("largest.dat") == "x" * 300 and sb.exists("data/two.dat"),
        'cp "data/$(ls -S data | head -n1)" largest.dat',
        "cp data/one.dat largest.dat",
        files={"data/one.dat": "x" * 10, "data/two.dat": "x" * 300, "data/three.dat": "x" * 50},
    ),
    Task(
        "make_executable",
        "files",
        "Make the script run.sh executable, then run it.",
        lambda sb, last: bool(sb.path("run.sh").stat().st_mode & 0o100) and "ran ok" in last.stdout,
        "chmod +x run.sh && ./run.sh",
        "bash run.sh",
        files={"run.sh": "#!/bin/sh\necho ran ok\n"},
    ),
    Task(
        "count_files",
        "files",
        "Print only the number of regular files under tree/ (recursively).",
        _stdout_is("5"),
        "find tree -type f | wc -l",
        "ls tree | wc -l",
        files={"tree/a": "", "tree/b": "", "tree/x/c": "", "tree/x/y/d": "", "tree/z/e": ""},
    ),
    # text processing
    Task(
        "count_lines",
        "text",
        "Print only the number of lines in access.log.",
        _stdout_is("7"),
        "wc -l < access.log",
        "wc -w < access.log",
        files={"access.log": ACCESS_LOG},
    ),
    Task(
        "unique_ips",
        "text",
        "Write the distinct IP addresses (first field) of access.log to ips.txt, one per line, sorted.",
        _file_is("ips.txt", "10.0.0.5\n10.0.0.7\n172.16.0.2\n192.168.1.9"),
        "cut -d' ' -f1 access.log | sort -u > ips.txt",
        "cut -d' ' -f1 access.log > ips.txt",
        files={"access.log": ACCESS_LOG},
    ),
    Task(
        "grep_errors",
        "text",
        "Write the lines of app.log that contain ERROR to errors.txt, in order.",
        _file_is("errors.txt", "ERROR disk full\nERROR disk still full"),
        "grep ERROR app.log > errors.txt",
        "grep -v ERROR app.log > errors.txt",
        files={"app.log": APP_LOG},
    ),
    Task(
        "replace_word",
        "text",
        "Replace every occurrence of 'colour' with 'color' in doc.txt, in place.",
        _file_is("doc.txt", "The color red.\nA colorful color chart."),
        "sed -i 's/colour/color/g' doc.txt",
        "sed -i 's/colour/color/' doc.txt",
        files={"doc.txt": "The colour red.\nA colourful colour chart.\n"},
    ),
    Task(
        "csv_sum",
        "text",
        "Print only the sum of the amount column of sales.csv (skip the header).",
        _stdout_is("100"),
        "tail -n +2 sales.csv | cut -d, -f3 | paste -sd+ | bc",
        "tail -n +2 sales.csv | cut -d, -f3 | head -n1",
        files={"sales.csv": SALES},
    ),
    Task(
        "top_word",
        "text",
        "Print only the most frequent word in words.txt.",
        _stdout_is("the"),
        "tr ' ' '\\n' < words.txt | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}'",
        "tr ' ' '\\n' < words.txt | sort | uniq -c | sort -n | head -n1 | awk '{print $2}'",
        files={"words.txt": WORDS},
    ),
    Task(
        "sort_numbers",
        "text",
        "Sort the numbers in numbers.txt from largest to smallest into sorted.txt.",
        _file_is("sorted.txt", "100\n42\n9\n3\n-5"),
        "sort -rn numbers.txt > sorted.txt",
        "sort -r numbers.txt > sorted.txt",
        files={"numbers.txt": "9\n100\n-5\n42\n3\n"},
    ),
    Task(
        "json_field",
        "text",
        'Print only the value of the "version" field of package.json (no quotes).',
        _stdout_is("2.4.1"),
        "python3 -c \"import json; print(json.load(open('package.json'))['version'])\"",
        "grep version package.json",
        files={"package.json": '{"name": "demo", "version": "2.4.1", "private": true}\n'},
    ),
    # archives
    Task(
        "make_tarball",
        "archives",
        "Create a gzip-compressed tar archive backup.tar.gz of the docs/ directory.",
        lambda sb, last: {"docs/a.txt", "docs/b.txt"} <= _tar_members(sb, "backup.tar.gz"),
        "tar czf backup.tar.gz docs",
        "tar czf backup.tar.gz docs/a.txt",
        files={"docs/a.txt": "a\n", "docs/b.txt": "b\n"},
    ),
    Task(
        "extract_archive",
        "archives",
        "Extract the archive bundle.tar.gz into a new directory out/.",
        _all(_file_is("out/readme.txt", "bundled readme"), _file_is("out/lib/util.txt", "util")),
        "mkdir -p out && tar xzf bundle.tar.gz -C out",
        "tar tzf bundle.tar.gz",
        files={"src/readme.txt": "bundled readme\n", "src/lib/util.txt": "util\n"},
        setup="tar czf bundle.tar.gz -C src . && rm -rf src",
    ),
    Task(
        "gzip_keep",
        "archives",
        "Compress big.txt to big.txt.gz while keeping big.txt.",
        _all(_run_is("gunzip -c big.txt.gz | wc -l", "1000"), lambda sb, last: sb.exists("big.txt")),
        "gzip -k big.txt",
        "gzip big.txt",
        setup="seq 1 1000 > big.txt",
    ),
    Task(
        "archive_list",
        "archives",
        "Print only the number of files inside the archive pack.tar.gz.",
        _stdout_is("3"),
        "tar tzf pack.tar.gz | grep -v '/$' | wc -l",
        "ls | wc -l",
        files={"p/one": "1\n", "p/two": "2\n", "p/three": "3\n"},
        setup="tar czf pack.tar.gz p && rm -rf p",
    ),
    # git
    Task(
        "git_init_commit",
        "git",
        "Make repo/ a git repository and commit the file main.py in it with the message: initial commit",
        _run_is("git -C repo log --format=%s -- main.py", "initial commit"),
        "cd repo && git init -q && git add main.py && git commit -qm 'initial commit'",
        "cd repo && git init -q && git add main.py",
        files={"repo/main.py": "print('hi')\n"},
    ),
    Task(
        "git_branch",
        "git",
        "In the git repository repo/, create a branch named feature and commit a new file feature.txt on it.",
        _run_is("git -C repo ls-tree -r --name-only feature -- feature.txt", "feature.txt"),
        "cd repo && git checkout -qb feature && echo new > feature.txt && git add feature.txt && "
        "git commit -qm 'add feature'",
        "cd repo && git branch feature && echo new > feature.txt",
        setup=_REPO3,
    ),
    Task(
        "git_count_commits",
        "git",
        "Print only the number of commits in the git repository repo/.",
        _stdout_is("3"),
        "git -C repo rev-list --count HEAD",
        "git -C repo log --oneline | head -n1",
        setup=_REPO3,
    ),
    Task(
        "git_restore",
        "git",
        "Someone broke f2.txt in the git repository repo/. Restore it to its last committed version.",
        _all(_file_is("repo/f2.txt", "2"), _run_is("git -C repo status --porcelain", "")),
        "cd repo && git checkout -- f2.txt",
        "cd repo && git add f2.txt",
        setup=_REPO3 + " && echo broken > f2.txt",
    ),
    # python
    Task(
        "py_fizzbuzz",
        "python",
        "Write a Python script fizz.py that prints FizzBuzz for 1 to 15 (Fizz for multiples of 3, Buzz "
        "for 5, FizzBuzz for both, else the number), one per line.",
        _run_is("python3 fizz.py", FIZZ),
        "cat > fizz.py <<'EOF'\nfor i in range(1, 16):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' "
        "if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)\nEOF",
        "echo 'for i in range(1, 16): print(i)' > fizz.py",
    ),
    Task(
        "py_fix_bug",
        "python",
        "calc.py should print 5 but does not. Fix the bug in calc.py.",
        _run_is("python3 calc.py", "5"),
        "sed -i 's/a - b/a + b/' calc.py",
        "sed -i 's/a - b/a * b/' calc.py",
        files={"calc.py": "def add(a, b):\n    return a - b\n\n\nprint(add(2, 3))\n"},
    ),
    Task(
        "py_mean",
        "python",
        "Print only the mean of the numbers in nums.txt, rounded to 2 decimals.",
        _stdout_is("4.33"),
        "python3 -c \"v=[float(x) for x in open('nums.txt')]; print(f'{sum(v)/len(v):.2f}')\"",
        "python3 -c \"v=[float(x) for x in open('nums.txt')]; print(sum(v))\"",
        files={"nums.txt": "2\n5\n6\n"},
    ),
]

TASKS_BY_NAME = {t.name: t for t in TASKS}
# Held out for evaluation: one or two per category, never drawn for training episodes.
EVAL_TASKS = ("count_files", "unique_ips", "csv_sum", "archive_list", "git_count_commits", "py_mean")


def task_names(split: Literal["train", "eval", "all"] = "train") -> list[str]:
    """Names of the tasks in a split: ``eval`` is :data:`EVAL_TASKS`, ``train`` the rest."""
    if split == "all":
        return [t.name for t in TASKS]
    if split == "eval":
        return list(EVAL_TASKS)
    if split == "train":
        return [t.name for t in TASKS if t.name not in EVAL_TASKS]
    raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")


@register("terminal")
class TerminalEnv(Env):
    """One shell task per episode in a fresh sandbox.

    ``make("terminal", task="csv_sum")`` pins a task; otherwise ``reset(seed)`` draws one from
    ``split``. Observations are text; ``info["messages"]`` holds them as chat messages.
    """

    name = "terminal"

    def __init__(
        self,
        task: str | None = None,
        split: Literal["train", "eval", "all"] = "train",
        max_turns: int = 4,
        limits: SandboxLimits | None = None,
        seed: int | None = None,
        **_: Any,
    ):
        if task is not None and task not in TASKS_BY_NAME:
            raise ValueError(f"unknown terminal task {task!r}; known: {sorted(TASKS_BY_NAME)}")
        check_available()  # no bubblewrap: say so now, so the environment service skips the type
        self.fixed_task = task
        self.names = task_names(split)
        self.max_turns = check_turns("max_turns", max_turns)
        self.limits = limits or SandboxLimits()
        self.rng = random.Random(seed)
        self.sandbox: Sandbox | None = None
        self.task: Task | None = None
        self.turns = 0

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        if seed is not None:
            self.rng = random.Random(seed)
        self.close()
        name = (options or {}).get("task") or self.fixed_task or self.rng.choice(self.names)
        self.task = TASKS_BY_NAME[name]
        self.sandbox = Sandbox(self.limits)
        for rel, content in self.task.files.items():
            self.sandbox.write_file(rel, content)
        if self.task.setup:
            r = self.sandbox.run(self.task.setup)
            if r.exit_code != 0:  # a broken task is our bug, not the agent's
                raise RuntimeError(f"terminal task {name}: set-up failed: {r.as_observation()}")
        self.turns = 0
        obs = f"Task: {self.task.instruction}"
        return obs, {
            "task": name,
            "category": self.task.category,
            "next_state_role": "user",
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs}],
        }

    def step(self, action: str | dict[str, Any]) -> StepResult:
        if self.sandbox is None or self.task is None:
            raise RuntimeError("call reset() before step()")
        text = action if isinstance(action, str) else str(action.get("content") or "")
        self.turns += 1
        command = extract_command(text)
        if not _runs_anything(command):
            # a reply of comments only ("#!/bin/bash\n# first, list the files") does nothing: running
            # it would exit 0 and read as a success
            result = CommandResult(
                command="",
                stdout="",
                stderr="no command found in the reply" + (" (only comments)" if command else ""),
                exit_code=2,
                elapsed_s=0.0,
                notes=["reply with one command in a ```bash block"],
            )
            success = False
        else:
            result = self.sandbox.run(command)
            success = bool(self.task.check(self.sandbox, result))
        obs = result.as_observation()
        truncated = not success and self.turns >= self.max_turns
        info = {
            "task": self.task.name,
            "command": command,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "success": success,
            "next_state_role": "environment",
            "messages": [{"role": "user", "content": obs}],
        }
        return obs, 1.0 if success else 0.0, success, truncated, info

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
