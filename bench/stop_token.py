"""Does training teach the policy to stop stopping? The stop token in a run's trained samples.

A reply the user gets whole ends with a stop token; one cut at ``max_tokens`` does not. On the
embedded model a run's trained policies ended fewer and fewer of their replies by themselves, and a
policy that never stops repeats its last line under greedy decoding (the evaluation's loops). This
reads the samples of finished runs (``bench/learning.py --keep DIR``, or a ``make run`` log dir) and
prints, per run:

* by policy version, the share of sampled responses that ended by themselves;
* over the responses that did, the OPD part's push on the stop token (teacher − rollout log-prob)
  beside the mean push on the same responses' other tokens: a stop token pushed down harder than
  the rest is the hint teaching "go on" wherever the policy stopped;
* over the hinted responses, the OPD part's push on the tokens that repeat an earlier run of the same
  response (``REPEAT_WINDOW`` tokens) beside its push on the others: a teacher that copies what it
  has just read agrees with a loop more than with new text (``[training] opd_repeats``);
* with ``--readiness``: where the base model's own rollouts (policy version 0) stopped, its
  probability of stopping there (recorded at sampling) against the run's final policy's (one
  scoring pass per response): a policy that lost its readiness to stop where the base would;
* with ``--tokens``: over every run given, the tokens the OPD part pushes hardest (``|teacher −
  rollout| > BIG_PUSH``), down and up, with how often and how hard, and its mean push by position in
  the response: which words the hinted teacher teaches the policy to avoid.

    .venv/bin/python bench/stop_token.py [--readiness] [--tokens] RUN_DIR [RUN_DIR ...]

``RUN_DIR``: a run's ``log_dir`` (it holds ``store.sqlite``), or a folder of them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _args import existing_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openclaw_rl.runtime.metrics import REPEAT_WINDOW, repeated_items  # noqa: E402
from openclaw_rl.runtime.models import (  # noqa: E402
    load_generation_config,
    load_model,
    load_tokenizer,
    resolve_model_dir,
    stop_token_ids,
)
from openclaw_rl.runtime.rundir import RunDir  # noqa: E402
from openclaw_rl.runtime.store import Store  # noqa: E402
from openclaw_rl.types import Sample  # noqa: E402


def run_dirs(paths: list[str]) -> list[Path]:
    """The run directories under ``paths``: each one itself if it holds a store, else its children that do."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "store.sqlite").is_file():
            out.append(p)
        else:
            out.extend(sorted(c for c in p.iterdir() if (c / "store.sqlite").is_file()))
    return out


@dataclass
class StopReport:
    """One run's stop token: ``stopped`` / ``n`` per policy version (the share of sampled responses
    that ended with a stop token, and how many there were); over the hinted responses that stopped,
    the mean teacher − rollout on the stop token (``push_on_stop``) and on their other tokens
    (``push_on_rest``), and the share of them whose stop token was pushed down harder; over every
    hinted response, the mean teacher − rollout on tokens in a repeated run (``push_on_repeats``)
    and on the rest (``push_on_new``), and the share of tokens that repeat."""

    stopped: dict[int, float]
    n: dict[int, int]
    push_on_stop: float | None
    push_on_rest: float | None
    stop_pushed_down: float | None
    n_hinted_stops: int
    push_on_repeats: float | None = None
    push_on_new: float | None = None
    repeated_share: float = 0.0  # of the hinted responses' tokens


