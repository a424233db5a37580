"""What one client may ask of the server: body size, inputs and tokens per request, and how long it may take.

Connections are limited in ``refllm/server/connections.py`` (the HTTP protocol under the
app); bodies, inputs and tokens in the app itself.
"""

from __future__ import annotations

import dataclasses
import os
import resource

import anyio
from starlette.requests import Request

from refllm.errors import InvalidInputError
from refllm.server.protocol import RequestError

ACCEPT_BACKLOG = 64  # connections waiting in the kernel, and accepted at once before any can be refused
RESERVED_FILES = 64  # open files kept free besides: for the files and pipes the server opens while it runs


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 8 << 20  # a larger body is refused with 413 before it is read whole
    max_inputs: int = 64  # prompts of a completion, inputs of an embedding request
    max_request_tokens: int = 131_072  # tokens over all of a request's prompts or inputs
    max_images: int = 8  # images in one chat request
    max_image_bytes: int = 8 << 20  # one image's file (within the body's limit, as base64)
    max_image_pixels: int = 16_000_000  # one image's width x height, read from its header before decoding
    body_timeout: float = 30.0  # seconds to send a whole body (408 after)
    header_timeout: float = 10.0  # seconds from connecting (or from the last answer) to a whole request head
    idle_timeout: float = 5.0  # seconds a kept-alive connection may wait for its next request
    max_connections: int = 1024  # at most; always below the open-files limit (see ``connection_limit``)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidInputError(f"ServerLimits.{field.name} must be a positive number; got {value!r}")

    def connection_limit(self) -> int:
        """``max_connections``, lowered to fit in the open-files limit beside the files open now, ``RESERVED_FILES``
        and bursts of ``ACCEPT_BACKLOG`` connections: asyncio accepts a burst at each turn of its loop, and
        refuses (and closes) a connection a few turns later."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        free = soft - len(os.listdir("/dev/fd")) - 6 * ACCEPT_BACKLOG - RESERVED_FILES
        return max(1, min(self.max_connections, free))


async def read_body(request: Request, limits: ServerLimits) -> bytes:
    """The request's body, refused with 413 past ``max_body_bytes`` (before reading it, when its length says so)
    and with 408 when it does not arrive whole within ``body_timeout``."""
    too_large = RequestError(
        f"the request body is larger than this server's limit of {limits.max_body_bytes} bytes",
        status=413,
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        with anyio.fail_after(limits.body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {limits.body_timeout:g} s", status=408) from None
    return b"".join(chunks)
