"""Hostile clients over HTTP: under each, a small request from another client still answers within 2 s.

A 50 MB body, a 5 MB prompt, an abandoned 48-input embeddings request, 200 slow
connections and a server out of open files; then who may use the server (API key,
Host, Origin, CORS). The server runs on 127.0.0.1 over the tiny model of
tests/server/conftest.py, with short timeouts so the tests stay short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from refllm.commands.serve import add_cli
from refllm.server import BackgroundServer, create_app
from refllm.server.connections import GuardedServer, server_config
from refllm.server.guard import hosts_for
from refllm.server.limits import ServerLimits
from tests.helpers.model_directory import write_tiny_model
from tests.helpers.server import (
    LIMITS,
    MODEL,
    SMALL,
    address,
    rest_until_closed,
    small_request_answers,
    tracebacks,
    wait_until_idle,
)

ANSWER_WITHIN = 2.0  # seconds


@pytest.fixture(scope="module")
def limits() -> ServerLimits:
    """The shared server with short timeouts, so the tests stay short (tests/server/conftest.py)."""
    return LIMITS


@contextlib.contextmanager
def in_background(work) -> Iterator[dict]:
    """Run ``work()`` on a thread while the block runs; its result (or error) lands in the yielded dict."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except Exception as error:  # noqa: BLE001 (handed to the test)
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        thread.join(timeout=60)


def closed_by_server(connection: socket.socket) -> bool:
    """Whether the server has closed ``connection`` (an end of stream, or a reset when it left data unread)."""
    connection.settimeout(2)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def rss_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()


# --- bodies and prompts -------------------------------------------------------------------------------------


