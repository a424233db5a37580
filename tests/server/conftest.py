"""The server the tests of this folder share: a tiny random Llama with a byte-level BPE tokenizer and a ChatML
template, behind one engine, served on 127.0.0.1 (port 0); after each test that uses it, the engine must be idle
and its KV arena all free."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from refllm.config import ModelConfig
from refllm.io.tokenizer import Tokenizer
from refllm.models.contract import InMemorySource
from refllm.models.decoder import DecoderModel
from refllm.models.random import random_tensors
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.server import BackgroundServer, create_app
from refllm.server.limits import ServerLimits
from tests.helpers.byte_level import CHATML, byte_level_backend
from tests.helpers.server import ARENA, CONTEXT, MODEL, small_request_answers, wait_until_idle


@pytest.fixture(scope="module")
def model() -> DecoderModel:
    tokenizer = Tokenizer(byte_level_backend(), eos_token="<|im_end|>", chat_template=CHATML)
    config = ModelConfig.from_hf(
        dict(
            model_type="llama",
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=CONTEXT,
        )
    )
    return DecoderModel.load(InMemorySource(config, random_tensors(config, seed=3), tokenizer))


@pytest.fixture(scope="module")
def engine(model) -> Iterator[Engine]:
    engine = Engine(LLMExecutor(LLM(model, ARENA)), model.tokenizer, max_batch_size=8)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def limits() -> ServerLimits | None:
    """The server's limits: its defaults; a module that times hostile clients overrides this fixture."""
    return None


@pytest.fixture(scope="module")
def server(engine, limits):
    with BackgroundServer(create_app(engine, model_name=MODEL, limits=limits)) as server:
        if limits is not None:  # timed tests: kernels compiled (or loaded from Numba's cache) before any timing
            small_request_answers(server.url)
        yield server


@pytest.fixture(autouse=True)
def idle_afterwards(request):
    """After each test on the shared server: nothing running, no cache alive, every block free."""
    yield
    if "engine" in request.fixturenames:
        wait_until_idle(request.getfixturevalue("engine"))


@pytest.fixture
def server_log(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """What the server logs during the test (uvicorn's loggers do not propagate to the root logger)."""
    logger = logging.getLogger("uvicorn")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
