"""HTTP hygiene: a connection closes after a response that left its request's body unread, and stays open
otherwise; the access log never shows a query string, so never an API key sent in one."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from refllm.server import BackgroundServer, create_app
from refllm.server.limits import ServerLimits
from tests.helpers.server import LIMITS, MODEL, address, rest_until_closed

KEY = "sk-very-secret-4242"


@pytest.fixture(scope="module")
def limits() -> ServerLimits:
    """The shared server with the short timeouts of the hostile-client tests (tests/server/conftest.py)."""
    return LIMITS


def exchange(connection: socket.socket, request: bytes) -> bytes:
    """Send ``request`` and read one whole answer (a JSON body whose length its head gives)."""
    connection.sendall(request)
    connection.settimeout(5)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += connection.recv(4096)
    head, _, body = answer.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = int(lengths[0])
    while len(body) < length:
        body += connection.recv(4096)
    return head


def test_a_whole_request_keeps_the_connection_and_a_refusal_before_the_body_closes_it(server):
    body = b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}'
    whole = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.create_connection(address(server)) as connection:
        for _ in range(2):  # kept alive: the second request on the same connection is answered too
            head = exchange(connection, whole)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        too_large = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n{" % (50 << 20)
        head = exchange(connection, too_large)  # refused from its Content-Length, the body unread
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
        assert rest_until_closed(connection) == b""


def test_a_refusal_by_the_api_key_check_closes_a_connection_whose_body_it_did_not_read(engine):
    with BackgroundServer(create_app(engine, model_name=MODEL, api_key=KEY)) as keyed:
        with socket.create_connection(address(keyed)) as connection:
            unread = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9\r\n\r\n{"
            head = exchange(connection, unread)
            assert head.startswith(b"HTTP/1.1 401") and b"connection: close" in head.lower()
            assert rest_until_closed(connection) == b""


@pytest.fixture
def access_log(caplog):
    """Call it once the server is up (a server's config resets uvicorn's loggers): uvicorn's access log, at INFO,
    into caplog (the access logger does not propagate, and the test servers log at WARNING)."""
    logger = logging.getLogger("uvicorn.access")
    level = logger.level

    def capture() -> pytest.LogCaptureFixture:
        logger.setLevel(logging.INFO)
        logger.addHandler(caplog.handler)
        return caplog

    yield capture
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


def test_the_access_log_never_shows_an_api_key_sent_in_a_query_string(engine, access_log):
    with BackgroundServer(create_app(engine, model_name=MODEL, api_key=KEY)) as keyed:
        log = access_log()
        assert httpx.get(f"{keyed.url}/v1/models?api_key={KEY}").status_code == 401  # refused: only a header counts
        header = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{keyed.url}/v1/models?api_key={KEY}&x=1", headers=header).status_code == 200
        assert httpx.get(f"{keyed.url}/health?{KEY}").status_code == 200
        assert httpx.get(f"{keyed.url}/v1/models", headers=header).status_code == 200
    lines = [record.getMessage() for record in log.records if record.name == "uvicorn.access"]
    assert len(lines) == 4 and not any(KEY in line for line in lines), lines
    assert sum('"GET /v1/models?[query string not logged] HTTP/1.1" ' in line for line in lines) == 2
    assert any('"GET /v1/models HTTP/1.1" 200' in line for line in lines)
