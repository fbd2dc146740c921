"""``openclaw-rl``: one command, a verb per job.

    openclaw-rl run    --config FILE [--dry-run]          the whole loop (same as python -m openclaw_rl.launch)
    openclaw-rl serve  --config FILE [--host H] [--port P] [--log-dir DIR]  the policy service alone
    openclaw-rl judge  --config FILE --response T --next-state T [--role user|tool]
    openclaw-rl train  --config FILE --samples F.jsonl [--steps N] [--resume] [--log-dir DIR]
    openclaw-rl eval   --config FILE [--checkpoint PATH]
    openclaw-rl status --config FILE
    openclaw-rl samples --config FILE --out F.jsonl [--status S]  the run's samples, for train --samples
    openclaw-rl turns  --config FILE [--last N] [--user U]   the newest turns and their ids (to rate)
    openclaw-rl openclaw-config --config FILE [--api T] [--host H] [--port P] [--api-key-env VAR]  OpenClaw's fragment
    openclaw-rl users add NAME --config FILE              a user and their key (shown once)
    openclaw-rl users add NAME --new-key --config FILE    a new key for them; the old one stops working
    openclaw-rl users list --config FILE                  per user: turns, samples, feedback, ...
    openclaw-rl users delete NAME --config FILE           forget a user: every row and file of theirs
    openclaw-rl users export NAME --out DIR --config FILE their adapter (PEFT) and turns (JSONL)

Each verb loads and validates the config first (a bad file exits 2 with every problem listed) and
then imports only the part it needs, so ``status`` never pays for torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from openclaw_rl.config import Config, ConfigError, load_config, print_warnings


def _config(
    path: str, log_dir: str | None = None, reads_only: bool = False, needs_secrets: bool = True
) -> Config:
    """The validated config; ``log_dir``: a verb's ``--log-dir``, which reads or writes that folder
    instead of ``[global] log_dir``. Its warnings (how a run would train or serve) are printed for
    the verbs that run something, not for those that only read a run (``reads_only``). A verb that
    reads only the store needs no API key (``needs_secrets=False``): an operator's shell may lack
    the judge's."""
    cfg = load_config(path, needs_secrets=needs_secrets)
    if not reads_only:
        print_warnings(cfg)
    return cfg if log_dir is None else cfg.with_log_dir(log_dir)


