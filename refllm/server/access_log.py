"""The request log: one line per request, written when its answer has been sent.

    INFO:     127.0.0.1:51010 - "POST /v1/chat/completions HTTP/1.1" 200 OK | prompt 37 tokens | generated 12 tokens, first after 0.25 s, 31.2 tokens/s

uvicorn writes its access line when a response starts, before a stream has a
single token, so the server writes its own at the end instead (``serve`` turns
uvicorn's off). Like uvicorn's (``connections.NoQueryStrings``), it never shows a
query string, which could carry a credential. A completion's line adds its prompt and generated token counts,
the time to its first token and the generation speed (tokens after the first,
over the time after it, as the command line's stats line counts them).
"""

from __future__ import annotations

import http
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from refllm.server.connections import QUERY_NOT_LOGGED

LOGGER = logging.getLogger("uvicorn.error")  # uvicorn's own handler: "INFO:     ..." on stderr


class AccessLog:
    """ASGI middleware: the line above for every HTTP request, refused ones included."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            LOGGER.info(request_line(scope, status))


def request_line(scope: Scope, status: int) -> str:
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    path = scope.get("path", "") + (QUERY_NOT_LOGGED if scope.get("query_string") else "")  # never a credential
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "no response" if status == 0 else ""
    line = f'{where} - "{scope.get("method", "")} {path} HTTP/{scope.get("http_version", "1.1")}" {status} {phrase}'
    generation = scope.get("state", {}).get("generation")
    return line if generation is None else f"{line} | {generation.stats_line()}"
