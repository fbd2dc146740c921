"""The trainer's per-token log-probs, by their documented import path.

They live in :mod:`openclaw_rl.runtime.logprobs`, below the loops, because the judge's teacher
scores with them too; this module keeps ``from openclaw_rl.trainer.logprobs import ...`` working.
"""

from openclaw_rl.runtime.logprobs import (
    TokenStats,
    batch_token_stats,
    full_logsoftmax_logprobs,
    plain_token_stats,
    sequence_logprobs,
)

__all__ = [
    "TokenStats",
    "batch_token_stats",
    "full_logsoftmax_logprobs",
    "plain_token_stats",
    "sequence_logprobs",
]
