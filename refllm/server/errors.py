"""The app's exception handlers: every refusal and fault answered in OpenAI's error shape."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from refllm.server.protocol import RequestError


async def request_error(request: Request, error: RequestError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape."""
    return await request_error(request, RequestError(error.detail, status=error.status_code))


async def client_gone(request: Request, error: ClientDisconnect) -> JSONResponse:
    """The client left (before its body arrived, or before its answer was ready): nobody is there to read this."""
    return JSONResponse({}, status_code=499)


async def server_error(request: Request, error: Exception) -> JSONResponse:
    """A fault of the server itself: 500 in OpenAI's shape (and the server logs the traceback)."""
    return await request_error(request, RequestError(f"internal error: {error}", status=500, type="server_error"))
