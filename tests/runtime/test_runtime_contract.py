"""The runtime talks to models only through GenerativeModel: a model written apart runs under it all.

``tests/helpers/independent_model.py`` shares nothing with ``DecoderModel`` but the
contract. Under ``LLM`` (prefill, decode, decode_batch, fork, truncate,
release), ``Engine`` (continuous batching through a small arena, with
preemption) and the HTTP server, every logit and token must be what the model
itself computes for the same tokens from a fresh cache. DeepSeek-V3's model runs
the same checks: its arena holds one latent per token and no values.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

from refllm.config import ModelConfig
from refllm.kv import CacheConfig
from refllm.models.contract import GenerativeModel
from refllm.models.random import random_model
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from refllm.server import BackgroundServer, create_app
from refllm.testing.configs import tiny_config_json
from tests.helpers.independent_model import TinyAttentionLM

# The batch's rows go through BLAS together, which may sum their products in another order than a
# one-row call: float32 rounding, a few ulps of the logits' size.
CLOSE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=["independent", "deepseek_v3"])
def model(request):
    if request.param == "deepseek_v3":  # no end-of-sequence id, as the independent model: every run is max_tokens long
        return random_model(ModelConfig.from_hf(tiny_config_json("deepseek_v3") | {"eos_token_id": None}), seed=3)
    return TinyAttentionLM()


def fresh(model, tokens: list[int]) -> np.ndarray:
    """Logits after the last of ``tokens``, from a new contiguous cache: [V]."""
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    return model.prefill(np.array([tokens]), cache, range(len(tokens)))[0]


def greedy_alone(model, prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(fresh(model, tokens))))
    return tokens[len(prompt) :]


def test_the_model_implements_the_protocol(model):
    assert isinstance(model, GenerativeModel)


def test_llm_runs_any_generative_model(model):
    llm = LLM(model, CacheConfig(block_size=4))
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8]
    np.testing.assert_allclose(llm.prefill("a", a), fresh(model, a), **CLOSE)
    np.testing.assert_allclose(llm.prefill("b", b), fresh(model, b), **CLOSE)
    row_a, row_b = llm.decode_batch([("a", 11, 7), ("b", 12, 2)])
    np.testing.assert_allclose(row_a, fresh(model, a + [11]), **CLOSE)
    np.testing.assert_allclose(row_b, fresh(model, b + [12]), **CLOSE)
    llm.fork("a", "c")
    np.testing.assert_allclose(llm.decode("c", 13, 8), fresh(model, a + [11, 13]), **CLOSE)
    llm.truncate("a", 4)
    np.testing.assert_allclose(llm.decode("a", 14, 4), fresh(model, a[:4] + [14]), **CLOSE)
    np.testing.assert_allclose(llm.prefill("b", [15, 16]), fresh(model, b + [12, 15, 16]), **CLOSE)
    for cache_id in ("a", "b", "c"):
        llm.release(cache_id)
    assert llm.cache_ids() == [] and llm.stats().blocks_used == 0


def test_engine_batches_and_preempts_any_generative_model(model):
    prompts = [[int(t) for t in np.random.default_rng(i).integers(1, 48, size=3 + i % 5)] for i in range(10)]
    executor = LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=12, prefix_caching=False)))
    engine = Engine(executor, max_batch_size=6)
    results = engine.generate(prompts, SamplingParams(max_tokens=8))
    assert engine.stats.preemptions > 0 and engine.stats.largest_batch > 1
    for prompt, result in zip(prompts, results):
        assert list(result.completions[0].token_ids) == greedy_alone(model, prompt, 8)
    engine.close()


def test_the_server_serves_any_generative_model(model):
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4))))
    prompt = [5, 17, 30, 2]
    with BackgroundServer(create_app(engine, model_name="tiny")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
    engine.close()
    # without a tokenizer the server names each token "token_id:N"
    tokens = [int(name.removeprefix("token_id:")) for name in answer.choices[0].logprobs.tokens]
    assert tokens == greedy_alone(model, prompt, 6)
