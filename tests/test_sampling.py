"""The sampling chain on exact probability vectors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.runtime.sampling import (
    Sampler,
    SamplingParams,
    SamplingParamsError,
    apply_penalties,
    min_p_filter,
    probabilities,
    top_k_filter,
    top_p_filter,
)

PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS).astype(np.float32)


def kept(logits: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(logits)).tolist()


def test_top_k_keeps_the_k_most_likely():
    assert kept(top_k_filter(LOGITS, 2)) == [0, 1]
    assert kept(top_k_filter(LOGITS, 0)) == [0, 1, 2, 3]


@pytest.mark.parametrize("p, expected", [(0.5, [0]), (0.8, [0, 1]), (0.81, [0, 1, 2]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    assert kept(top_p_filter(LOGITS, p)) == expected


def test_min_p_is_relative_to_the_top_token():
    assert kept(min_p_filter(LOGITS, 0.2)) == [0, 1, 2]  # threshold 0.2 * 0.5 = 0.1
    assert kept(min_p_filter(LOGITS, 0.7)) == [0]


def test_temperature_raises_probabilities_to_one_over_t():
    t = 0.5
    expected = PROBS ** (1 / t) / np.sum(PROBS ** (1 / t))
    np.testing.assert_allclose(probabilities(LOGITS, SamplingParams(temperature=t)), expected, rtol=1e-6)


def test_top_p_then_renormalise():
    probs = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-6)


def test_penalties_follow_their_definitions():
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    out = apply_penalties(logits, [0], [1, 1], SamplingParams(repetition_penalty=2.0))
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 0.5])
    out = apply_penalties(logits, [0], [1, 1, 2], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    np.testing.assert_allclose(out, [2.0, -2.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 0.5])


def test_repetition_penalty_matches_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=32).astype(np.float32)
    history = rng.integers(0, 32, size=10)
    processor = transformers.RepetitionPenaltyLogitsProcessor(1.3)
    expected = processor(torch.tensor(history[None]), torch.tensor(logits[None]))[0].numpy()
    ours = apply_penalties(logits, history.tolist(), [], SamplingParams(repetition_penalty=1.3))
    np.testing.assert_allclose(ours, expected, rtol=1e-6)


def test_greedy_takes_the_argmax_and_reports_logprobs():
    choice = Sampler(SamplingParams(logprobs=2))(LOGITS)
    assert choice.token == 0
    assert choice.logprob == pytest.approx(np.log(0.5))
    assert [t for t, _ in choice.top_logprobs] == [0, 1]


def test_a_seed_makes_sampling_reproducible():
    params = SamplingParams(temperature=1.0, seed=42)
    sampler_a, sampler_b = Sampler(params), Sampler(params)
    first = [sampler_a(LOGITS).token for _ in range(50)]
    assert first == [sampler_b(LOGITS).token for _ in range(50)]
    assert len(set(first)) > 1  # it really sampled


def test_sampled_frequencies_follow_the_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    counts = np.bincount([sampler(LOGITS).token for _ in range(20000)], minlength=4)
    expected = PROBS * 20000
    chi_square = np.sum((counts - expected) ** 2 / expected)
    assert chi_square < 16.3  # p = 0.001 for 3 degrees of freedom


@settings(max_examples=50, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20), min_size=2, max_size=40).map(lambda x: np.array(x, np.float32)),
    top_k=st.integers(0, 40),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    temperature=st.floats(0.05, 3.0),
)
def test_processed_distribution_is_valid_and_keeps_the_top_token(logits, top_k, top_p, min_p, temperature):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    probs = probabilities(logits, params)
    assert probs.sum() == pytest.approx(1.0)
    assert probs[np.argmax(logits)] > 0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=0), "n"),
        (dict(stop=("",)), "stop"),
    ],
)
def test_invalid_parameters_are_named(kwargs, name):
    with pytest.raises(SamplingParamsError, match=name):
        SamplingParams(**kwargs)
