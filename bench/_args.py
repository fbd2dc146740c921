"""Argument types the bench scripts share: a bad value is argparse's one-line error (exit 2), not a
traceback after a server has started."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of integers >= 1 ("1,8")."""
    return [positive_int(part.strip()) for part in text.split(",") if part.strip()] or [positive_int(text)]


def existing_dir(text: str) -> Path:
    """A folder that exists."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return path


def kept_work_dir(text: str) -> Path:
    """A work folder ``bench/learning.py --keep`` wrote (it holds learning.json)."""
    path = existing_dir(text)
    if not (path / "learning.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text}: no learning.json here; give a folder bench/learning.py --keep wrote"
        )
    return path