def _cmd_run(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.launch import launch

    return launch(args.config, dry_run=args.dry_run)


def _cmd_serve(args: argparse.Namespace) -> int:
    from openclaw_rl.policy.server import serve_command

    return serve_command(_config(args.config, args.log_dir), args.host, args.port)


def _cmd_judge(args: argparse.Namespace) -> int:
    from openclaw_rl.judge.cli import judge_command

    try:
        response, state = _text_arg(args.response), _text_arg(args.next_state)
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    return judge_command(_config(args.config), response, state, args.role)


def _text_arg(value: str) -> str:
    """A text argument as given, or read from ``@FILE`` / ``-`` (stdin): a 100 KB log does not fit
    a command line."""
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@") and len(value) > 1:
        return Path(value[1:]).read_text(encoding="utf-8", errors="replace")
    return value


def _cmd_train(args: argparse.Namespace) -> int:
    from openclaw_rl.trainer.cli import train_command

    return train_command(_config(args.config, args.log_dir), args.samples, args.steps, args.resume)


def _cmd_eval(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.evaluate import EvalSizes, eval_command

    sizes = EvalSizes(
        chat=args.chat_n, terminal=args.terminal_n, tool_call=args.tool_call_n, max_tokens=args.max_tokens
    )
    return eval_command(_config(args.config, args.log_dir), args.checkpoint, sizes=sizes, out=args.out)


def _cmd_status(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.status import status_command

    return status_command(_config(args.config, args.log_dir, reads_only=True, needs_secrets=False))


def _cmd_samples(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.status import samples_command

    return samples_command(
        _config(args.config, args.log_dir, reads_only=True, needs_secrets=False), args.out, args.status
    )


def _cmd_turns(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.status import turns_command

    return turns_command(
        _config(args.config, args.log_dir, reads_only=True, needs_secrets=False), args.last, args.user
    )


def _cmd_openclaw_config(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.openclaw_config import openclaw_config_command

    return openclaw_config_command(
        _config(args.config, args.log_dir, reads_only=True), args.api, args.host, args.api_key_env, args.port
    )


def _cmd_users(args: argparse.Namespace) -> int:
    from openclaw_rl.launcher.users import users_add, users_delete, users_export, users_list

    cfg = _config(args.config, args.log_dir, reads_only=True)  # users' keys and data, not how it trains
    if args.users_command == "add":
        return users_add(cfg, args.name, args.new_key)
    if args.users_command == "delete":
        return users_delete(cfg, args.name, args.yes)
    if args.users_command == "export":
        return users_export(cfg, args.name, args.out)
    return users_list(cfg)


def _int_in(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` (to ``high``), refused with a message otherwise."""

    def parse(text: str) -> int:
        n = int(text)
        if n < low or (high is not None and n > high):
            span = f"{low}-{high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{what or 'must be'} {span}, got {n}")
        return n

    parse.__name__ = "integer"  # argparse names the type in "invalid integer value: 'abc'"
    return parse


_count, _positive = _int_in(0), _int_in(1)
_port = _int_in(0, 65535, "a TCP port is")  # 0: any free one


def build_parser() -> argparse.ArgumentParser:
    from openclaw_rl.launcher.openclaw_config import API_TYPES  # config and rundir only: light

    parser = argparse.ArgumentParser(
        prog="openclaw-rl", description=__doc__.split("\n\n")[0].replace("``", "")
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def configured(
        p: argparse.ArgumentParser, fn: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        p.add_argument("--config", required=True, help="path to config.toml")
        p.set_defaults(fn=fn, verb_parser=p)  # a stray argument is told with this verb's usage
        return p

    def verb(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        return configured(sub.add_parser(name, help=help_), fn)

    def log_dir_flag(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("--log-dir", metavar="DIR", help=f"{what} this folder instead of [global] log_dir")

    p = verb("run", _cmd_run, "run the four loops (serving, environments, judge, trainer)")
    p.add_argument("--dry-run", action="store_true", help="validate and check every service, then exit")
    p = verb("serve", _cmd_serve, "run the policy service alone")
    p.add_argument("--host", help="address to listen on (default: [policy_service] host)")
    p.add_argument("--port", type=_port, help="port to listen on (default: [policy_service] port)")
    log_dir_flag(p, "serve from (and record into)")
    p = verb("judge", _cmd_judge, "judge one (response, next state) pair and print JSON")
    p.add_argument(
        "--response",
        default="",
        help="the assistant's reply; @FILE reads it from a file, - from stdin (left out: the next state "
        "is judged on its own, without the rules that compare it with the reply)",
    )
    p.add_argument(
        "--next-state",
        required=True,
        help="what followed it (the user's reply, a tool's output, a log); @FILE or - as for --response",
    )
    p.add_argument(
        "--role",
        choices=["user", "tool", "environment"],
        default="user",
        help="who wrote the next state (default: %(default)s)",
    )
    p = verb("train", _cmd_train, "train offline on recorded samples (JSONL)")
    p.add_argument("--samples", required=True, help="the JSONL file (openclaw-rl samples writes one)")
    p.add_argument(
        "--steps",
        type=_positive,
        help="the update count to reach, counting a resumed run's (default: [training] max_steps, else "
        "one pass over the file)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    log_dir_flag(p, "train into (a replay that leaves the run alone)")
    p = verb("eval", _cmd_eval, "evaluate on the held-out set")
    p.add_argument("--checkpoint", help="exported policy directory (default: the base model)")
    from openclaw_rl.launcher.evaluate import EvalSizes  # the defaults live there, once

    p.add_argument(
        "--chat-n",
        type=_count,
        default=EvalSizes.chat,
        help="held-out problems per chat persona (default %(default)s)",
    )
    p.add_argument(
        "--terminal-n",
        type=_count,
        default=EvalSizes.terminal,
        help="held-out terminal tasks (default %(default)s)",
    )
    p.add_argument(
        "--tool-call-n",
        type=_count,
        default=EvalSizes.tool_call,
        help="held-out tool_call episodes (default %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive,
        default=EvalSizes.max_tokens,
        help="max tokens per reply (default %(default)s)",
    )
    p.add_argument("--out", help="where to write the JSON summary (default <log_dir>/eval/)")
    log_dir_flag(p, "write the summary under")
    log_dir_flag(verb("status", _cmd_status, "print the run's counters"), "read")
    from openclaw_rl.runtime.store import SAMPLE_STATUSES

    p = verb(
        "samples", _cmd_samples, "write the run's recorded samples as JSONL (what train --samples reads)"
    )
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--status", choices=SAMPLE_STATUSES, help="only these samples (default: all)")
    log_dir_flag(p, "read")
    p = verb("turns", _cmd_turns, "list the newest recorded turns with the ids POST /v1/feedback rates")
    p.add_argument("--last", type=_positive, default=20, help="how many (default %(default)s)")
    p.add_argument("--user", help="only this user's turns (per_user mode)")
    log_dir_flag(p, "read")
    p = verb(
        "openclaw-config",
        _cmd_openclaw_config,
        "print the openclaw.json fragment that works with this config",
    )
    p.add_argument(
        "--api",
        choices=list(API_TYPES),
        default="openai-completions",
        help="the protocol OpenClaw speaks to the service (default %(default)s)",
    )
    p.add_argument(
        "--host",
        metavar="ADDRESS",
        help="the address OpenClaw reaches the service at (default: the service's host; loopback "
        "when it binds every address)",
    )
    p.add_argument(
        "--port",
        type=_port,
        help="the port the service listens on, when started with `serve --port` (default: the config's)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="OpenClaw reads its key from this environment variable (e.g. a user's key in per_user mode)",
    )
    log_dir_flag(p, "read the generated client key from")
    users = sub.add_parser(
        "users", help="per-user identity: add, list, delete or export a user"
    ).add_subparsers(dest="users_command", required=True)

    def user_verb(name: str, help_: str, named: str | None) -> argparse.ArgumentParser:
        p = users.add_parser(name, help=help_)
        if named is not None:
            p.add_argument("name", help=named)
        log_dir_flag(configured(p, _cmd_users), "use the run in")
        return p

    p = user_verb(
        "add", "add a user and print their key once", "the user's name (letters, digits, . _ @ + -)"
    )
    p.add_argument(
        "--new-key",
        action="store_true",
        help="give an existing user a new key (lost or leaked); the old one stops working, their data stays",
    )
    user_verb("list", "per user: turns, judged, samples, updates, adapter, feedback", None)
    p = user_verb(
        "delete", "remove a user's key, turns, samples, adapters and feedback", "the user to delete"
    )
    p.add_argument("--yes", action="store_true", help="needed to delete 'default' (every anonymous turn)")
    p = user_verb(
        "export", "write a user's adapter (PEFT) and turns (JSONL) to a folder", "the user to export"
    )
    p.add_argument("--out", required=True, help="folder to write into")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # told with the verb's own usage, not the top-level one
        getattr(args, "verb_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    from openclaw_rl.runtime.store import StoreError

    try:
        return args.fn(args)
    except (ConfigError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
