"""The API judge: any OpenAI-compatible chat endpoint given by ``[api]``.

Selected by ``[prm_service] backend = "api"`` or any channel name (``"taotoken"``, ...). Requests go
to ``{base_url}/v1/chat/completions`` through the official ``openai`` client (``AsyncOpenAI``), which
applies ``timeout_sec`` to every request and retries 408/409/429/5xx and connection errors up to
``max_retries`` times with exponential backoff (honouring ``Retry-After``). Each vote is its own
request, all sent concurrently, sampled at ``temperature``.

When retries are exhausted the judgement fails with :class:`JudgeUnavailable`, whose message says
what happened and where — never the key.
"""

from __future__ import annotations

import asyncio

import openai
from openai.types.chat import ChatCompletion

from openclaw_rl.config import Config
from openclaw_rl.judge.base import Judge
from openclaw_rl.judge.errors import JudgeUnavailable
from openclaw_rl.judge.prompts import (
    MAX_VOTE_CHARS,
    evaluative_messages,
    hint_messages,
    parse_hint_vote,
    parse_score,
    shortened,
)
from openclaw_rl.runtime.secrets import without_key
from openclaw_rl.types import NextState, Vote

#: Reply budget per vote: enough for a short reasoning and the answer line.
MAX_TOKENS = 384


def make_client(cfg: Config) -> openai.AsyncOpenAI:
    """``AsyncOpenAI`` on ``[api]``: base_url ``{base_url}/v1``, timeout, retries with backoff."""
    if not cfg.api.base_url:
        raise ValueError("[api] base_url is empty: the API judge needs the API root, e.g. https://host/api")
    # The client refuses an empty key; a keyless local server gets a placeholder instead.
    key = cfg.api.api_key.get_secret_value() or "no-key"
    return openai.AsyncOpenAI(
        base_url=cfg.api.v1_url, api_key=key, timeout=cfg.api.timeout_sec, max_retries=cfg.api.max_retries
    )


def describe_failure(exc: Exception, url: str, retries: int, *, key: str) -> str:
    """A clear, key-free message for an API failure: what happened, where, and the endpoint's own
    reason when it gave one (the client retries only timeouts, lost connections, 408/409/429/5xx)."""
    after = f" (retried up to {retries} time{'' if retries == 1 else 's'})" if retries else ""
    if isinstance(exc, openai.APITimeoutError):
        return f"judge API at {url} timed out{after}"
    if isinstance(exc, openai.AuthenticationError):
        return f"judge API at {url} refused the API key (HTTP 401); check [api] api_key"
    if isinstance(exc, openai.PermissionDeniedError):
        return f"judge API at {url} denied access (HTTP 403); check [api] api_key and the model's permissions"
    if isinstance(exc, openai.RateLimitError):
        return f"judge API at {url} is rate-limiting (HTTP 429){after}"
    if isinstance(exc, openai.NotFoundError):
        return f"judge API at {url} answered 404: check [api] base_url (the API root) and [prm_service] model"
    if isinstance(exc, openai.APIConnectionError):
        return f"judge API at {url} could not be reached{after}: {type(exc.__cause__ or exc).__name__}"
    if isinstance(exc, openai.APIStatusError):
        retried = after if exc.status_code in (408, 409) or exc.status_code >= 500 else ""
        return f"judge API at {url} failed with HTTP {exc.status_code}{retried}{_reason(exc, key)}"
    return f"judge API at {url} failed: {type(exc).__name__}"


def _reason(exc: openai.APIStatusError, key: str) -> str:
    """``: <the endpoint's error message>`` (first line, key masked), or nothing."""
    body = exc.body
    said = body.get("message") or body.get("error") if isinstance(body, dict) else body
    if isinstance(said, dict):
        said = said.get("message")
    text = str(said).strip().splitlines()[0][:200] if said else ""
    return f": {without_key(text, key)}" if text else ""


