"""The shared test server's settings and what tests read off it (tests/server/conftest.py serves it): waiting
until the engine is idle, the tracebacks it logged, connections it closes."""

from __future__ import annotations

import logging
import socket
import time

import httpx
import pytest

from refllm import CacheConfig
from refllm.runtime.engine import Engine
from refllm.server.limits import ServerLimits

MODEL = "tiny"  # the name the shared server serves its model under
CONTEXT = 512
ARENA = CacheConfig(block_size=4, num_blocks=96)  # 384 tokens: smaller than the context, so both limits show
# Short timeouts, so the tests of hostile clients stay short
LIMITS = ServerLimits(header_timeout=1.0, body_timeout=2.0, idle_timeout=1.0, max_inputs=48)
SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}


def tracebacks(log: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in log.records if record.exc_info]


def wait_until_idle(engine: Engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = engine.executor.status()
        if status.live_caches == 0 and status.blocks_free == status.blocks_total and not engine.has_work():
            return
        assert time.monotonic() < deadline, f"the engine is not idle: {status}"
        time.sleep(0.01)


def address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def small_request_answers(url: str) -> float:
    """Seconds a small completion from a fresh client takes; it must succeed."""
    start = time.monotonic()
    response = httpx.post(url + "/v1/completions", json=SMALL, timeout=30)
    assert response.status_code == 200, response.text
    return time.monotonic() - start


def rest_until_closed(connection: socket.socket, within: float = 2.0) -> bytes | None:
    """What the server sends until it closes ``connection`` (a reset counts as closed); None if still open."""
    deadline, rest = time.monotonic() + within, b""
    while time.monotonic() < deadline:
        connection.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = connection.recv(4096)
        except ConnectionResetError:
            return rest
        except TimeoutError:
            return None
        if not chunk:
            return rest
        rest += chunk
    return None