def test_a_50_mb_body_is_refused_with_413_and_others_are_served(server, server_log):
    before = rss_bytes()

    def fifty_megabytes() -> httpx.Response:
        chunks = (b"x" * (1 << 20) for _ in range(50))  # sent as it is made, without a Content-Length
        return httpx.post(server.url + "/v1/completions", content=chunks, timeout=30)

    with in_background(fifty_megabytes) as result:
        assert small_request_answers(server.url) < ANSWER_WITHIN
    response = result.get("value")
    assert response is not None and response.status_code == 413, result
    assert response.json()["error"]["code"] == "request_too_large"
    with socket.create_connection(address(server)) as connection:  # refused from its Content-Length, unread
        head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {50 << 20}\r\n\r\n{{"
        connection.sendall(head.encode())
        connection.settimeout(ANSWER_WITHIN)
        assert connection.recv(4096).startswith(b"HTTP/1.1 413")
    assert rss_bytes() - before < 100 << 20
    assert not tracebacks(server_log)


def test_a_5_mb_prompt_is_refused_unread_and_another_client_streams_on(server, client_stream_gaps):
    prompt = {"model": MODEL, "prompt": "hello world " * (5_000_000 // 12), "max_tokens": 4}
    with client_stream_gaps() as gaps:
        start = time.monotonic()
        response = httpx.post(server.url + "/v1/completions", json=prompt, timeout=30)
        refused_after = time.monotonic() - start
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert refused_after < ANSWER_WITHIN
    assert max(gaps) < ANSWER_WITHIN


@pytest.fixture
def client_stream_gaps(server):
    """A context in which another client streams a long completion; it yields the gaps between its chunks."""

    @contextlib.contextmanager
    def streaming() -> Iterator[list[float]]:
        gaps: list[float] = []
        started = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "prompt": "the", "max_tokens": 150, "ignore_eos": True, "stream": True}
            last = time.monotonic()
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
                for _ in response.iter_lines():
                    started.set()
                    gaps.append(time.monotonic() - last)
                    last = time.monotonic()

        with in_background(stream):
            assert started.wait(30)
            yield gaps
        assert len(gaps) > 10

    return streaming


def test_inputs_and_tokens_per_request_are_capped(server, engine):
    response = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": ["a"] * 49})
    assert response.status_code == 400 and "limit of 48" in response.json()["error"]["message"]
    capped = ServerLimits(max_request_tokens=100)
    with BackgroundServer(create_app(engine, model_name=MODEL, limits=capped)) as small:
        response = httpx.post(small.url + "/v1/completions", json=SMALL | {"prompt": [[5] * 60, [5] * 60]})
        assert response.status_code == 400 and "120 tokens" in response.json()["error"]["message"]


def test_a_body_sent_a_byte_at_a_time_is_cut_off_with_408_and_the_connection_closed(server):
    """RFC 9110: a server that sends 408 closes the connection, so the rest of the body is never a next request."""
    with socket.create_connection(address(server)) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
        start = time.monotonic()
        answer = b""
        while b"408" not in answer and time.monotonic() - start < 10:
            connection.sendall(b"{")
            connection.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                answer += connection.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and LIMITS.body_timeout <= time.monotonic() - start < 6
        assert b"connection: close" in answer.lower()
        assert rest_until_closed(connection) is not None  # and nothing more comes: no answer to the rest of the body


# --- embeddings ---------------------------------------------------------------------------------------------


@pytest.fixture
def slow_embeddings(monkeypatch) -> list[float]:
    """Each embedding input takes 0.2 s more (as a long input of a real model would); yields when each ran."""
    import refllm.server.embeddings as embeddings

    ran: list[float] = []
    pooled = embeddings.pooled_hidden_states

    def slowly(model, ids):
        time.sleep(0.2)
        ran.append(time.monotonic())
        return pooled(model, ids)

    monkeypatch.setattr(embeddings, "pooled_hidden_states", slowly)
    return ran


def test_an_abandoned_48_input_embeddings_request_stops_and_others_are_served(server, slow_embeddings):
    body = json.dumps({"model": MODEL, "input": [[5] * 400] * 48}).encode()
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(address(server)) as connection:
        connection.sendall(head.encode() + body)
        while not slow_embeddings:  # under way
            time.sleep(0.01)
    left = time.monotonic()  # 48 inputs would take 9.6 s more
    start = time.monotonic()
    one_word = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": "hi"}, timeout=30)
    assert one_word.status_code == 200 and time.monotonic() - start < ANSWER_WITHIN
    time.sleep(0.6)
    assert len(slow_embeddings) <= 5 and all(t < left + 0.6 for t in slow_embeddings)  # stopped when the client left


def test_a_one_word_request_behind_a_48_input_one_waits_for_one_input_not_all(server, slow_embeddings):
    long = {"model": MODEL, "input": [[5] * 400] * 48, "encoding_format": "float"}
    with in_background(lambda: httpx.post(server.url + "/v1/embeddings", json=long, timeout=60)) as result:
        while not slow_embeddings:
            time.sleep(0.01)
        start = time.monotonic()
        one_word = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": "hi"}, timeout=30)
        assert one_word.status_code == 200 and time.monotonic() - start < ANSWER_WITHIN
    assert result["value"].status_code == 200 and len(result["value"].json()["data"]) == 48


# --- connections ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_200_slow_connections_are_closed_after_the_header_timeout_and_others_are_served(server, server_log):
    connections = [socket.create_connection(address(server)) for _ in range(200)]
    try:
        for connection in connections[::2]:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head, never finished
        assert small_request_answers(server.url) < ANSWER_WITHIN
        time.sleep(LIMITS.header_timeout + 1.0)
        assert all(closed_by_server(connection) for connection in connections)
    finally:
        for connection in connections:
            connection.close()
    closed = [r for r in server_log.records if "no whole request head" in r.getMessage()]
    assert len(closed) == 200 and not tracebacks(server_log)  # one line each


TINY_SERVER = """
import resource, sys
from refllm.cli import main
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sys.exit(main(["serve", "--model", sys.argv[2], "--port", sys.argv[3]]))
"""


@pytest.mark.slow
def test_a_server_out_of_open_files_still_serves_a_new_client(tmp_path):
    """The server may open 640 files; 1000 idle connections would take them all, were it not for its cap."""
    directory = write_tiny_model(tmp_path / "tiny")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", TINY_SERVER, "640", str(directory), str(port)],
            stderr=log,
            stdout=log,
            env=os.environ | {"PYTHONPATH": os.getcwd()},
        )
    url = f"http://127.0.0.1:{port}"
    hoarded = []
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        hoarded = [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
        start = time.monotonic()
        response = httpx.post(url + "/v1/completions", json=SMALL | {"model": "tiny"}, timeout=30)
        assert response.status_code == 200 and time.monotonic() - start < ANSWER_WITHIN
    finally:
        for connection in hoarded:
            connection.close()
        process.terminate()
        process.wait(30)
    text = log_path.read_text()
    assert "over the limit of" in text and "Traceback" not in text  # idle connections were closed, one line each
    served = text[text.index("serving tiny") :].splitlines()[1:]  # the log after the start-up line
    assert all(line.startswith(("INFO:", "WARNING:")) for line in served), f"a log entry of several lines: {text}"


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# --- who may use the server ------------------------------------------------------------------------------------


def test_an_api_key_is_needed_on_every_endpoint_but_health(engine):
    app = create_app(engine, model_name=MODEL, api_key="sesame")
    with BackgroundServer(app) as server:
        assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": MODEL}
        for method, path in [("GET", "/v1/models"), ("GET", "/v1/model/info"), ("POST", "/v1/completions")]:
            response = httpx.request(method, server.url + path, json=SMALL)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        assert client.completions.create(**SMALL).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="guess", max_retries=0).models.list()


def test_a_foreign_host_header_is_refused(server):
    response = httpx.get(server.url + "/v1/models", headers={"Host": "rebound.example:8000"})
    assert response.status_code == 403 and "rebound.example" in response.json()["error"]["message"]
    assert httpx.get(server.url.replace("127.0.0.1", "localhost") + "/v1/models").status_code == 200


def test_a_cross_site_text_plain_post_is_refused_before_it_generates(server, engine):
    before = engine.stats.prefills
    response = httpx.post(
        server.url + "/v1/completions",
        content=json.dumps(SMALL),
        headers={"Content-Type": "text/plain", "Origin": "https://attacker.example"},
    )
    assert response.status_code == 403 and "access-control-allow-origin" not in response.headers
    assert engine.stats.prefills == before
    own_page = httpx.post(server.url + "/v1/completions", json=SMALL, headers={"Origin": server.url})
    assert own_page.status_code == 200  # a page the server itself serves is the same origin
    other_port = httpx.post(server.url + "/v1/completions", json=SMALL, headers={"Origin": "http://127.0.0.1:1"})
    assert other_port.status_code == 403


def test_cors_is_off_unless_an_origin_is_named(engine):
    origin = "https://app.example"
    with BackgroundServer(create_app(engine, model_name=MODEL, cors_origins=[origin])) as server:
        preflight = httpx.options(
            server.url + "/v1/completions",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type"},  # fmt: skip
        )
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == origin
        response = httpx.post(server.url + "/v1/completions", json=SMALL, headers={"Origin": origin})
        assert response.status_code == 200 and response.headers["access-control-allow-origin"] == origin
        other = httpx.post(server.url + "/v1/completions", json=SMALL, headers={"Origin": "https://other.example"})
        assert other.status_code == 403


def test_the_serve_command_line_takes_the_key_from_the_environment_and_the_safety_flags(monkeypatch):
    monkeypatch.setenv("REFLLM_API_KEY", "from-env")
    parser = argparse.ArgumentParser(prog="refllm")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.api_key, args.allowed_host, args.cors_origin, args.max_body_mb) == ("from-env", None, [], 8.0)
    args = parser.parse_args(
        ["serve", "--api-key", "k", "--allowed-host", "box.lan", "--cors-origin", "https://a.example"]
    )
    assert (args.api_key, args.allowed_host, args.cors_origin) == ("k", ["box.lan"], ["https://a.example"])
    assert hosts_for("127.0.0.1") == ("127.0.0.1", "localhost", "::1") and hosts_for("0.0.0.0") is None


@pytest.mark.slow
def test_concurrent_greedy_streams_are_identical_and_leave_nothing_behind(server, engine):
    """The limits change nothing for well-behaved clients: 16 greedy streams at once, three rounds, all the same
    text, every block free after each round, and resident memory flat from the second round to the third."""
    body = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 40, "temperature": 0}
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def stream(_: int) -> str:
        chunks = client.completions.create(**body, stream=True, extra_body={"ignore_eos": True})
        return "".join(chunk.choices[0].text for chunk in chunks)

    rss = []
    for _ in range(3):
        with ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(stream, range(16)))
        assert len(set(texts)) == 1 and texts[0]
        wait_until_idle(engine)
        rss.append(rss_bytes())
    assert rss[2] - rss[1] < 20 << 20


