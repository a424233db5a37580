"""One request's failure is its own: injected into one sequence of a running batch, it ends that request alone.

Failures are injected into the forward pass (a batch_decode or prefill that raises when
it holds the culprit) and into sampling (NaN logits for the culprit's row). Every other
request must finish with the tokens it produces alone, and the KV arena must hold
exactly the blocks of the live sequences, with their reference counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from refllm import CacheConfig
from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import LogitsError, SamplingParams
from tests.helpers.engine import CULPRIT, CYCLE, FaultyExecutor, InjectedFailure, assert_all_free
from tests.helpers.random_models import model_for

HEALTHY = [[1, 2, 3], [4, 5], [6, 7, 8, 10, 11]]


def culprit_script(failing_at: int, nan: bool = False):
    """Scripted logits cycling through CYCLE; the culprit's sequence raises (or gets NaN) ``failing_at`` tokens in."""

    def next_logits(prompt, fed):
        if list(prompt) == CULPRIT and len(fed) == failing_at:
            if nan:
                return np.full(16, np.nan, np.float32)
            raise InjectedFailure(f"the forward pass broke {failing_at} tokens into the culprit")
        logits = np.zeros(16, np.float32)
        logits[CYCLE[len(fed) % len(CYCLE)]] = 30.0
        return logits

    return next_logits


def assert_arena_consistent(llm: LLM) -> None:
    """Every block some live sequence holds has that many references; every other block is free."""
    arena = llm.arena
    held = np.zeros(arena.num_blocks, np.int64)
    for seq_id in arena.sequence_ids():
        np.add.at(held, arena.block_table(seq_id), 1)
    np.testing.assert_array_equal(arena.refcounts, held)
    assert len(arena.sequence_ids()) == len(llm.cache_ids())


@pytest.mark.parametrize(
    "failing_at, nan, error",
    [(0, False, InjectedFailure), (3, False, InjectedFailure), (3, True, LogitsError)],
    ids=["its prefill raises", "its decode raises", "its logits are NaN"],
)
def test_a_failing_sequence_fails_its_request_alone_on_the_scripted_executor(failing_at, nan, error):
    executor = ConfigurableModelExecutor(16, culprit_script(failing_at, nan), block_size=4, num_blocks=64)
    engine = Engine(executor)
    healthy = [engine.submit(prompt, SamplingParams(max_tokens=8)) for prompt in HEALTHY[:2]]
    culprit = engine.submit(CULPRIT, SamplingParams(max_tokens=8))
    healthy.append(engine.submit(HEALTHY[2], SamplingParams(max_tokens=8)))
    with pytest.raises(error, match="NaN" if nan else "broke"):
        culprit.result()
    assert culprit.done
    for handle in healthy:
        (completion,) = handle.result().completions
        assert completion.token_ids == [CYCLE[i % len(CYCLE)] for i in range(8)]
        assert completion.finish_reason == "length"
    assert engine.stats.finished_requests == 3 and engine.stats.largest_batch >= 3
    assert_all_free(engine)


def alone(model, prompt: list[int], params: SamplingParams) -> list[int]:
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=64)), offload=False))
    return engine.generate([prompt], params)[0].completions[0].token_ids


HEALTHY_PARAMS = [
    SamplingParams(max_tokens=10),
    SamplingParams(max_tokens=10, temperature=0.9, seed=3),
    SamplingParams(max_tokens=10, temperature=1.2, top_k=8, top_p=0.9, seed=4, logit_bias={5: 2.0}),
]


@pytest.mark.parametrize("fault", ["raise", "nan"])
def test_a_failure_in_one_sequence_of_a_running_batch_leaves_the_others_their_tokens(fault):
    model = model_for("llama")
    llm = LLM(model, CacheConfig(block_size=4, num_blocks=64))
    engine = Engine(FaultyExecutor(llm, CULPRIT, fault, after=len(CULPRIT) + 4))
    handles = [engine.submit(p, params) for p, params in zip(HEALTHY, HEALTHY_PARAMS)]
    culprit = engine.submit(CULPRIT, SamplingParams(max_tokens=10, n=2, temperature=1.0, seed=1))  # forked blocks
    for _ in range(4):
        engine.step()  # each a decode, the first after the prefills: the culprit's caches hold 7 tokens
    assert engine.stats.largest_batch == 5 and not culprit.done
    engine.step()  # the culprit's failure
    assert culprit.done and llm.cache_ids() and all(c not in llm.cache_ids() for c in engine.executor.culprit_caches)
    assert_arena_consistent(llm)
    with pytest.raises(InjectedFailure if fault == "raise" else LogitsError):
        culprit.result()
    results = [handle.result().completions[0].token_ids for handle in handles]
    assert results == [alone(model, p, params) for p, params in zip(HEALTHY, HEALTHY_PARAMS)]
    assert engine.stats.finished_requests == 3
    assert_arena_consistent(llm)
    assert_all_free(engine)


def test_an_executor_broken_for_everyone_fails_every_request():
    def broken(prompt, fed):
        if fed:
            raise InjectedFailure("the executor is broken")
        return np.zeros(16, np.float32)

    executor = ConfigurableModelExecutor(16, broken, block_size=4, num_blocks=64)
    engine = Engine(executor)
    handles = [engine.submit(p, SamplingParams(max_tokens=5)) for p in HEALTHY]
    engine.run_until_done()
    for handle in handles:
        with pytest.raises(InjectedFailure):
            handle.result()
    assert engine.stats.finished_requests == 0
    assert_all_free(engine)
