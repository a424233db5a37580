"""ModelExecutor: LLMExecutor equals the LLM it wraps; the scripted executor follows its script; refusals."""

from __future__ import annotations

import asyncio
import inspect
import threading

import numpy as np
import pytest

from refllm import CacheConfig
from refllm.errors import InvalidInputError, PositionError, TokenOutOfRangeError, UnknownSequenceError
from refllm.kv import OutOfBlocksError
from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.executor import (
    DecodeInput,
    ExecutorShutdownError,
    KvCacheHandle,
    LLMExecutor,
    ModelExecutor,
    PrefillInput,
)
from refllm.runtime.llm import LLM
from tests.helpers.random_models import CLOSE, fresh_logits, model_for
from tests.helpers.state import assert_same_state, snapshot

PLAIN = ["info", "capabilities", "status", "release_cache"]
COROUTINES = [
    "prefill",
    "decode",
    "batch_decode",
    "forward",
    "forward_verify",
    "fork_cache",
    "truncate_kv",
    "warmup",
    "shutdown",
]


def real_executor(**options) -> LLMExecutor:
    return LLMExecutor(LLM(model_for("llama"), CacheConfig(block_size=4, num_blocks=64)), **options)


def cycle_executor(**options) -> ConfigurableModelExecutor:
    """Shaped like the real one (vocabulary 64, context 64, 64 blocks of 4); each sequence cycles on its own."""
    shape = dict(block_size=4, num_blocks=64, context_length=64, counting="sequence")
    return ConfigurableModelExecutor.with_token_sequence(64, [3, 5, 7], **(shape | options))


@pytest.mark.parametrize("make", [real_executor, cycle_executor])
def test_the_protocol_plain_methods_and_coroutines(make):
    executor = make()
    assert isinstance(executor, ModelExecutor)
    assert all(not inspect.iscoroutinefunction(getattr(executor, name)) for name in PLAIN)
    assert all(inspect.iscoroutinefunction(getattr(executor, name)) for name in COROUTINES)
    info, caps, status = executor.info(), executor.capabilities(), executor.status()
    assert info.vocab_size == 64 and caps.block_size == 4 and status.blocks_free == status.blocks_total
    assert status.state == "ready" and status.live_caches == 0


def test_llm_executor_equals_the_model():
    executor = real_executor()
    model = executor.llm.model

    async def scenario():
        await executor.warmup()
        a = await executor.prefill(PrefillInput([1, 2, 3]))
        b = await executor.prefill(PrefillInput([4, 5, 6, 7, 8]))
        np.testing.assert_allclose(a.logits, fresh_logits(model, [1, 2, 3]), **CLOSE)
        assert a.kv_cache.num_tokens == 3 and b.kv_cache.num_tokens == 5
        a2 = await executor.prefill(PrefillInput([9], a.kv_cache))  # a chunk appended to a live cache
        np.testing.assert_allclose(a2.logits, fresh_logits(model, [1, 2, 3, 9]), **CLOSE)
        outs = await executor.batch_decode([DecodeInput(10, b.kv_cache), DecodeInput(11, a2.kv_cache)])
        np.testing.assert_allclose(outs[0].logits, fresh_logits(model, [4, 5, 6, 7, 8, 10]), **CLOSE)
        np.testing.assert_allclose(outs[1].logits, fresh_logits(model, [1, 2, 3, 9, 11]), **CLOSE)
        child = await executor.fork_cache(outs[1].kv_cache)
        verified = await executor.forward_verify(child, [12, 13, 14])
        assert verified.logits.shape == (3, 64) and verified.kv_cache.num_tokens == 8
        np.testing.assert_allclose(verified.logits[1], fresh_logits(model, [1, 2, 3, 9, 11, 12, 13]), **CLOSE)
        rolled = await executor.truncate_kv(verified.kv_cache, 6)
        again = await executor.decode(DecodeInput(15, rolled))
        np.testing.assert_allclose(again.logits, fresh_logits(model, [1, 2, 3, 9, 11, 12, 15]), **CLOSE)
        rows = await executor.forward([1, 2, 3, 9])
        np.testing.assert_allclose(rows[-1], fresh_logits(model, [1, 2, 3, 9]), **CLOSE)
        assert executor.status().live_caches == 3
        for handle in (outs[0].kv_cache, outs[1].kv_cache, again.kv_cache):
            executor.release_cache(handle)
        assert executor.status().blocks_free == 64
        await executor.shutdown()

    asyncio.run(scenario())
    assert executor.status().state == "shutdown"
    with pytest.raises(ExecutorShutdownError):
        asyncio.run(executor.prefill(PrefillInput([1])))


