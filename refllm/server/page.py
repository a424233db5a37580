"""The web page ``refllm serve`` shows at ``/``: a chat, and beside each answer the inside of the model.

Plain HTML, CSS and JavaScript in ``refllm/server/static/``, served as they are
(no build step, nothing fetched from elsewhere: the machine may be offline).
The page talks to the server through the same endpoints as any client
(``/v1/chat/completions``, streamed) and ``/v1/inside`` for its panel; with an
API key set, it asks for the key and sends it as any client does. Its files
are sent with a Content-Security-Policy that allows only this server's own
scripts and forbids framing, so another site can neither inject into nor frame it.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.routing import Route

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


async def index(request: Request) -> FileResponse:
    return _file("index.html")


async def page_file(request: Request) -> FileResponse:
    return _file(request.path_params["name"])


def _file(name: str) -> FileResponse:
    path = STATIC / name
    if "/" in name or path.suffix not in TYPES or not path.is_file():
        raise HTTPException(status_code=404)
    return FileResponse(path, media_type=TYPES[path.suffix], headers=HEADERS)


def page_routes() -> list[Route]:
    return [Route("/", index, methods=["GET"]), Route("/page/{name}", page_file, methods=["GET"])]