def test_a_request_that_is_not_http_or_has_a_huge_head_gets_an_openai_error(server, server_log):
    for garbage in [b"\x16\x03\x01\x02\x00 not http\r\n\r\n", b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"]:
        with socket.create_connection(address(server)) as connection:
            connection.sendall(garbage)
            connection.settimeout(5)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"]["type"] == "invalid_request_error"
    assert not tracebacks(server_log)


def test_an_accept_resumed_on_the_closed_socket_at_shutdown_is_one_line(caplog, monkeypatch):
    """asyncio resumes accepting a second after running out of files; if the server closed meanwhile, one line."""
    server = GuardedServer(server_config(None, "127.0.0.1", 0))  # never started: only its exception handler runs
    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "handlers", [caplog.handler])  # uvicorn's prints
    loop = asyncio.new_event_loop()
    closed_socket = {"message": "Exception in callback", "exception": ValueError("Invalid file descriptor: -1")}
    try:
        server.should_exit = True
        with caplog.at_level(logging.INFO):
            server._one_line_for_os_errors(loop, closed_socket)
        assert [r.getMessage() for r in caplog.records] == [
            "stopped accepting connections while shutting down: Invalid file descriptor: -1"
        ]
        caplog.clear()
        server.should_exit = False  # while serving, the same error is a bug: asyncio's report, with its traceback
        with caplog.at_level(logging.INFO):
            server._one_line_for_os_errors(loop, closed_socket)
        assert caplog.records and caplog.records[0].name == "asyncio" and caplog.records[0].exc_info
    finally:
        loop.close()
