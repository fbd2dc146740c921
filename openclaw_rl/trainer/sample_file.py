"""``samples.jsonl``: the on-disk form of training samples, one :class:`~openclaw_rl.types.Sample` per line.

The file is what offline replay (``openclaw-rl train --samples FILE``) reads and what any loop may
write to hand samples over. Reading validates every line and names the line number of the first bad
one, because a silently skipped line would be a silently lost training signal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from openclaw_rl.runtime.rundir import atomic_write_text
from openclaw_rl.types import Sample


class SampleFileError(ValueError):
    """A samples file that cannot be read; the message names the file and line."""


def load_samples(path: str | os.PathLike[str]) -> list[Sample]:
    """Read a JSONL samples file. Blank lines are skipped; any bad line raises :class:`SampleFileError`."""
    return [sample for _, sample in numbered_samples(path)]


def numbered_samples(path: str | os.PathLike[str]) -> list[tuple[int, Sample]]:
    """:func:`load_samples`, each sample with its line number (for errors found later: a token id
    outside the model's vocabulary is known only once the model is)."""
    p = Path(path)
    if not p.is_file():
        raise SampleFileError(f"{p}: samples file not found (looked at {p.resolve()})")
    samples: list[tuple[int, Sample]] = []
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise SampleFileError(
                    f"{p}:{lineno}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                    "JSONL files are UTF-8: save it as UTF-8"
                ) from None
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # a Windows editor's byte-order mark
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SampleFileError(
                    f"{p}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(obj, dict):
                raise SampleFileError(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            try:
                samples.append((lineno, Sample.model_validate(obj)))
            except ValidationError as exc:
                problems = [
                    f"{'.'.join(str(x) for x in err['loc']) or 'sample'}: {err['msg'].removeprefix('Value error, ')}"
                    for err in exc.errors()
                ]
                shown = "; ".join(problems[:8]) + (
                    f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
                )
                raise SampleFileError(f"{p}:{lineno}: invalid sample: {shown}") from None
    return samples


def write_samples(path: str | os.PathLike[str], samples: Iterable[Sample]) -> Path:
    """Write samples as JSONL atomically (temp file, then rename); returns the path. Readable by
    the owner only: the token ids are the users' words and the replies to them."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, "".join(s.model_dump_json() + "\n" for s in samples), mode=0o600)
    return p
