"""Engine: continuous batching with preemption on the scripted executor and a real model; streaming; refusals."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from refllm import CacheConfig
from refllm.errors import CacheCapacityError, ContextLengthError, InvalidInputError, TokenOutOfRangeError
from refllm.io.tokenizer import Tokenizer
from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams, SamplingParamsError
from tests.helpers.byte_level import EOS, byte_level_backend
from tests.helpers.engine import CYCLE, ScriptFailure, assert_all_free, failing_script, greedy_reference
from tests.helpers.random_models import model_for
from tests.helpers.state import assert_same_state, snapshot


def mixed_requests(count: int, seed: int, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) pairs of mixed lengths."""
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, vocab_size, size=int(rng.integers(1, 24))).tolist(), int(rng.integers(1, 20)))
        for _ in range(count)
    ]


def test_64_requests_through_a_small_arena_on_the_scripted_executor():
    executor = ConfigurableModelExecutor.with_token_sequence(
        32, CYCLE, counting="sequence", block_size=4, num_blocks=40
    )
    engine = Engine(executor, max_batch_size=16)
    requests = mixed_requests(64, seed=0, vocab_size=32)
    handles = [engine.submit(prompt, SamplingParams(max_tokens=n)) for prompt, n in requests]
    engine.run_until_done()
    for handle, (_, n) in zip(handles, requests):
        (completion,) = handle.result().completions
        assert completion.token_ids == [CYCLE[i % len(CYCLE)] for i in range(n)]
        assert completion.finish_reason == "length"
    assert engine.stats.preemptions > 0 and engine.stats.largest_batch > 1
    assert engine.stats.finished_requests == 64
    assert_all_free(engine)


def test_requests_stop_at_eos_on_the_scripted_executor():
    executor = ConfigurableModelExecutor.with_eos_after(
        16, 5, eos_token=0, counting="sequence", token=3, block_size=4, num_blocks=16
    )
    engine = Engine(executor)
    results = engine.generate([[1, 2, 3], [4] * 20, [5]], SamplingParams(max_tokens=10))
    assert engine.stats.largest_batch == 3  # generate() runs its prompts together
    for result in results:
        (completion,) = result.completions
        assert len(completion.token_ids) == 5 and 0 not in completion.token_ids
        assert completion.finish_reason == "stop"
    assert_all_free(engine)


def test_64_requests_through_a_small_arena_on_a_real_model():
    model = model_for("llama")
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=48)), offload=False))
    requests = mixed_requests(64, seed=1, vocab_size=64)
    handles = [engine.submit(prompt, SamplingParams(max_tokens=n)) for prompt, n in requests]
    engine.run_until_done()
    reference = LLM(model, CacheConfig(block_size=4, num_blocks=64, prefix_caching=False))
    for handle, (prompt, n) in zip(handles, requests):
        assert handle.result().completions[0].token_ids == greedy_reference(reference, prompt, n)
    assert engine.stats.preemptions > 0 and engine.stats.largest_batch > 4
    assert_all_free(engine)


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_crowded_arena():
    """Batch composition and preemption change no seeded request's tokens: the sampling kit's
    ``check_seeds``, on the engine itself."""
    model = model_for("llama")
    requests = mixed_requests(16, seed=3, vocab_size=64)
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=n) for i, (_, n) in enumerate(requests)]
    crowded = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=16)), offload=False))
    handles = [crowded.submit(prompt, p) for (prompt, _), p in zip(requests, params)]
    crowded.run_until_done()
    assert crowded.stats.preemptions > 0 and crowded.stats.largest_batch > 1
    alone = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=64)), offload=False))
    for handle, (prompt, _), p in zip(handles, requests, params):
        assert handle.result().completions[0].token_ids == alone.generate([prompt], p)[0].completions[0].token_ids
    assert_all_free(crowded)
    crowded.close()
    alone.close()


def test_parallel_sampling_forks_one_prefill():
    model = model_for("llama")
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=64)), offload=False))
    prompt = list(range(1, 11))
    handle = engine.submit(prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8))
    engine.step()
    assert engine.stats.prefills == 1
    assert engine.executor.llm.stats().blocks_shared >= 2  # the prompt's full blocks, held by all three
    completions = handle.result().completions
    assert [c.index for c in completions] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in completions}) == 3  # independent draws
    again = engine.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8))[0].completions
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]  # the seed makes them reproducible
    greedy = engine.generate([prompt], SamplingParams(n=2, max_tokens=8))[0].completions
    assert greedy[0].token_ids == greedy[1].token_ids == greedy_reference(LLM(model), prompt, 8)
    assert_all_free(engine)


def streaming_tokenizer() -> Tokenizer:
    return Tokenizer(byte_level_backend(), eos_token=EOS)


def test_streamed_text_never_splits_a_character_and_hides_a_stop_string():
    tokenizer = streaming_tokenizer()
    script = tokenizer.encode("hello 🙂 world STOP after", add_special_tokens=False)
    assert len(tokenizer.encode("🙂", add_special_tokens=False)) > 1  # the emoji arrives in byte pieces
    assert len(tokenizer.encode(" STOP", add_special_tokens=False)) > 1  # so does the stop string
    executor = ConfigurableModelExecutor.with_token_sequence(tokenizer.vocab_size, script, counting="sequence")
    engine = Engine(executor, tokenizer)
    deltas = list(engine.submit("the", SamplingParams(stop=(" STOP",), max_tokens=50)))
    assert all("\ufffd" not in d.text for d in deltas)
    assert "".join(d.text for d in deltas) == "hello 🙂 world"
    assert deltas[-1].finish_reason == "stop"
    assert any(d.text == "" for d in deltas)  # held back while the emoji (or the stop string) was incomplete


