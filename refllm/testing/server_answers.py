"""A server's completions answer, fetched within a deadline and a size cap, then checked for shape.

``post_json`` bounds the whole exchange, not each read: every read and write of its
socket (TLS too) waits at most until the deadline, and none starts after it, however the
server trickles; the body is read in pieces and refused past ``max_bytes`` (from its
Content-Length when it gives one), so a server that never stops or sends gigabytes
costs at most that much time and memory.
``served_steps`` checks what the check relies on and says, in one line, what was wrong:
a completion, with log-probabilities, a token and a top-k at every step, every
log-probability a finite number <= 0, each top-k most likely first.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from refllm.errors import InvalidInputError

READ_PIECE = 1 << 16
LOGPROB_SLACK = 1e-4  # a log-probability may pass 0 by this much (rounding of a probability near 1)


class ServerAnswerError(InvalidInputError):
    """An answer the check cannot judge (late, too large, not JSON, the wrong shape): one line saying why."""


class ServerRefusedError(ServerAnswerError):
    """The server answered with an HTTP error."""


class AnswerTooLateError(ServerAnswerError):
    """No whole answer came within the time given."""


def post_json(url: str, body: dict, *, timeout: float, max_bytes: int) -> Any:
    """POST ``body`` as JSON -> the answer's JSON, complete within ``timeout`` seconds and ``max_bytes`` bytes."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerAnswerError(f"{url} is not an http:// or https:// URL")
    if timeout <= 0:
        raise AnswerTooLateError("no time is left for another request")
    deadline = time.monotonic() + timeout
    if parts.scheme == "https":
        context = ssl.create_default_context()
        context.sslsocket_class = _DeadlineSSLSocket
        connection: http.client.HTTPConnection = _HTTPSConnection(parts.hostname, parts.port, deadline, context)
    else:
        connection = _HTTPConnection(parts.hostname, parts.port, deadline)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = read_capped(response, max_bytes)
    except ServerAnswerError:
        raise
    except TimeoutError:
        raise AnswerTooLateError(f"no whole answer within {timeout:g} s") from None
    except http.client.HTTPException as error:
        raise ServerAnswerError(f"{url}: the answer is not well-formed HTTP ({error!r:.200})") from None
    except (OSError, ValueError) as error:
        raise ServerAnswerError(f"{url}: {_one_line(str(error)) or type(error).__name__}") from None
    finally:
        connection.close()
    if response.status != 200:
        raise ServerRefusedError(f"{url}: HTTP {response.status}: {_one_line(raw[:300].decode(errors='replace'))}")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ServerAnswerError(f"the answer is not JSON: {error}") from None
    except RecursionError:
        raise ServerAnswerError("the answer nests its JSON deeper than Python's parser goes") from None


class _Deadline:
    """A socket whose every read and write waits at most until ``deadline`` (``time.monotonic``), and whose
    reads and writes after it raise TimeoutError."""

    deadline = math.inf

    def _wait_at_most_until_the_deadline(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline has passed")
        self.settimeout(left)  # type: ignore[attr-defined]

    def recv_into(self, *args: Any) -> int:
        self._wait_at_most_until_the_deadline()
        return super().recv_into(*args)  # type: ignore[misc]

    def sendall(self, *args: Any) -> None:
        self._wait_at_most_until_the_deadline()
        super().sendall(*args)  # type: ignore[misc]


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, deadline: float):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 1e-3))
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(fileno=self.sock.detach())
        self.sock.deadline = self.deadline


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, deadline: float, context: ssl.SSLContext):
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 1e-3), context=context)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()  # the TLS handshake's reads and writes wait at most the timeout, the time left
        self.sock.deadline = self.deadline


def read_capped(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The response's body, refused once past ``max_bytes`` (before reading, when its Content-Length says so)."""
    too_large = f"the answer is larger than {max_bytes} bytes, the most this check reads"
    declared = response.getheader("content-length") or ""
    if declared.isdigit() and int(declared) > max_bytes:
        raise ServerAnswerError(f"{too_large} (its Content-Length is {declared})")
    pieces, size = [], 0
    while piece := response.read1(READ_PIECE):
        size += len(piece)
        if size > max_bytes:
            raise ServerAnswerError(too_large)
        pieces.append(piece)
    return b"".join(pieces)


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class ServedSteps:
    """A completion's tokens with their log-probabilities: the chosen token's and the top-k's, step by step."""

    tokens: list[str]
    token_logprobs: list[float]
    top: list[dict[str, float]]  # most likely first
    finish_reason: str | None


def served_steps(answer: Any, asked: int) -> ServedSteps:
    """A completions answer (``logprobs`` asked for) -> its steps; ServerAnswerError naming what is malformed.

    Fewer tokens than ``asked`` are accepted only with ``finish_reason`` "stop".
    """
    choices = _field(answer, "choices", list, "the answer")
    if not choices:
        raise ServerAnswerError("the answer's choices is empty: no completion came back")
    choice = _of_type(choices[0], dict, "choices[0]")
    where = "choices[0].logprobs"
    logprobs = _of_type(choice.get("logprobs"), dict, where)
    tokens = _field(logprobs, "tokens", list, where)
    token_logprobs = _field(logprobs, "token_logprobs", list, where)
    top = _field(logprobs, "top_logprobs", list, where)
    finish_reason = choice.get("finish_reason")
    for name, column in (("token_logprobs", token_logprobs), ("top_logprobs", top)):
        if len(column) != len(tokens):
            raise ServerAnswerError(f"{where}.{name} has {len(column)} entries for {len(tokens)} tokens")
    if not 1 <= len(tokens) <= asked:
        raise ServerAnswerError(f"{where}.tokens holds {len(tokens)} tokens; {asked} were asked for")
    if len(tokens) < asked and finish_reason != "stop":
        raise ServerAnswerError(
            f"{where}.tokens holds {len(tokens)} tokens of the {asked} asked for, and finish_reason is"
            f" {finish_reason!r}, not 'stop'"
        )
    for step, token in enumerate(tokens):
        _of_type(token, str, f"{where}.tokens[{step}]")
        _logprob(token_logprobs[step], f"{where}.token_logprobs[{step}]")
        entry = _of_type(top[step], dict, f"{where}.top_logprobs[{step}]")
        if not entry:
            raise ServerAnswerError(f"{where}.top_logprobs[{step}] is empty: no top-k at step {step}")
        values = [_logprob(value, f"{where}.top_logprobs[{step}][{key!r:.40}]") for key, value in entry.items()]
        if any(later > earlier for earlier, later in zip(values, values[1:])):
            raise ServerAnswerError(f"{where}.top_logprobs[{step}] is not most likely first: {values}")
    return ServedSteps(tokens, [float(v) for v in token_logprobs], top, finish_reason)


def _field(container: Any, name: str, kind: type, where: str) -> Any:
    if not isinstance(container, dict) or name not in container:
        raise ServerAnswerError(f"{where} has no {name!r}")
    return _of_type(container[name], kind, f"{where}.{name}")


def _of_type(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        names = {dict: "an object", list: "a list", str: "a string"}
        shown = "null" if value is None else f"{type(value).__name__} {value!r:.40}"
        raise ServerAnswerError(f"{where} is {shown}, not {names[kind]}")
    return value


def _logprob(value: Any, where: str) -> float:
    """A log-probability: a finite number, at most 0 (give or take LOGPROB_SLACK)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value <= LOGPROB_SLACK):
        raise ServerAnswerError(f"{where} is {value!r:.40}, not a log-probability (a finite number <= 0)")
    return float(value)
