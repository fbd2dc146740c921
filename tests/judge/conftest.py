"""A real OpenAI-compatible server on loopback that plays the *remote judge* (the external API).

It answers ``/v1/chat/completions`` with canned judge replies (hint-judge prompts get the hint
reply), and can be told to fail first (429 / 500 / 401) or to answer slowly, so retries, timeouts
and refused keys go through the real ``openai`` client and real HTTP.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

KEY = "test-judge-key"


@dataclass
class Remote:
    eval_reply: str | None = "The user thanked the assistant.\nSCORE: +1"  # None: content null
    hint_reply: str = "VERDICT: -1"
    finish_reason: str = "stop"
    fail_next: list[int] = field(default_factory=list)  # status codes to answer before succeeding
    delay_s: float = 0.0
    calls: int = 0
    url: str = ""
    prompt_logprobs: bool = True  # whether /v1/completions supports echo + logprobs
    raw_body: str | None = None  # answer 200 with this body instead (a misrouted base_url)
    key: str = KEY  # the key it takes; its canned failures quote the key they were sent, as some APIs do
    completions_fail: list[int] = field(default_factory=list)  # as fail_next, for /v1/completions

    def reset(self) -> None:
        self.eval_reply = "The user thanked the assistant.\nSCORE: +1"
        self.hint_reply = "VERDICT: -1"
        self.finish_reason = "stop"
        self.fail_next = []
        self.delay_s = 0.0
        self.calls = 0
        self.prompt_logprobs = True
        self.raw_body = None
        self.key = KEY
        self.completions_fail = []


def _failure(request: Request, code: int) -> JSONResponse:
    sent = request.headers.get("authorization", "").removeprefix("Bearer ")
    return JSONResponse(
        {"error": {"message": f"canned {code} for the key {sent}"}},
        status_code=code,
        headers={"retry-after-ms": "20"},
    )


def _app(remote: Remote) -> FastAPI:
    app = FastAPI()

    # The API root is http://host/api, so the real route is /api/v1/chat/completions.
    @app.post("/api/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        remote.calls += 1
        if request.headers.get("authorization") != f"Bearer {remote.key}":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        if remote.fail_next:
            return _failure(request, remote.fail_next.pop(0))
        if remote.raw_body is not None:  # a page, or JSON cut short (sent as JSON)
            kind = "application/json" if remote.raw_body.startswith("{") else "text/html"
            return Response(remote.raw_body, media_type=kind)
        if remote.delay_s:
            await asyncio.sleep(remote.delay_s)
        body = await request.json()
        system = body["messages"][0]["content"]
        text = remote.hint_reply if "VERDICT" in system else remote.eval_reply
        return JSONResponse(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": remote.finish_reason,
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    @app.post("/api/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        """Prompt log-probs the vLLM way: echo=True returns one log-prob per prompt token, here the
        canned value -(position / 100) so a test can check which positions were taken."""
        if remote.completions_fail:
            return _failure(request, remote.completions_fail.pop(0))
        body = await request.json()
        if not remote.prompt_logprobs or not body.get("echo"):
            return JSONResponse({"error": {"message": "echo is not supported"}}, status_code=400)
        ids = body["prompt"]
        lps = [None] + [-(i / 100) for i in range(1, len(ids))]
        return JSONResponse(
            {
                "id": "cmpl-test",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "finish_reason": "length",
                        "logprobs": {
                            "tokens": [str(i) for i in ids],
                            "token_logprobs": lps,
                            "top_logprobs": None,
                            "text_offset": list(range(len(ids))),
                        },
                    }
                ],
            }
        )

    return app


@pytest.fixture(scope="session")
def remote_judge():
    remote = Remote()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(remote), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("loopback judge server did not start")
        time.sleep(0.02)
    remote.url = f"http://127.0.0.1:{port}/api"
    yield remote
    server.should_exit = True
    thread.join(5)


@pytest.fixture
def remote(remote_judge):
    remote_judge.reset()
    return remote_judge


def api_config(remote: Remote, api: dict | None = None, training: dict | None = None, **prm):
    """A validated config whose judge is the loopback server (a channel named "taotoken")."""
    from openclaw_rl.config import build_config

    prm_section = {
        "backend": "taotoken",
        "model": "judge-model",
        "vote_count": 3,
        "retry_interval_sec": 0.05,
        **prm,
    }
    api_section = {"base_url": remote.url, "api_key": KEY, "timeout_sec": 5, "max_retries": 2, **(api or {})}
    raw = {"api": api_section, "prm_service": prm_section}
    if training:
        raw["training"] = training
    return build_config(raw, environ={})