def stop_report(samples: list[Sample], stop_ids: frozenset[int]) -> StopReport:
    """:class:`StopReport` of ``samples``, ``stop_ids`` being the policy's stop tokens."""
    by_version: dict[int, list[bool]] = defaultdict(list)
    on_stop: list[float] = []
    on_rest: list[float] = []
    on_repeats: list[float] = []
    on_new: list[float] = []
    for s in samples:
        stopped = s.ended_by_itself(stop_ids)
        by_version[s.policy_version].append(stopped)
        if s.teacher_logprobs is not None:
            again = repeated_items(s.response_ids, REPEAT_WINDOW)
            for t, r, rep in zip(s.teacher_logprobs, s.rollout_logprobs, again, strict=True):
                (on_repeats if rep else on_new).append(t - r)
        if stopped and s.teacher_logprobs is not None and len(s.response_ids) > 1:
            gaps = [t - r for t, r in zip(s.teacher_logprobs, s.rollout_logprobs, strict=True)]
            on_stop.append(gaps[-1])
            on_rest.append(statistics.fmean(gaps[:-1]))
    harder = [a < b for a, b in zip(on_stop, on_rest, strict=True)]
    return StopReport(
        stopped={v: sum(x) / len(x) for v, x in sorted(by_version.items())},
        n={v: len(x) for v, x in sorted(by_version.items())},
        push_on_stop=statistics.fmean(on_stop) if on_stop else None,
        push_on_rest=statistics.fmean(on_rest) if on_rest else None,
        stop_pushed_down=sum(harder) / len(harder) if harder else None,
        n_hinted_stops=len(on_stop),
        push_on_repeats=statistics.fmean(on_repeats) if on_repeats else None,
        push_on_new=statistics.fmean(on_new) if on_new else None,
        repeated_share=len(on_repeats) / max(1, len(on_repeats) + len(on_new)),
    )


#: A per-token OPD push this large counts as one of the hard ones (``--tokens``).
BIG_PUSH = 0.5
#: Tokens per position bucket in ``--tokens``' push-by-position line.
POSITION_BUCKET = 8


@dataclass
class TokenPushes:
    """The OPD part's pushes by token and by position over hinted responses: per token text, how
    often and how hard (summed) it was pushed beyond ``±BIG_PUSH``; the mean push per bucket of
    ``POSITION_BUCKET`` positions (the last bucket holds every later position)."""

    down: dict[str, tuple[int, float]]
    up: dict[str, tuple[int, float]]
    by_position: list[float]
    tokens: int


