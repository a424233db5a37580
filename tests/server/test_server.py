"""The OpenAI-compatible server, driven by the official openai client over a real socket.

Most tests share one server (port 0 on 127.0.0.1) over a random tiny Llama
paired with an in-memory byte-level BPE tokenizer and a ChatML template, so
they run in seconds; after each one the engine must be idle and its KV arena
all free. One test streams a chat answer from the real SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import threading
import time

import httpx
import numpy as np
import openai
import pytest

import refllm
from refllm import CacheConfig
from refllm.commands.serve import add_cli, model_id
from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.engine import Engine
from refllm.runtime.sampling import SamplingParams
from refllm.server import BackgroundServer, create_app
from tests.helpers.engine import failing_script
from tests.helpers.real_models import SMOLLM2, real_model_or_skip
from tests.helpers.server import ARENA, CONTEXT, MODEL, tracebacks, wait_until_idle

HELLO = [{"role": "user", "content": "hello world"}]


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat_prompt(model, messages) -> list[int]:
    text = model.tokenizer.apply_chat_template(messages)
    return model.tokenizer.encode(text, add_special_tokens=False)


def post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)


# --- the endpoints ----------------------------------------------------------------------------------


def test_models_and_model_info(server, client, engine):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    info = httpx.get(server.url + "/v1/model/info").json()
    assert info["id"] == MODEL and info["context_length"] == CONTEXT and info["embedding_dimensions"] == 32
    capabilities = info["capabilities"]
    assert capabilities["embeddings"] and capabilities["logprobs"] and capabilities["speculative_decoding"]
    assert capabilities["chat_completions"] and info["max_batch_size"] == 8
    assert info["kv_cache"]["blocks_free"] == info["kv_cache"]["blocks_total"] == ARENA.num_blocks


def test_chat_completion_is_what_the_engine_generates(model, engine, client):
    answer = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    prompt = chat_prompt(model, HELLO)
    expected = engine.submit(prompt, SamplingParams(max_tokens=12)).result().completions[0]
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(prompt), 12)
    assert answer.model == MODEL and answer.object == "chat.completion"


def test_streamed_chat_equals_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_logprobs_cover_every_token(client):
    answer = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens == 8
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy takes the likeliest
        assert entry.bytes == list(entry.token.encode())


def test_completions_of_several_prompts_with_n_seed_and_logprobs(client):
    def ask():
        return client.completions.create(
            model=MODEL, prompt=["the quick", "hello"], n=2, max_tokens=5, temperature=0.9, seed=11, logprobs=2
        )

    answer = ask()
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    for choice in answer.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == 5
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
        assert choice.logprobs.text_offset[0] == 0 and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 20
    assert [c.text for c in ask().choices] == [c.text for c in answer.choices]  # the seed makes it reproducible


def test_a_prompt_of_token_ids_and_a_stop_string(model, client):
    ids = model.tokenizer.encode("the lazy dog")
    text = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0).choices[0].text
    stop = text[4:7]
    assert stop.strip(), f"the greedy text {text!r} has no usable stop string"
    choice = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0, stop=[stop]).choices[0]
    assert choice.text == text[: text.index(stop)] and choice.finish_reason == "stop"


def test_logit_bias_forces_or_bans_tokens_as_openai_defines_it(model, engine, client):
    ids = model.tokenizer.encode("the lazy dog")
    forced = model.tokenizer.encode("x", add_special_tokens=False)[0]
    choice = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=6, temperature=1.0, seed=2, logit_bias={str(forced): 100}, logprobs=1
    ).choices[0]
    assert choice.text == "x" * 6 and choice.logprobs.token_logprobs[0] < 0  # logprobs stay the model's own
    first = engine.generate([ids], SamplingParams(max_tokens=1))[0].completions[0].token_ids[0]
    banned = engine.generate([ids], SamplingParams(max_tokens=8, logit_bias={first: -100}))[0].completions[0]
    assert banned.token_ids[0] != first
    served = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, logit_bias={str(first): -100}
    ).choices[0]
    assert served.text == banned.text


def test_embeddings_are_unit_mean_pooled_hidden_states(model, client):
    texts = ["hello world", "the quick brown fox"]
    answer = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64
    as_floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    for text, item, floats in zip(texts, answer.data, as_floats.data):
        ids = model.tokenizer.encode(text)
        cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
        hidden = model.prefill_hidden(np.array([ids]), cache, range(len(ids)))
        expected = hidden[0].mean(axis=0) / np.linalg.norm(hidden[0].mean(axis=0))
        np.testing.assert_allclose(item.embedding, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(floats.embedding, item.embedding, rtol=1e-6)
    assert answer.usage.prompt_tokens == sum(len(model.tokenizer.encode(t)) for t in texts)
    by_ids = client.embeddings.create(model=MODEL, input=[model.tokenizer.encode(texts[0])], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, as_floats.data[0].embedding, rtol=1e-6)


# --- concurrency and disconnects --------------------------------------------------------------------------


def test_two_clients_stream_at_once(model, engine, client):
    """A long stream, and a short one that starts once the long one is under way: decoded in one batch."""
    questions = [[{"role": "user", "content": "the quick brown fox"}], [{"role": "user", "content": "hello"}]]
    lengths = [200, 24]
    expected = [
        engine.submit(chat_prompt(model, q), SamplingParams(max_tokens=n, ignore_eos=True)).result().completions[0]
        for q, n in zip(questions, lengths)
    ]
    before = dataclasses.replace(engine.stats)
    first_token = threading.Event()
    streams: dict[int, tuple[str, float, float]] = {}  # text, when its first and its last token came

    def stream(i: int) -> None:
        if i == 1:
            first_token.wait(timeout=30)
        chunks = client.chat.completions.create(
            model=MODEL,
            messages=questions[i],
            max_tokens=lengths[i],
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        times, text = [], ""
        for chunk in chunks:
            if chunk.choices[0].delta.content:
                times.append(time.monotonic())
                first_token.set()
                text += chunk.choices[0].delta.content
        streams[i] = (text, times[0], times[-1])

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    (text_long, first_long, last_long), (text_short, first_short, _) = streams[0], streams[1]
    assert [text_long, text_short] == [c.text for c in expected]
    assert first_long < first_short < last_long  # the short one streamed while the long one still did
    after = engine.stats
    assert after.decoded_tokens - before.decoded_tokens > after.decode_batches - before.decode_batches  # batched


def test_a_client_leaving_mid_stream_cancels_its_request(engine, client, server_log):
    cancelled = engine.stats.cancelled_requests
    chunks = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=300, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    for _ in range(3):
        next(chunks)
    chunks.close()
    wait_until_idle(engine)
    assert engine.stats.cancelled_requests == cancelled + 1  # stopped, not run to its 300 tokens
    again = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, temperature=0)
    assert again.usage.completion_tokens == 2  # and the engine serves on
    assert not tracebacks(server_log)


def test_a_client_leaving_before_a_whole_answer_cancels_its_request(server, engine, server_log):
    cancelled = engine.stats.cancelled_requests
    body = json.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 300, "temperature": 0, "ignore_eos": True})
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(head.encode() + body.encode())
        deadline = time.monotonic() + 10
        while engine.executor.status().live_caches == 0:  # until the request is being generated
            assert time.monotonic() < deadline
            time.sleep(0.001)
    wait_until_idle(engine)
    assert engine.stats.cancelled_requests == cancelled + 1
    assert not tracebacks(server_log)


def test_a_client_leaving_before_its_body_arrives_is_no_error(server, engine, server_log):
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(head.encode())
    assert post(server, "/v1/completions", COMPLETION).status_code == 200  # the server carries on
    assert not tracebacks(server_log)


# --- refusals -------------------------------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": HELLO, "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
REFUSALS = {
    "malformed JSON": ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, None, "invalid_json"),
    "a body that is not an object": ("/v1/completions", b"[1, 2]", 400, None, None),
    "no model": ("/v1/completions", {"prompt": "hi"}, 400, "model", None),
    "an unknown model": ("/v1/chat/completions", CHAT | {"model": "gpt-4"}, 404, "model", "model_not_found"),
    "temperature out of range": ("/v1/chat/completions", CHAT | {"temperature": 3}, 400, "temperature", None),
    "temperature below its floor": ("/v1/completions", COMPLETION | {"temperature": 1e-39}, 400, "temperature", None),
    "repetition_penalty of 0": ("/v1/completions", COMPLETION | {"repetition_penalty": 0}, 400, "repetition_penalty",
                                None),  # fmt: skip
    "logit_bias past 100": ("/v1/completions", COMPLETION | {"logit_bias": {"5": 300}}, 400, "logit_bias.5", None),
    "logit_bias of NaN": ("/v1/completions", b'{"model": "tiny", "prompt": "hi", "logit_bias": {"5": NaN}}', 400,
                          "logit_bias.5", None),  # fmt: skip
    "logit_bias naming no token id": ("/v1/completions", COMPLETION | {"logit_bias": {"-1": 1}}, 400, "logit_bias.-1",
                                      None),  # fmt: skip
    "logit_bias past the vocabulary": ("/v1/completions", COMPLETION | {"logit_bias": {"100000": 1}}, 400,
                                       "logit_bias.100000", None),  # fmt: skip
    "logit_bias naming a token twice": ("/v1/completions", COMPLETION | {"logit_bias": {"5": 1, "05": 2}}, 400,
                                        "logit_bias.05", None),  # fmt: skip
    "logit_bias that is a list": ("/v1/completions", COMPLETION | {"logit_bias": [5, 1]}, 400, "logit_bias", None),
    "logit_bias of too many tokens": ("/v1/completions", COMPLETION | {"logit_bias": {str(i): 1 for i in range(1025)}},
                                      400, "logit_bias", None),  # fmt: skip
    "top_p of 0": ("/v1/completions", COMPLETION | {"top_p": 0}, 400, "top_p", None),
    "n of 0": ("/v1/completions", COMPLETION | {"n": 0}, 400, "n", None),
    "n past the batch": ("/v1/completions", COMPLETION | {"n": 9}, 400, "n", None),
    "max_tokens of 0": ("/v1/completions", COMPLETION | {"max_tokens": 0}, 400, "max_tokens", None),
    "max_tokens as a string": ("/v1/completions", COMPLETION | {"max_tokens": "4"}, 400, "max_tokens", None),
    "an empty stop string": ("/v1/completions", COMPLETION | {"stop": [""]}, 400, "stop", None),
    "too many logprobs": ("/v1/completions", COMPLETION | {"logprobs": 21}, 400, "logprobs", None),
    "top_logprobs without logprobs": ("/v1/chat/completions", CHAT | {"top_logprobs": 2}, 400, "top_logprobs", None),
    "no messages": ("/v1/chat/completions", CHAT | {"messages": []}, 400, "messages", None),
    "an image part": (
        "/v1/chat/completions",
        CHAT | {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages[0].content[0].image_url",  # a text-only model reads no images
        None,
    ),
    "tools": ("/v1/chat/completions", CHAT | {"tools": [{"type": "function"}]}, 400, "tools", "unsupported_parameter"),
    "a prompt of no tokens": ("/v1/completions", COMPLETION | {"prompt": ""}, 400, "prompt", None),
    "a token past the vocabulary": ("/v1/completions", COMPLETION | {"prompt": [1, 10**6]}, 400, "prompt", None),
    "a prompt past the context": (
        "/v1/completions",
        COMPLETION | {"prompt": [5] * CONTEXT},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    "one prompt of several past the context": (
        "/v1/completions",
        COMPLETION | {"prompt": [[5] * 8, [5] * CONTEXT]},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    "a request past the KV arena": (
        "/v1/completions",
        COMPLETION | {"prompt": [5] * 300, "max_tokens": 200},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    "an embedding input past the context": (
        "/v1/embeddings",
        {"model": MODEL, "input": [[5] * (CONTEXT + 1)]},
        400,
        "input",
        "context_length_exceeded",
    ),
    "wrong embedding dimensions": (
        "/v1/embeddings",
        {"model": MODEL, "input": "hi", "dimensions": 8},
        400,
        "dimensions",
        None,
    ),
    "an embedding input of the wrong type": ("/v1/embeddings", {"model": MODEL, "input": 3}, 400, "input", None),
    "a lone surrogate in a prompt": ("/v1/completions", COMPLETION | {"prompt": "hi \ud800"}, 400, "prompt", None),
    "a lone surrogate in a list of prompts": (
        "/v1/completions",
        COMPLETION | {"prompt": ["ok", "\udfff"]},
        400,
        "prompt[1]",
        None,
    ),
    "a lone surrogate in chat content": (
        "/v1/chat/completions",
        CHAT | {"messages": [{"role": "user", "content": "\ud83d"}]},
        400,
        "messages[0].content",
        None,
    ),
    "a lone surrogate in a role": (
        "/v1/chat/completions",
        CHAT | {"messages": [{"role": "\ud800", "content": "hi"}]},
        400,
        "messages[0].role",
        None,
    ),
    "a lone surrogate in an embedding input": (
        "/v1/embeddings",
        {"model": MODEL, "input": ["\ud800"]},
        400,
        "input[0]",
        None,
    ),
    "JSON nested 100k deep": ("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None,
                              "invalid_json"),  # fmt: skip
}


@pytest.mark.parametrize("name", REFUSALS)
def test_bad_requests_get_openai_errors_naming_the_field(server, engine, server_log, name):
    path, body, status, param, code = REFUSALS[name]
    response = post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert not tracebacks(server_log), "a client error logged a traceback"


def test_unknown_routes_and_methods_get_json_errors(server):
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["message"] == "Not Found"
    response = httpx.get(server.url + "/v1/chat/completions")
    assert response.status_code == 405 and response.json()["error"]["type"] == "invalid_request_error"


def test_the_openai_client_sees_refusals_as_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=MODEL, prompt=[5] * CONTEXT, max_tokens=4)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=HELLO, stream=True)


def test_an_engine_failure_is_a_server_error_and_frees_the_blocks():
    executor = ConfigurableModelExecutor(16, failing_script, block_size=4, num_blocks=32)
    engine = Engine(executor)
    with BackgroundServer(create_app(engine, model_name="scripted")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        body = {"model": "scripted", "prompt": [1, 2], "max_tokens": 10}
        response = post(server, "/v1/completions", body)
        assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
        with pytest.raises(openai.APIError, match="the executor broke"):
            list(client.completions.create(model="scripted", prompt=[1, 2], max_tokens=10, stream=True))
        assert post(server, "/v1/chat/completions", CHAT | {"model": "scripted"}).status_code == 400  # no template
        assert post(server, "/v1/embeddings", {"model": "scripted", "input": [[1]]}).status_code == 400
    engine.close()
    status = executor.status()
    assert status.live_caches == 0 and status.blocks_free == status.blocks_total


# --- the command line and a real model ----------------------------------------------------------------


def test_the_serve_command_line():
    parser = argparse.ArgumentParser(prog="refllm")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.model, args.host, args.port, args.max_batch) == ("smollm2-135m", "127.0.0.1", 8000, 16)
    args = parser.parse_args(["serve", "--model", "/models/Qwen2.5-0.5B", "--port", "0", "--max-batch", "4"])
    assert (model_id(args.model), args.port, args.max_batch) == ("Qwen2.5-0.5B", 0, 4)
    assert model_id("~/x/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_streams_a_chat_answer_to_the_openai_client():
    model = refllm.load_model(real_model_or_skip(SMOLLM2))
    app = create_app(model, model_name=SMOLLM2, max_batch_size=4)
    with BackgroundServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        chunks = client.chat.completions.create(
            model=SMOLLM2, messages=question, max_tokens=12, temperature=0, stream=True
        )
        answer = "".join(c.choices[0].delta.content or "" for c in chunks)
        info = httpx.get(server.url + "/v1/model/info").json()
    assert "Paris" in answer
    assert info["kv_cache"]["blocks_free"] == info["kv_cache"]["blocks_total"] and info["kv_cache"]["live_caches"] == 0
