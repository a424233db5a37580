"""Speculative decoding: greedy equals plain greedy; sampling keeps the target's distribution (chi-square)."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from refllm import CacheConfig
from refllm.errors import InvalidInputError
from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from refllm.runtime.speculative import DraftModelDrafter, PromptLookupDrafter, speculative_generate
from tests.helpers.engine import greedy_reference
from tests.helpers.random_models import model_for


def run(target, drafter, prompt, params, k=4):
    return asyncio.run(speculative_generate(target, drafter, prompt, params, k))


def llm_executor(arch: str) -> LLMExecutor:
    return LLMExecutor(LLM(model_for(arch), CacheConfig(block_size=4, num_blocks=64)), offload=False)


REPETITIVE = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculation_emits_exactly_the_greedy_tokens(k):
    target = llm_executor("llama")
    expected = greedy_reference(LLM(model_for("llama")), REPETITIVE, 40)
    params = SamplingParams(max_tokens=40)
    for drafter in (
        PromptLookupDrafter(),
        DraftModelDrafter(llm_executor("qwen3")),
        DraftModelDrafter(llm_executor("llama")),
    ):
        result = run(target, drafter, REPETITIVE, params, k)
        assert result.token_ids == expected and result.finish_reason == "length"
        assert target.status().live_caches == 0 and target.status().blocks_free == 64
    assert result.acceptance_rate == 1.0  # the target drafting for itself: every draft passes
    assert result.rounds <= -(-40 // (k + 1)) + 1


def test_prompt_lookup_drafts_a_repeating_script_in_few_rounds():
    target = ConfigurableModelExecutor.with_token_sequence(16, [1, 2, 3, 4], counting="sequence")
    result = run(target, PromptLookupDrafter(), [1, 2, 3, 4], SamplingParams(max_tokens=33), k=4)
    assert result.token_ids == [1, 2, 3, 4] * 8 + [1]
    assert result.rounds <= 8 and result.acceptance_rate > 0.9


@pytest.mark.parametrize(
    "context, k, draft",
    [
        ([1, 2, 3, 9, 1, 2, 3], 4, [9, 1, 2, 3]),  # the longest tail n-gram [1, 2, 3] seen before
        ([4, 8, 8, 8, 8, 8, 8, 8], 3, [8, 8, 8]),  # the latest match has one token after it: an earlier one has k
        ([5, 1, 2, 5], 2, [1, 2]),  # only a 1-gram matches
        ([1, 2, 3, 4, 5], 3, []),  # nothing repeats: no draft
    ],
)
def test_prompt_lookup_drafts(context, k, draft):
    assert (
        asyncio.run(PromptLookupDrafter().propose(context, k, SamplingParams(), np.random.default_rng())).tokens
        == draft
    )


def markov_executor(transitions: np.ndarray) -> ConfigurableModelExecutor:
    """Next-token distribution transitions[last token]: a target whose exact distribution is known."""
    logp = np.log(transitions)
    return ConfigurableModelExecutor(len(transitions), lambda prompt, fed: logp[[*prompt, *fed][-1]])


TARGET = np.array([[0.2, 0.5, 0.3], [0.6, 0.15, 0.25], [0.3, 0.3, 0.4]])
DRAFT = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.34, 0.33, 0.33]])
CHI2_26_AT_1E4 = 63.0  # chi-square with 26 degrees of freedom exceeds this with probability ~1e-4


@pytest.mark.parametrize("drafter", ["prompt lookup", "draft model"])
def test_sampled_speculation_keeps_the_targets_distribution(drafter):
    """Three sampled tokens after [0, 1, 0]: the 27 sequences' frequencies against the exact Markov chain."""
    target = markov_executor(TARGET)
    draft_executor = markov_executor(DRAFT)
    prompt, trials = [0, 1, 0], 3000
    counts = dict.fromkeys(itertools.product(range(3), repeat=3), 0)

    async def sample_all():
        for seed in range(trials):
            chosen = PromptLookupDrafter() if drafter == "prompt lookup" else DraftModelDrafter(draft_executor)
            params = SamplingParams(temperature=1.0, max_tokens=3, seed=seed)
            result = await speculative_generate(target, chosen, prompt, params, k=2)
            counts[tuple(result.token_ids)] += 1

    asyncio.run(sample_all())
    chi2 = 0.0
    for (a, b, c), observed in counts.items():
        expected = trials * TARGET[prompt[-1], a] * TARGET[a, b] * TARGET[b, c]
        chi2 += (observed - expected) ** 2 / expected
    assert chi2 < CHI2_26_AT_1E4, counts


def test_refusals():
    target = llm_executor("llama")
    with pytest.raises(InvalidInputError):
        run(target, PromptLookupDrafter(), [1, 2], SamplingParams(), k=0)
    with pytest.raises(InvalidInputError):
        run(target, PromptLookupDrafter(), [], SamplingParams())
    with pytest.raises(InvalidInputError):
        run(target, PromptLookupDrafter(), [1], SamplingParams(n=2))
    with pytest.raises(InvalidInputError):
        PromptLookupDrafter(max_ngram=0)
    assert target.status().live_caches == 0