def token_pushes(samples: list[Sample], decode: Callable[[int], str], buckets: int = 8) -> TokenPushes:
    """:class:`TokenPushes` of the hinted ``samples``; ``decode`` turns a token id into its text."""
    down: dict[str, list[float]] = defaultdict(list)
    up: dict[str, list[float]] = defaultdict(list)
    at: dict[int, list[float]] = defaultdict(list)
    n = 0
    for s in samples:
        if s.teacher_logprobs is None:
            continue
        for k, (t, r, tok) in enumerate(
            zip(s.teacher_logprobs, s.rollout_logprobs, s.response_ids, strict=True)
        ):
            push = t - r
            n += 1
            at[min(k // POSITION_BUCKET, buckets - 1)].append(push)
            if abs(push) > BIG_PUSH:
                (up if push > 0 else down)[decode(tok)].append(push)
    return TokenPushes(
        down={w: (len(v), sum(v)) for w, v in down.items()},
        up={w: (len(v), sum(v)) for w, v in up.items()},
        by_position=[statistics.fmean(at[b]) if at[b] else float("nan") for b in range(buckets)],
        tokens=n,
    )


def _hardest(pushes: dict[str, tuple[int, float]], k: int = 12) -> str:
    ranked = sorted(pushes.items(), key=lambda kv: -abs(kv[1][1]))[:k]
    return ", ".join(f"{w!r} {c}x {total:+.1f}" for w, (c, total) in ranked)


class Readiness:
    """The base model once, and each run's final policy swapped onto it in turn."""

    def __init__(self, model_name: str, stop_ids: frozenset[int]):
        self.model_name, self.stop_ids = model_name, stop_ids
        self.model, _tok = load_model(model_name)
        self.base_state = {k: v.clone() for k, v in self.model.state_dict().items()}

    def measure(self, samples: list[Sample], policy: Path) -> tuple[float, float, int]:
        """``(base, final, n)``: over the version-0 responses that ended by themselves, the mean
        probability of stopping at their last position under the base (the recorded rollout log-prob
        of the stop token) and under the exported ``policy`` (a LoRA adapter or a full model)."""
        import torch

        from openclaw_rl.policy.weights import load_policy_state
        from openclaw_rl.runtime.logprobs import batch_token_stats

        stops = [s for s in samples if s.policy_version == 0 and s.ended_by_itself(self.stop_ids)]
        if not stops:
            return float("nan"), float("nan"), 0
        # A LoRA adapter comes back as just the matrices it changes (merged): start from the base.
        self.model.load_state_dict(self.base_state)
        state = load_policy_state(policy, resolve_model_dir(self.model_name), torch.float32)
        if unexpected := self.model.load_state_dict(state, strict=False).unexpected_keys:
            raise ValueError(f"{policy}: weights the model does not have: {unexpected[:3]}")
        with torch.no_grad():
            stats = batch_token_stats(
                self.model,
                [s.prompt_ids for s in stops],
                [s.response_ids for s in stops],
                stop_ids=self.stop_ids,
            )
        assert stats.stop_logprobs is not None
        final = [float(stats.stop_logprobs[i, len(s.response_ids) - 1].exp()) for i, s in enumerate(stops)]
        base = [math.exp(s.rollout_logprobs[-1]) for s in stops]
        return statistics.fmean(base), statistics.fmean(final), len(stops)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "runs", nargs="+", type=existing_dir, help="run log dirs (holding store.sqlite) or folders of them"
    )
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the policy's model (its stop tokens)")
    ap.add_argument(
        "--readiness",
        action="store_true",
        help="also score, where the base's rollouts stopped, the final policy's probability of stopping",
    )
    ap.add_argument(
        "--tokens",
        action="store_true",
        help="also the tokens the OPD part pushes hardest, over all runs given",
    )
    args = ap.parse_args()
    stop_ids = stop_token_ids(load_tokenizer(args.model), load_generation_config(args.model))
    dirs = run_dirs([str(r) for r in args.runs])
    if not dirs:
        print(f"no store.sqlite under {', '.join(map(str, args.runs))}", file=sys.stderr)
        return 2
    scorer = Readiness(args.model, stop_ids) if args.readiness else None
    every: list[Sample] = []
    for d in dirs:
        store = Store(d / "store.sqlite")
        try:
            samples = store.samples()
        finally:
            store.close()
        every.extend(samples)
        rep = stop_report(samples, stop_ids)
        line = ", ".join(f"v{v} {share:.2f} (n={rep.n[v]})" for v, share in rep.stopped.items())
        print(f"{d.parent.name}/{d.name}: responses that ended by themselves, by policy version: {line}")
        if rep.push_on_stop is not None and rep.push_on_rest is not None and rep.stop_pushed_down is not None:
            print(
                f"  OPD push (teacher - rollout) on the stop token {rep.push_on_stop:+.3f}, on the same "
                f"responses' other tokens {rep.push_on_rest:+.3f}; stop token pushed down harder in "
                f"{rep.stop_pushed_down:.2f} of {rep.n_hinted_stops} hinted responses that stopped"
            )
        if rep.push_on_repeats is not None and rep.push_on_new is not None:
            print(
                f"  OPD push on tokens that repeat an earlier run {rep.push_on_repeats:+.3f} "
                f"({rep.repeated_share:.2f} of hinted tokens), on the others {rep.push_on_new:+.3f}"
            )
        if scorer is not None and (published := RunDir(d).read_published_policy()) is not None:
            base, final, n = scorer.measure(samples, published.path)
            print(
                f"  readiness to stop where the base's rollouts stopped (n={n}): base {base:.3f}, "
                f"final policy (v{published.version}) {final:.3f}"
            )
    if args.tokens:
        tok = load_tokenizer(args.model)
        rep_t = token_pushes(every, lambda i: tok.decode([i]))
        cells = " ".join(f"{p:+.3f}" for p in rep_t.by_position)
        print(f"OPD push by position ({POSITION_BUCKET}-token buckets, the last holds the rest): {cells}")
        print(f"pushed down hardest (< -{BIG_PUSH}), token count total: {_hardest(rep_t.down)}")
        print(f"pushed up hardest (> +{BIG_PUSH}): {_hardest(rep_t.up)}")
        print(f"({rep_t.tokens} hinted tokens over {len(dirs)} run(s))")
    print(f"(stop tokens of {args.model}: {sorted(stop_ids)}; samples of every status)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