class ApiJudge(Judge):
    """Evaluative and hint votes from an OpenAI-compatible chat model."""

    def __init__(self, cfg: Config, teacher: object | None = None, client: openai.AsyncOpenAI | None = None):
        super().__init__(cfg, teacher)
        self.name = cfg.prm_service.backend
        if client is None and not cfg.api.base_url:  # fail at set-up, not at the first turn
            raise ValueError(
                "[api] base_url is empty: the API judge needs the API root, e.g. https://host/api"
            )
        self._given = client
        self._client: openai.AsyncOpenAI | None = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = f"{cfg.api.v1_url}/chat/completions"

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The client for the running event loop: an async HTTP pool belongs to the loop that made
        it, so a judge used from a new loop (e.g. the service thread) gets a fresh client."""
        loop = asyncio.get_running_loop()
        if self._client is None or (self._given is None and self._loop is not loop):
            self._client = make_client(self.cfg)
            self._loop = loop
        return self._client

    async def _ask(self, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        """The reply's text and finish reason."""
        try:
            resp = await self.client.chat.completions.create(
                model=self.prm.model,
                messages=messages,  # type: ignore[arg-type]
                temperature=self.prm.temperature,
                max_tokens=MAX_TOKENS,
            )
        except openai.APIError as exc:
            key = self.cfg.api.api_key.get_secret_value()
            raise JudgeUnavailable(
                describe_failure(exc, self.url, self.cfg.api.max_retries, key=key)
            ) from None
        except ValueError as exc:  # a 200 whose body is cut-off JSON
            raise JudgeUnavailable(
                f"judge API at {self.url} answered with a body that is not JSON ({exc})"
            ) from None
        if not isinstance(resp, ChatCompletion):  # a 200 with an HTML page: the SDK hands back text
            raise JudgeUnavailable(
                f"judge API at {self.url} answered with a body that is not a chat completion "
                f"({type(resp).__name__}: {str(resp)[:80]!r}); check [api] base_url (the API root)"
            )
        if not resp.choices:
            return "", None  # an empty reply is an invalid vote, not an outage
        choice = resp.choices[0]
        return choice.message.content or "", choice.finish_reason

    async def _score_replies(self, messages: list[dict[str, str]]) -> list[str]:
        """``vote_count`` replies; :class:`JudgeUnavailable` when every one is empty: no vote was
        given at all (a reasoning model spending the whole reply budget before its answer, an
        endpoint with nothing to say), which as invalid votes would be a silent score of 0."""
        answers = await asyncio.gather(*(self._ask(messages) for _ in range(self.prm.vote_count)))
        if all(not text.strip() for text, _ in answers):
            cut = sum(reason == "length" for _, reason in answers)
            why = (
                f"; {cut} cut at the {MAX_TOKENS}-token reply budget (a reasoning model thinking "
                "past it? pick one that answers directly)"
                if cut
                else ""
            )
            raise JudgeUnavailable(
                f"judge API at {self.url} gave {len(answers)} empty repl{'y' if len(answers) == 1 else 'ies'}"
                f"{why}; the turn is judged again later"
            )
        return [text for text, _ in answers]

    async def score_votes(self, response: str, next_state: NextState) -> list[Vote]:
        replies = await self._score_replies(
            evaluative_messages(response, next_state, reward_space=self.prm.reward_space)
        )
        return [
            Vote(raw=shortened(r, MAX_VOTE_CHARS), score=parse_score(r, self.prm.reward_space))
            for r in replies
        ]

    async def hint_votes(self, response: str, next_state: NextState) -> list[Vote]:
        msgs = hint_messages(response, next_state)  # an empty hint reply is just no hint
        replies = [
            text for text, _ in await asyncio.gather(*(self._ask(msgs) for _ in range(self.prm.vote_count)))
        ]
        votes = []
        for r in replies:
            verdict, hint = parse_hint_vote(r)
            votes.append(Vote(raw=shortened(r, MAX_VOTE_CHARS), score=verdict, hint=hint))
        return votes

    async def close(self) -> None:
        if self._client is not None and (self._given is not None or self._loop is asyncio.get_running_loop()):
            await self._client.close()
        if self._given is None:
            self._client = None
