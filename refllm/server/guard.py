"""Who may use the server: an API key, the Host header, the Origin of a browser's request.

- With an API key, every request but ``GET /health`` and the web page (``/`` and its files,
  which ask the user for the key) must carry ``Authorization: Bearer <key>`` (as llama-server
  and OpenAI's clients do), or is answered 401.
- The ``Host`` header must name one of ``allowed_hosts`` (the bind address and, on a
  loopback address, ``localhost``), so a web page whose DNS name is rebound to
  127.0.0.1 cannot reach the server through the victim's browser (403).
- A browser's cross-site request carries an ``Origin``; unless that origin is one of
  ``cors_origins`` (none by default), it is refused with 403 before it runs, since a
  ``text/plain`` POST reaches the server without any CORS preflight.

Every refusal has OpenAI's error shape.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from refllm.server.protocol import RequestError

OPEN_PATHS = ("/health", "/")  # and the web page's files: the page asks for the key, the API needs it
PAGE_FILES = "/page/"


def hosts_for(bind_address: str) -> tuple[str, ...] | None:
    """The Host names a server bound to ``bind_address`` answers to; None (any) for a wildcard address."""
    if bind_address in ("0.0.0.0", "::", ""):
        return None
    names = [bind_address.lower().strip("[]")]
    try:
        if ipaddress.ip_address(names[0]).is_loopback:
            names += ["localhost", "127.0.0.1", "::1"]
    except ValueError:  # a host name, not an address
        pass
    return tuple(dict.fromkeys(names))


class AccessGuard:
    """ASGI middleware: the Host, Origin and API-key checks above, before the app sees the request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
        cors_origins: Sequence[str] = (),
    ):
        self.app = app
        self.api_key = api_key
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.cors_origins = set(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> RequestError | None:
        headers = Headers(scope=scope)
        host = _hostname(headers.get("host", ""))
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            return RequestError(f"the Host {host!r:.80} is not one this server answers to", status=403)
        origin = headers.get("origin")
        same_origin = origin is not None and urlsplit(origin).netloc.lower() == headers.get("host", "").lower()
        if origin is not None and origin not in self.cors_origins and not same_origin:
            return RequestError(f"requests from the origin {origin!r:.80} are not allowed", status=403)
        open_path = scope["path"] in OPEN_PATHS or scope["path"].startswith(PAGE_FILES)
        if self.api_key is not None and not open_path:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return RequestError("a valid API key is needed: Authorization: Bearer <key>", status=401,
                                    code="invalid_api_key")  # fmt: skip
        return None


def _hostname(netloc: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc
