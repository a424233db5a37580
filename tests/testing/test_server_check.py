"""``refllm check --server`` always answers: against a correct server it passes; against a broken one (late,
endless, huge, malformed, wrong log-probabilities) it fails in one line, within its deadline, in bounded memory.

The correct server is ``refllm serve``'s app over a tiny random Llama; each broken one is a
thread on 127.0.0.1 that answers from it and then breaks the answer, or never answers
properly at all. Bodies of gigabytes are generated as they are sent, never held. One test
runs the real SmolLM2 through ``refllm serve``.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import refllm
from refllm.cli import main
from refllm.server import BackgroundServer, create_app
from refllm.testing.server_check import top_k_kl
from tests.helpers.real_models import SMOLLM2, real_model_or_skip

TIMEOUT = 2.0  # seconds for one answer in these tests
MAX_MB = 1
GIGABYTES = 2 << 30


@pytest.fixture(scope="module")
def correct(tiny) -> Iterator[str]:
    """``refllm serve``'s app over the tiny model: its base URL."""
    with BackgroundServer(create_app(refllm.load_model(tiny), model_name="tiny")) as server:
        yield server.url + "/v1"


def check(capsys, server: str, tiny: str, *more: str) -> tuple[int, list[str], float, int]:
    """Run ``refllm check`` in this process -> exit status, output lines, seconds, and peak resident bytes added."""
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to what is resident now
    before, start = status_bytes("VmRSS"), time.monotonic()
    limits = ["--timeout", str(TIMEOUT), "--run-timeout", "20", "--max-response-mb", str(MAX_MB)]
    code = main(["check", "--server", server, "--model", "tiny", "--reference", tiny, "--new-tokens", "4", *limits,
                 *more])  # fmt: skip
    seconds, peak = time.monotonic() - start, status_bytes("VmHWM") - before
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out.splitlines(), seconds, peak


def status_bytes(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


def test_a_correct_server_passes(capsys, correct, tiny):
    code, lines, _, _ = check(capsys, correct, tiny)
    assert code == 0, lines
    assert lines[-1] == "3/3 prompts pass" and "same top token 100.0%" in lines[-3]
    for i, line in enumerate(lines[1:4]):
        assert line.startswith(f"prompt {i} ok: greedy 4/4 agree; KL on the top k"), line


# --- broken servers -------------------------------------------------------------------------------------------

Answer = Callable[["FakeHandler", dict], None]  # writes the whole answer to a request whose body is the dict


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answer: Answer
    correct_url: str
    stop: threading.Event

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            type(self).answer(self, body)
        except OSError:  # the check hung up, as it should on an answer too late or too large
            pass

    def send(self, payload: bytes, status: int = 200, headers: tuple = ()) -> None:
        self.send_response(status)
        for name, value in (("Content-Type", "application/json"), ("Content-Length", str(len(payload))), *headers):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def corrected(self, body: dict) -> tuple[int, dict]:
        """The correct server's answer to the same request."""
        response = httpx.post(type(self).correct_url + "/completions", json=body, timeout=30)
        return response.status_code, response.json()

    def log_message(self, *args) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass


@pytest.fixture
def fake(correct) -> Iterator[Callable[..., str]]:
    """Serve ``answer`` on a free port of 127.0.0.1 (over TLS with ``tls``, a context) -> the base URL (``.../v1``)."""
    servers, stop = [], threading.Event()

    def serve(answer: Answer, tls: ssl.SSLContext | None = None) -> str:
        handler = type("Handler", (FakeHandler,), {"answer": answer, "correct_url": correct, "stop": stop})
        server = QuietServer(("127.0.0.1", 0), handler)
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}/v1"

    yield serve
    stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


def broken(change: Callable[[dict], None], *, nan: bool = False) -> Answer:
    """Answer as the correct server does, with its logprobs changed by ``change`` (in place)."""

    def answer(handler: FakeHandler, body: dict) -> None:
        status, answer = handler.corrected(body)
        if status == 200:
            change(answer)
        handler.send(json.dumps(answer, allow_nan=nan).encode(), status)

    return answer


def logprobs(answer: dict) -> dict:
    return answer["choices"][0]["logprobs"]