def test_concurrent_callers_take_turns_and_get_their_own_answers():
    executor = real_executor()
    prompts = [[i, i + 1, i + 2] for i in range(8)]

    async def one(prompt):
        out = await executor.prefill(PrefillInput(prompt))
        out = await executor.decode(DecodeInput(prompt[0], out.kv_cache))
        return out.logits

    async def all_at_once():
        return await asyncio.gather(*(one(p) for p in prompts))

    for prompt, logits in zip(prompts, asyncio.run(all_at_once())):
        np.testing.assert_allclose(logits, fresh_logits(executor.llm.model, prompt + prompt[:1]), **CLOSE)
    results = {}
    threads = [threading.Thread(target=lambda p=p: results.setdefault(p[0], asyncio.run(one(p)))) for p in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for prompt in prompts:
        np.testing.assert_allclose(results[prompt[0]], fresh_logits(executor.llm.model, prompt + prompt[:1]), **CLOSE)


def greedy(executor, prompt, steps) -> list[int]:
    async def run():
        out = await executor.prefill(PrefillInput(prompt))
        tokens = []
        for _ in range(steps):
            tokens.append(int(np.argmax(out.logits)))
            out = await executor.decode(DecodeInput(tokens[-1], out.kv_cache))
        executor.release_cache(out.kv_cache)
        return tokens

    return asyncio.run(run())


def test_cycles_through_the_given_token_sequence_as_ferrum_does():
    """ferrum's testkit: the prefill answers tokens[0] uncounted; decode call k answers tokens[k % len]."""
    assert greedy(ConfigurableModelExecutor.with_token_sequence(16, [7, 8, 9]), [1, 2], 6) == [7, 7, 8, 9, 7, 8]


def test_emits_eos_after_n_decode_steps_as_ferrum_does():
    """ferrum's testkit: 42 from the prefill, 42 from decode calls 0 .. n-1, EOS from call n on."""
    executor = ConfigurableModelExecutor.with_eos_after(64, 3, eos_token=2)
    assert greedy(executor, [5, 6], 6) == [42, 42, 42, 42, 2, 2]
    assert executor.info().eos_token_ids == (2,)


def test_ferrum_counting_is_one_counter_for_the_whole_executor():
    executor = ConfigurableModelExecutor.with_token_sequence(16, [7, 8, 9])

    async def interleaved():
        first, second = await executor.prefill(PrefillInput([1])), await executor.prefill(PrefillInput([2]))
        answers = [int(np.argmax(first.logits)), int(np.argmax(second.logits))]
        handles = [first.kv_cache, second.kv_cache]
        for _ in range(2):
            for i in range(2):  # a decode call of the first sequence, then of the second
                out = await executor.decode(DecodeInput(answers[-1], handles[i]))
                handles[i] = out.kv_cache
                answers.append(int(np.argmax(out.logits)))
        return answers

    assert asyncio.run(interleaved()) == [7, 7, 7, 8, 9, 7]


def test_per_sequence_counting_is_kept_as_an_option():
    cycle = ConfigurableModelExecutor.with_token_sequence(16, [7, 8, 9], counting="sequence")
    assert greedy(cycle, [1, 2], 5) == [7, 8, 9, 7, 8]
    eos = ConfigurableModelExecutor.with_eos_after(64, 3, eos_token=2, counting="sequence")
    assert greedy(eos, [5, 6], 5) == [42, 42, 42, 2, 2]


def test_a_bad_counting_or_token_is_refused():
    with pytest.raises(InvalidInputError, match="counting"):
        ConfigurableModelExecutor.with_token_sequence(16, [7], counting="global")
    with pytest.raises(InvalidInputError, match="token=42"):
        ConfigurableModelExecutor.with_eos_after(16, 3, eos_token=2)


def test_scripted_executor_simulates_the_block_arena():
    executor = cycle_executor(num_blocks=16)

    async def scenario():
        a = await executor.prefill(PrefillInput([1] * 30))  # 8 blocks
        assert executor.status().blocks_free == 8
        b = await executor.prefill(PrefillInput([1] * 32))  # 8 blocks: full
        before = snapshot(executor.llm._caches)
        with pytest.raises(OutOfBlocksError):
            await executor.batch_decode([DecodeInput(1, a.kv_cache), DecodeInput(1, b.kv_cache)])
        assert_same_state(before, snapshot(executor.llm._caches))
        out = await executor.decode(DecodeInput(1, a.kv_cache))  # a's last block has room
        executor.release_cache(b.kv_cache)
        executor.release_cache(out.kv_cache)
        assert executor.status().blocks_free == 16

    asyncio.run(scenario())


BAD_CALLS = {
    "unknown handle": (lambda ex, h, g: ex.decode(DecodeInput(1, KvCacheHandle("nobody", 0))), UnknownSequenceError),
    "stale handle": (lambda ex, h, g: ex.decode(DecodeInput(1, KvCacheHandle(h.cache_id, 2))), PositionError),
    "stale handle in a batch": (
        lambda ex, h, g: ex.batch_decode([DecodeInput(1, h), DecodeInput(1, KvCacheHandle(g.cache_id, 9))]),
        PositionError,
    ),
    "duplicate cache in a batch": (
        lambda ex, h, g: ex.batch_decode([DecodeInput(1, h), DecodeInput(2, h)]),
        InvalidInputError,
    ),
    "token out of range in a batch": (
        lambda ex, h, g: ex.batch_decode([DecodeInput(1, h), DecodeInput(99, g)]),
        TokenOutOfRangeError,
    ),
    "empty prompt": (lambda ex, h, g: ex.prefill(PrefillInput([])), InvalidInputError),
    "prompt past the context length": (lambda ex, h, g: ex.prefill(PrefillInput([1] * 65)), ValueError),
    "append past the context length": (lambda ex, h, g: ex.prefill(PrefillInput([1] * 62, h)), ValueError),
    "not a handle": (lambda ex, h, g: ex.truncate_kv("nope", 0), InvalidInputError),
    "truncate past the length": (lambda ex, h, g: ex.truncate_kv(h, 4), ValueError),
    "verify with a stale handle": (
        lambda ex, h, g: ex.forward_verify(KvCacheHandle(h.cache_id, 0), [1]),
        PositionError,
    ),
    "a batch past max_batch_size": (
        lambda ex, h, g: ex.batch_decode([DecodeInput(1, h), DecodeInput(1, g), DecodeInput(1, h)]),
        InvalidInputError,
    ),
}


@pytest.mark.parametrize("make", [real_executor, cycle_executor], ids=["llm", "scripted"])
@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_input_is_refused_the_same_way_by_both_executors_and_changes_nothing(make, name):
    call, error = BAD_CALLS[name]
    executor = make(max_batch_size=2)
    first = asyncio.run(executor.prefill(PrefillInput([1, 2, 3]))).kv_cache
    second = asyncio.run(executor.prefill(PrefillInput([4, 5]))).kv_cache
    state = (lambda: executor.llm.arena) if isinstance(executor.llm, LLM) else (lambda: executor.llm._caches)
    before = snapshot(state())
    with pytest.raises(error):
        asyncio.run(call(executor, first, second))
    assert_same_state(before, snapshot(state()))
