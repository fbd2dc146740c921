"""How a loop process ends when it cannot run: one line for the person, the traceback for the log.

Each loop's ``main`` (environments, judge, trainer) reads its config with :func:`loop_config` and
runs its body through :func:`run_loop_body`. An exception that escapes becomes a single line on stderr naming the loop and
the reason; the full traceback goes to the ``openclaw_rl`` logger at debug level and is appended to
``<log_dir>/errors.log``, where it can be read after the run without flooding the terminal.
"""

from __future__ import annotations

import errno
import logging
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from openclaw_rl.config import Config, ConfigError, load_config, print_warnings
from openclaw_rl.runtime.rundir import MIN_FREE_BYTES, free_bytes

log = logging.getLogger("openclaw_rl")

#: A loop's exit status when the disk under its run is full (``EX_TEMPFAIL``): the launcher restarts
#: it once there is room again, without counting it as a crash.
DISK_FULL_EXIT = 75


#: How writers say the disk is full when they do not raise ENOSPC: safetensors ("I/O error: No space
#: left on device (os error 28)"), SQLite's SQLITE_FULL.
_FULL_WORDS = ("No space left on device", "database or disk is full")


def disk_full(exc: BaseException, folder: Path | None = None) -> bool:
    """Whether ``exc`` (or what caused it) is the disk running out of space; with ``folder``, also
    any error while the disk under it has less than :data:`MIN_FREE_BYTES` free (torch's writer then
    says only ``unexpected pos 64 vs 0``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if any(words in str(seen) for words in _FULL_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return folder is not None and free_bytes(folder) < MIN_FREE_BYTES


def event_lines() -> None:
    """A loop process's logging: its event lines (``[prm_service] ...``) on stdout, one stream for the
    launcher to prefix; the HTTP libraries only when something is wrong, since httpx's line per
    request and openai's per retry would drown a run's log (a judge asks ``vote_count`` per turn)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for noisy in ("httpx", "httpx2", "openai"):  # httpx2: the HTTP library newer openai SDKs use
        logging.getLogger(noisy).setLevel(logging.WARNING)


def loop_config(path: str) -> Config:
    """A loop process's config: validated, its warnings printed once; a bad file exits 2 with
    every problem listed (the launcher validated it already, so this is for a loop run by hand)."""
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print_warnings(cfg)
    return cfg


def run_loop_body(name: str, body: Callable[[], int], log_dir: Path | None = None) -> int:
    """``body()``'s exit code; 1 with a one-line reason when it raises (0 on Ctrl-C)."""
    try:
        return body()
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the loop's last resort: report once, keep the traceback on disk
        if disk_full(exc, log_dir):
            print(
                f"[{name}] stopped: the disk is full ({exc}); free space under "
                f"{log_dir or 'the run folder'} and it goes on from the store",
                file=sys.stderr,
                flush=True,
            )
            return DISK_FULL_EXIT
        trace = traceback.format_exc()
        log.debug("[%s] traceback:\n%s", name, trace)
        where = ""
        if log_dir is not None:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                with (log_dir / "errors.log").open("a", encoding="utf-8") as fh:
                    fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} [{name}]\n{trace}\n")
                where = f" (traceback in {log_dir / 'errors.log'})"
            except OSError:
                where = ""  # an unwritable log_dir was reported by the launcher's checks already
        print(f"[{name}] cannot run: {type(exc).__name__}: {exc}{where}", file=sys.stderr, flush=True)
        return 1