def first_step_only(answer: dict) -> None:
    top = logprobs(answer)["top_logprobs"]
    top[1:] = [None] * (len(top) - 1)


def truncated(keep: int, reason: str) -> Callable[[dict], None]:
    def change(answer: dict) -> None:
        for column in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            del logprobs(answer)[column][keep:]
        answer["choices"][0]["finish_reason"] = reason

    return change


def top_1_only(answer: dict) -> None:
    top = logprobs(answer)["top_logprobs"]
    top[:] = [dict(list(entry.items())[:1]) for entry in top]


def reversed_order(answer: dict) -> None:
    top = logprobs(answer)["top_logprobs"]
    top[:] = [dict(reversed(list(entry.items()))) for entry in top]


def nan_at_step_2(answer: dict) -> None:
    entry = logprobs(answer)["top_logprobs"][2]
    entry[next(iter(entry))] = math.nan


def flattened(answer: dict) -> None:
    """Every top-k log-probability halved: the order and the top token stay, the distribution does not."""
    for entry in logprobs(answer)["top_logprobs"]:
        entry.update({text: value / 2 for text, value in entry.items()})


def endless(piece: bytes, every: float, chunked: bool, total: float = math.inf) -> Answer:
    """A 200 whose body is ``piece`` after ``piece``, ``every`` seconds apart, up to ``total`` bytes, made as sent:
    chunked, or (without) ending only when the connection closes."""

    def answer(handler: FakeHandler, body: dict) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding" if chunked else "Connection", "chunked" if chunked else "close")
        handler.end_headers()
        opening = b'{"choices": ['
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(opening), opening) if chunked else opening)
        sent = 0
        while sent < total and not handler.stop.is_set():
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
            if every:
                time.sleep(every)

    return answer


def silent(handler: FakeHandler, body: dict) -> None:
    handler.stop.wait(60)


def declared_two_gigabytes(handler: FakeHandler, body: dict) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", str(GIGABYTES))
    handler.end_headers()
    handler.wfile.write(b"{" * 4096)


LATE = f"no whole answer within {TIMEOUT:g} s"
TOO_LARGE = f"the answer is larger than {MAX_MB << 20} bytes"
BROKEN = {
    "a chunked body that never ends": (endless(b"[" * 100, 0.05, chunked=True), LATE),
    "2 GB trickled": (endless(b" " * 1024, 0.02, chunked=False, total=GIGABYTES), LATE),
    "2 GB fast": (endless(b" " * (1 << 16), 0, chunked=False, total=GIGABYTES), TOO_LARGE),
    "2 GB fast, chunked": (endless(b" " * (1 << 16), 0, chunked=True, total=GIGABYTES), TOO_LARGE),
    "2 GB by its Content-Length": (declared_two_gigabytes, "(its Content-Length is 2147483648)"),
    "a silent server": (silent, LATE),
    "no choices": (lambda handler, body: handler.send(b'{"choices": []}'), "choices is empty"),
    "an answer that is not JSON": (lambda handler, body: handler.send(b"<html>"), "the answer is not JSON"),
    "null logprobs": (broken(lambda a: a["choices"][0].update(logprobs=None)), "choices[0].logprobs is null"),
    "a string top-k entry": (
        broken(lambda a: logprobs(a)["top_logprobs"].__setitem__(0, "abc")),
        "choices[0].logprobs.top_logprobs[0] is str 'abc', not an object",
    ),
    "1 token of 4": (broken(truncated(1, "length")), "holds 1 tokens of the 4 asked for, and finish_reason is 'len"),
    "a top-k at the first step only": (broken(first_step_only), "choices[0].logprobs.top_logprobs[1] is null"),
    "a top-1 for a top-5": (broken(top_1_only), "top_logprobs[0] holds 1 tokens; the top 5 was asked for"),
    "NaN log-probabilities": (broken(nan_at_step_2, nan=True), "is nan, not a log-probability"),
    "a positive log-probability": (
        broken(lambda a: logprobs(a)["token_logprobs"].__setitem__(1, 0.5)),
        "token_logprobs[1] is 0.5, not a log-probability",
    ),
    "a reversed top-k": (broken(reversed_order), "top_logprobs[0] is not most likely first"),
    "tokens and top-k of different lengths": (
        broken(lambda a: logprobs(a)["tokens"].pop()),
        "token_logprobs has 4 entries for 3 tokens",
    ),
    "an HTTP error": (lambda handler, body: handler.send(b'{"error": "overloaded"}', 503), "HTTP 503: {\"error\""),
}


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_server_fails_in_one_line_within_the_deadline_in_bounded_memory(name, capsys, fake, tiny):
    answer, expected = BROKEN[name]
    code, lines, seconds, peak = check(capsys, fake(answer), tiny)
    assert code == 1 and len(lines) == 2, lines  # what is checked, then the one line of the verdict
    assert lines[1].startswith("prompt 0 FAIL: ") and expected in lines[1], lines[1]
    assert seconds < TIMEOUT + 3, f"{name}: {seconds:.1f} s"
    assert peak < 100 << 20, f"{name}: {peak >> 20} MB"


