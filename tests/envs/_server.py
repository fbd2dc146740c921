"""A minimal but real OpenAI-compatible server (FastAPI + uvicorn on loopback) for env tests.

It speaks ``POST /v1/chat/completions`` (JSON, or SSE when the body asks to ``stream``) and records every request (headers and body) so tests
can check what a client really sent. ``reply`` decides the assistant's answer. It also answers
``POST /v1/admin/close_session`` as the policy service does, recording the ids in ``closed``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from openclaw_rl.runtime.ports import free_port


class ChatServer:
    """``with ChatServer(reply) as srv: srv.base_url`` — a uvicorn server in a background thread."""

    def __init__(
        self,
        reply: Callable[[dict[str, Any]], str | tuple[int, dict[str, Any]]],
        api_key: str | None = None,
        port: int | None = None,
    ):
        self.requests: list[dict[str, Any]] = []
        self.closed: list[str] = []
        self.port = port or free_port()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
                # as some providers do: the refused credentials quoted back in the error
                sent = request.headers.get("authorization", "")
                return JSONResponse(
                    {"error": {"message": f"Incorrect API key provided: {sent}"}}, status_code=401
                )
            body = await request.json()
            self.requests.append(
                {"headers": {k.lower(): v for k, v in request.headers.items()}, "body": body}
            )
            text = reply(body)
            if isinstance(text, tuple):  # (status, error): a refusal, as the policy service words one
                status, error = text
                return JSONResponse({"error": error}, status_code=status)
            if body.get("stream"):  # as the policy service streams: one content chunk, then [DONE]
                chunk = {"id": "cmpl-1", "object": "chat.completion.chunk", "model": body.get("model", "m")}
                events = [
                    {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
                    {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                ]
                lines = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                return StreamingResponse(iter([lines]), media_type="text/event-stream")
            return {
                "id": "cmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "m"),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        @app.post("/v1/admin/close_session")
        async def close_session(request: Request):
            self.closed.append((await request.json())["session_id"])
            return {"ok": True}

        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
