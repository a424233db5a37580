"""Connections a client cannot hoard: uvicorn's h11 protocol with a header timeout and a connection cap.

uvicorn times out a kept-alive connection that sends nothing, but not one that sends a
request head a byte at a time, nor one that connects and never sends; and its
``limit_concurrency`` answers 503 to every newcomer while idle connections hold the
slots. Here a connection must deliver each request head within ``header_timeout``,
and a newcomer past the cap closes the connection that has waited longest without a
request in progress (itself, when every one has a request running): the open files
never run out, and a client that sends a request is served. Each refusal is one line
in the log.

Two more rules for every connection ``server_config`` serves: a response sent before the
request's body was read whole (a 408 for a body too slow, a 413, a refusal before the
body is read) carries ``Connection: close`` and the connection closes after it, so that
the rest of that body is never read as a next request (RFC 9110, 15.5.9); and the
access log shows each request's path without its query string, which could carry a
credential (``?api_key=...``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from refllm.server.limits import ACCEPT_BACKLOG, ServerLimits
from refllm.server.protocol import RequestError

logger = logging.getLogger("uvicorn.error")
CLOSE = (b"connection", b"close")


class GuardedH11Protocol(H11Protocol):
    def __init__(self, *args: Any, header_timeout: float, max_connections: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.header_timer: asyncio.TimerHandle | None = None
        self.waiting_since = time.monotonic()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            idle = [c for c in self.connections if c is not self and c._waiting()]
            victim = min(idle, key=lambda c: c.waiting_since) if idle else self
            victim._refuse(f"over the limit of {self.max_connections} connections")
            if victim is self:
                return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._waiting() and self.header_timer is None:  # the first bytes of a next request on a kept-alive one
            self._arm_header_timer()
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._waiting():  # a whole request head arrived
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # uvicorn's keep-alive timeout closes it if nothing more comes
        self.waiting_since = time.monotonic()

    def send_400_response(self, msg: str) -> None:
        """A request that is not HTTP (or whose head is too large) answered in OpenAI's error shape, not plain text."""
        body = json.dumps(RequestError(msg).body()).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _waiting(self) -> bool:
        """No request in progress: before the first request head, or between requests."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self.header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timed_out(self) -> None:
        if self._waiting():
            self._refuse(f"no whole request head within {self.header_timeout:g} s")

    def _refuse(self, reason: str) -> None:
        if not self.transport.is_closing():
            client = "%s:%d" % self.client if self.client else "a client"
            logger.warning("closed the connection of %s: %s", client, reason)
            self.transport.close()


class CloseAfterUnreadBody:
    """ASGI wrapper: a response that starts before the request's body was read whole says ``Connection: close``,
    and h11 then closes the connection once the response is sent."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        unread = headers.get(b"content-length", b"0").strip() != b"0" or b"transfer-encoding" in headers

        async def reading() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                unread = False
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and unread and CLOSE not in message.get("headers", []):
                message = {**message, "headers": [*message.get("headers", []), CLOSE]}
            await send(message)

        await self.app(scope, reading, sending)


QUERY_NOT_LOGGED = "?[query string not logged]"  # in place of a request's query string, in every log line


class NoQueryStrings(logging.Filter):
    """Keeps query strings out of uvicorn's access log: one could carry a credential (``?api_key=...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            client, method, path, version, status = args
            record.args = (client, method, path.partition("?")[0] + QUERY_NOT_LOGGED, version, status)
        return True


ACCESS_LOG_FILTER = NoQueryStrings()


class GuardedServer(uvicorn.Server):
    """A uvicorn server whose event loop logs a failed accept (out of open files, say) as one line, not a traceback.

    After such a failure asyncio stops accepting and resumes a second later; when the server
    closes in between, the resumed accept finds its socket closed (a ``ValueError``), which
    is also one line, as the server is shutting down anyway."""

    async def serve(self, sockets: Any = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self._one_line_for_os_errors)
        await super().serve(sockets)

    def _one_line_for_os_errors(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError):
            logger.warning("%s: %s", context.get("message", "a connection failed"), error)
        elif isinstance(error, ValueError) and self.should_exit:
            logger.info("stopped accepting connections while shutting down: %s", error)
        else:
            loop.default_exception_handler(context)


def server_config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    """uvicorn's config for the app, with the guarded protocol, the timeouts and connection cap of the app's
    limits (``create_app``'s, or the defaults for another app), the close after an unread body and the access
    log without query strings."""
    limits = getattr(getattr(app, "state", None), "limits", None) or ServerLimits()
    protocol = functools.partial(
        GuardedH11Protocol, header_timeout=limits.header_timeout, max_connections=limits.connection_limit()
    )
    config = uvicorn.Config(
        CloseAfterUnreadBody(app),
        host=host,
        port=port,
        http=protocol,  # type: ignore[arg-type]
        ws="none",  # no route takes a WebSocket
        backlog=ACCEPT_BACKLOG,
        timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
        **options,
    )
    logging.getLogger("uvicorn.access").addFilter(ACCESS_LOG_FILTER)  # after the config has set up uvicorn's logging
    return config