def test_cancel_frees_the_blocks_at_once():
    executor = ConfigurableModelExecutor.with_token_sequence(
        16, CYCLE, counting="sequence", block_size=4, num_blocks=64
    )
    engine = Engine(executor)
    handles = [engine.submit([1] * 9, SamplingParams(max_tokens=40)) for _ in range(3)]
    for _ in range(3):
        engine.step()
    free_before = executor.status().blocks_free
    handles[1].cancel()  # its cache holds 9 + 3 tokens: 3 blocks
    assert executor.status().live_caches == 2 and executor.status().blocks_free == free_before + 3
    deltas = list(handles[1])
    assert deltas[-1].finish_reason == "cancelled" and handles[1].done
    assert [h.result().completions[0].finish_reason for h in (handles[0], handles[2])] == ["length", "length"]
    assert engine.stats.cancelled_requests == 1
    assert_all_free(engine)


def test_a_background_engine_serves_concurrent_clients():
    model = model_for("llama")
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=40))))
    engine.start()
    requests = mixed_requests(12, seed=2, vocab_size=64)
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        prompt, n = requests[i]
        results[i] = [d.token_id for d in engine.submit(prompt, SamplingParams(max_tokens=n))]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    engine.close()
    reference = LLM(model)
    for i, (prompt, n) in enumerate(requests):
        assert results[i] == greedy_reference(reference, prompt, n)
    assert_all_free(engine)


@pytest.mark.parametrize("background", [False, True])
def test_an_executor_failure_ends_every_request_and_frees_its_blocks(background):
    executor = ConfigurableModelExecutor(16, failing_script, block_size=4, num_blocks=32)
    engine = Engine(executor)
    if background:
        engine.start()
    handles = [engine.submit([1, 2], SamplingParams(max_tokens=10)) for _ in range(2)]
    with pytest.raises(ScriptFailure):
        list(handles[0])
    with pytest.raises(ScriptFailure):
        handles[1].result()
    engine.close()
    assert executor.status().live_caches == 0 and engine.stats.finished_requests == 0


def test_generate_works_inside_a_running_event_loop():
    """As in a notebook, whose cells run inside an event loop."""
    executor = ConfigurableModelExecutor.with_token_sequence(16, CYCLE, counting="sequence")
    engine = Engine(executor)

    async def cell():
        return engine.generate([[1, 2], [3]], SamplingParams(max_tokens=3))

    results = asyncio.run(cell())
    assert [r.completions[0].token_ids for r in results] == [CYCLE[:3], CYCLE[:3]]


BAD_SUBMISSIONS = {
    "empty prompt": (lambda e: e.submit([]), InvalidInputError),
    "token past the vocabulary": (lambda e: e.submit([1, 64]), TokenOutOfRangeError),
    "prompt that fills the context": (lambda e: e.submit([1] * 64), ContextLengthError),
    "prompt past the context": (lambda e: e.submit([1] * 80), ContextLengthError),
    "text without a tokenizer": (lambda e: e.submit("hello"), InvalidInputError),
    "stop strings without a tokenizer": (lambda e: e.submit([1], SamplingParams(stop=("x",))), InvalidInputError),
    "params that are not SamplingParams": (lambda e: e.submit([1], {"temperature": 0.5}), InvalidInputError),
    "invalid sampling parameters": (lambda e: e.submit([1], SamplingParams(temperature=-1)), SamplingParamsError),
    "invalid n": (lambda e: e.submit([1], SamplingParams(n=0)), SamplingParamsError),
    "a request the arena can never hold": (
        lambda e: e.submit([1] * 30, SamplingParams(max_tokens=30)),
        CacheCapacityError,
    ),
    "too many completions for the arena": (
        lambda e: e.submit([1], SamplingParams(n=14, max_tokens=4)),
        CacheCapacityError,
    ),
    "more completions than the batch holds": (lambda e: e.submit([1], SamplingParams(n=65)), InvalidInputError),
    "a single prompt to generate": (lambda e: e.generate("hello"), InvalidInputError),
    "a batch of which one is bad": (
        lambda e: e.generate([[1, 2], [99]], SamplingParams(max_tokens=4)),
        TokenOutOfRangeError,
    ),
}


@pytest.mark.parametrize("name", BAD_SUBMISSIONS)
def test_bad_submissions_are_refused_and_change_nothing(name):
    submit, error = BAD_SUBMISSIONS[name]
    model = model_for("llama")
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=12)), offload=False))
    engine.submit([1, 2, 3], SamplingParams(max_tokens=4))
    engine.step()
    before = snapshot((engine.executor.llm.arena, engine.stats, len(engine._scheduler.requests)))
    with pytest.raises(error):
        submit(engine)
    assert_same_state(before, snapshot((engine.executor.llm.arena, engine.stats, len(engine._scheduler.requests))))
    assert issubclass(error, (ValueError, KeyError))
