"""The two ways judging can fail, kept apart because they are handled differently.

* :class:`JudgeUnavailable` — an outage (API timeout, refused key, rate limit after retries): the
  judgement is stored as an error and the turn is judged again later.
* :class:`TeacherUnavailable` — the configured OPD teacher cannot exist in this setup (a chat-only
  API, a model that is not local): reported once, and the judge keeps producing RL samples.
"""

from __future__ import annotations


class JudgeUnavailable(RuntimeError):
    """The judge (or teacher) could not be reached or refused us; the turn must be retried later."""


class TeacherUnavailable(RuntimeError):
    """The configured teacher cannot produce log-probs at all (a setup problem, not an outage)."""