@pytest.mark.parametrize(
    "change, expected",
    [
        (flattened, "; past its bound at step "),
        (truncated(3, "stop"), "then the server stopped (finish_reason 'stop') where the reference goes on"),
    ],
    ids=["log-probabilities off with the tokens right", "an early stop"],
)
def test_answers_of_the_right_shape_but_wrong_fail(change, expected, capsys, fake, tiny):
    code, lines, _, _ = check(capsys, fake(broken(change)), tiny)
    assert code == 1 and lines[-1] == "0/3 prompts pass"
    assert all(line.startswith(f"prompt {i} FAIL: ") and expected in line for i, line in enumerate(lines[1:4])), lines


@pytest.fixture
def tls(tmp_path, monkeypatch) -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 that this process trusts (through SSL_CERT_FILE)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_over_tls_a_correct_server_passes_and_a_late_one_fails_within_the_deadline(capsys, fake, tiny, tls):
    code, lines, _, _ = check(capsys, fake(broken(lambda answer: None), tls), tiny)
    assert code == 0 and lines[-1] == "3/3 prompts pass", lines
    for late in (silent, BROKEN["2 GB trickled"][0]):
        code, lines, seconds, _ = check(capsys, fake(late, tls), tiny)
        assert code == 1 and lines[-1] == f"prompt 0 FAIL: {LATE}" and seconds < TIMEOUT + 3


def test_no_server_at_the_address_is_one_line_before_anything_loads(capsys, tiny):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # a port nobody listens on
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        start = time.monotonic()
        code = main(["check", "--server", url, "--model", "tiny", "--reference", tiny])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and time.monotonic() - start < TIMEOUT
    assert err.startswith(f"refllm: error: cannot reach {url}: ") and "refused" in err and len(err.splitlines()) == 1


def test_the_run_has_a_deadline_of_its_own(capsys, fake, tiny):
    code, lines, seconds, _ = check(capsys, fake(endless(b" ", 0.5, chunked=True)), tiny, "--run-timeout", "1")
    assert code == 1 and seconds < 4
    assert lines[-1] == "prompt 0 FAIL: the run passed its deadline of 1 s (--run-timeout) before an answer came"


def test_top_k_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    p = {"a": -0.1, "b": -2.5, "c": -4.0}
    assert top_k_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    assert top_k_kl(p, {"a": -2.5, "b": -0.1, "c": -4.0}) > 0.5


# --- the real model through refllm serve ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_smollm2():
    path = real_model_or_skip(SMOLLM2)
    port = free_port()
    command = [sys.executable, "-m", "refllm", "serve", "--model", str(path), "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"refllm serve exited: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        models = json.loads(urllib.request.urlopen(f"{url}/models", timeout=5).read())
        yield url, models["data"][0]["id"], str(path)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.real_model
def test_check_server_passes_against_refllm_serve(served_smollm2, capsys):
    url, name, path = served_smollm2
    assert main(["check", "--server", url, "--model", name, "--reference", path, "--new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "3/3 prompts pass" in out and "same top token 100.0%" in out
    assert "prompt logprobs: not offered" in out  # refllm serve does not echo prompts
