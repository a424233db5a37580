"""Over HTTP, one client's request cannot fail the others decoded with it.

Healthy streams run while another client sends a temperature below the floor (refused
with 400) or a request whose sequence fails in the engine (an injected fault: 500 naming
the cause); each healthy stream must carry the text it carries when sent alone.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from refllm import CacheConfig
from refllm.runtime.engine import Engine
from refllm.runtime.llm import LLM
from refllm.server import BackgroundServer, create_app
from tests.helpers.engine import CULPRIT, FaultyExecutor
from tests.helpers.server import wait_until_idle

HEALTHY = [
    {"prompt": [5, 6, 7], "temperature": 0},
    {"prompt": [8, 9], "temperature": 0.8, "seed": 4},
    {"prompt": [10, 11, 12, 13], "temperature": 1.0, "seed": 5, "top_k": 20, "logit_bias": {"40": 3}},
]
MAX_TOKENS = 120


@pytest.fixture(params=["raise", "nan"])
def faulty_server(request, model):
    llm = LLM(model, CacheConfig(block_size=4, num_blocks=256))
    engine = Engine(FaultyExecutor(llm, CULPRIT, request.param, after=len(CULPRIT) + 3), model.tokenizer)
    with BackgroundServer(create_app(engine, model_name="tiny")) as server:
        yield server, engine
    engine.close()


def completion(server, body: dict) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": MAX_TOKENS} | body
    return httpx.post(server.url + "/v1/completions", json=body, timeout=60)


def stream_text(server, body: dict, started: threading.Event, texts: dict, key: int) -> None:
    """Stream a completion; ``started`` is set at its first chunk; its text and last finish_reason land in texts."""
    body = {"model": "tiny", "max_tokens": MAX_TOKENS, "stream": True} | body
    text, reason = "", None
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            started.set()
            if line.startswith("data: {"):
                choice = httpx.Response(200, content=line[6:]).json()["choices"][0]
                text += choice["text"]
                reason = choice["finish_reason"] or reason
    texts[key] = (text, reason)


def healthy_beside(server, intruder: dict) -> tuple[dict, httpx.Response]:
    """The healthy streams, and the intruder sent once every stream has started."""
    texts: dict = {}
    started = [threading.Event() for _ in HEALTHY]
    threads = [
        threading.Thread(target=stream_text, args=(server, body, event, texts, k))
        for k, (body, event) in enumerate(zip(HEALTHY, started))
    ]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(30)
    answer = completion(server, intruder)
    for thread in threads:
        thread.join(60)
    return texts, answer


def test_healthy_streams_finish_as_alone_beside_a_failing_request_and_a_bad_temperature(faulty_server):
    server, engine = faulty_server
    choices = [completion(server, body).json()["choices"][0] for body in HEALTHY]
    alone = {k: (choice["text"], choice["finish_reason"]) for k, choice in enumerate(choices)}

    texts, answer = healthy_beside(server, {"prompt": CULPRIT, "temperature": 0})
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["type"] == "server_error"
    assert "failed on this request" in error["message"]
    assert ("broke on the culprit" if engine.executor.fault == "raise" else "NaN at token") in error["message"]
    assert engine.stats.largest_batch == len(HEALTHY) + 1  # the culprit ran in the healthy streams' batch
    assert texts == alone

    texts, answer = healthy_beside(server, {"prompt": [5], "temperature": 1e-39})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature"
    assert texts == alone
    wait_until_idle(engine)
