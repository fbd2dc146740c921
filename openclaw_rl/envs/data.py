"""GSM8K problems and the one train / held-out split every part uses.

Personalisation is measured on a held-out slice the trainer never sees. The split is a
single function, :func:`split_gsm8k`, called by the training-time environments *and* by evaluation,
so the two can never drift apart: the last ``eval_size`` items (in file order) are held out, the
rest are for training episodes. File order is fixed by the shipped data, so the split is the same
on every machine and every run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

Split = Literal["train", "eval"]


class DataError(ValueError):
    """The GSM8K file is missing or malformed; the message says where and what."""


@dataclass(frozen=True)
class GsmItem:
    """One grade-school maths problem with its numeric answer (as written in the data)."""

    index: int
    question: str
    answer: str

    @property
    def answer_value(self) -> float:
        return float(self.answer.replace(",", ""))


@lru_cache(maxsize=4)
def load_gsm8k(path: str | Path) -> tuple[GsmItem, ...]:
    """Read and validate ``gsm8k.json`` (a list of {question, ground_truth_answer})."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise DataError(f"{p}: file not found") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{p}: expected a non-empty JSON list of problems")
    items = []
    for i, row in enumerate(raw):
        if not isinstance(row, dict):
            raise DataError(f"{p}: item {i} is {type(row).__name__}, expected an object")
        q, a = row.get("question"), row.get("ground_truth_answer")
        if not isinstance(q, str) or not q.strip():
            raise DataError(f"{p}: item {i} has no 'question' string")
        a = str(a).strip() if a is not None else ""
        if not re.fullmatch(r"-?[\d,]*\.?\d+", a):
            raise DataError(f"{p}: item {i} 'ground_truth_answer' = {a!r} is not a number")
        items.append(GsmItem(index=i, question=q.strip(), answer=a))
    return tuple(items)


def split_gsm8k(
    items: tuple[GsmItem, ...] | list[GsmItem], eval_size: int
) -> tuple[list[GsmItem], list[GsmItem]]:
    """``(train, held_out)``: the last ``eval_size`` items are held out and never trained on."""
    if eval_size < 1 or eval_size >= len(items):
        raise DataError(
            f"[env_service] eval_size = {eval_size} must be between 1 and {len(items) - 1} "
            f"(the data has {len(items)} problems)"
        )
    items = list(items)
    return items[:-eval_size], items[-eval_size:]


def gsm8k_split(path: str | Path, eval_size: int, split: Split) -> list[GsmItem]:
    """The ``train`` or ``eval`` items of the file at ``path``."""
    train, held = split_gsm8k(load_gsm8k(str(path)), eval_size)
    if split == "train":
        return train
    if split == "eval":
        return held
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
