"""The sampling chain on exact probability vectors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.errors import TokenOutOfRangeError
from refllm.runtime.sampling import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS_TOKENS,
    REPETITION_PENALTY_RANGE,
    TEMPERATURE_FLOOR,
    LogitsError,
    Sampler,
    SamplingParams,
    SamplingParamsError,
    apply_logit_bias,
    apply_penalties,
    min_p_filter,
    probabilities,
    processed_logits,
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


# --- every accepted combination is defined -----------------------------------------------------------------

FLOAT32_MAX = float(np.finfo(np.float32).max)
EXTREME_LOGITS = st.one_of(
    st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32),
    st.sampled_from([-np.inf, 0.0, FLOAT32_MAX, -FLOAT32_MAX, 1e-45, 88.7, -103.0]),
)


def any_params(vocab: int) -> st.SearchStrategy[SamplingParams]:
    """Every parameter over its whole accepted range, its edges and extremes included."""
    unit = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 5e-324, 1e-300, 1.0]))
    return st.builds(
        SamplingParams,
        temperature=st.one_of(
            st.just(0.0), st.floats(TEMPERATURE_FLOOR, 1e308), st.sampled_from([TEMPERATURE_FLOOR, 1.0, 1.7e308])
        ),
        top_k=st.one_of(st.integers(0, vocab + 2), st.just(10**30)),
        top_p=unit.filter(lambda p: p > 0),
        min_p=unit,
        repetition_penalty=st.floats(*REPETITION_PENALTY_RANGE),
        presence_penalty=st.floats(-2, 2),
        frequency_penalty=st.floats(-2, 2),
        seed=st.integers(0, 2**64),
        logit_bias=st.dictionaries(st.integers(0, vocab - 1), st.floats(-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)),
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), vocab=st.integers(1, 24))
def test_no_accepted_parameters_give_nan_or_inf(data, vocab):
    logits = np.array(data.draw(st.lists(EXTREME_LOGITS, min_size=vocab, max_size=vocab)), np.float32)
    if not np.isfinite(logits).any():
        logits[data.draw(st.integers(0, vocab - 1))] = data.draw(st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32))
    params = data.draw(any_params(vocab))
    history = st.lists(st.integers(0, vocab - 1), max_size=12)
    prompt, output = data.draw(history), data.draw(history)
    processed = processed_logits(logits, params, prompt, output)
    assert not np.isnan(processed).any() and (processed < np.inf).all() and np.isfinite(processed).any()
    probs = probabilities(logits, params, prompt, output)
    assert np.isfinite(probs).all() and (probs >= 0).all() and probs.sum() == pytest.approx(1.0, abs=1e-9)
    choice = Sampler(params)(logits, prompt, output)
    assert probs[choice.token] > 0
    assert not np.isnan(choice.logprob)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), vocab=st.integers(2, 24))
def test_the_sampler_draws_from_probabilities_exactly(data, vocab):
    """probabilities() is the distribution drawn from: the same generator, drawing from it, picks the same tokens
    (and greedy decoding's is the point mass on its token)."""
    logits = np.array(data.draw(st.lists(st.floats(-30, 30), min_size=vocab, max_size=vocab)), np.float32)
    params = data.draw(any_params(vocab))
    output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=6))
    probs = probabilities(logits, params, [0], output)
    sampler, twin = Sampler(params, np.random.default_rng(11)), np.random.default_rng(11)
    for _ in range(5):
        token = sampler(logits, [0], output).token
        if params.greedy:
            assert probs[token] == 1.0 and probs.sum() == 1.0
        else:
            assert token == twin.choice(vocab, p=probs)


def test_greedy_probabilities_are_a_point_mass_on_the_chosen_token():
    logits = np.array([1.0, 3.0, 3.0, -2.0], np.float32)  # a tie: the first of the largest is chosen
    params = SamplingParams(logit_bias={3: 4.5}, repetition_penalty=2.0)
    probs = probabilities(logits, params, prompt_tokens=[3])  # 3: -2 + 4.5 = 2.5 > 0, halved by the penalty
    np.testing.assert_array_equal(probs, [0, 1, 0, 0])
    assert Sampler(params)(logits, [3]).token == 1


def test_logit_bias_adds_to_the_logits_before_everything_else():
    logits = np.log(PROBS).astype(np.float64)
    bias = {1: 1.5, 3: -100.0}
    expected = np.exp(logits + [0, 1.5, 0, -100.0])
    expected /= expected.sum()
    np.testing.assert_allclose(probabilities(logits, SamplingParams(temperature=1.0, logit_bias=bias)), expected)
    # it comes before the repetition penalty: a logit lifted above zero is divided, not multiplied
    biased = apply_logit_bias(np.array([-1.0, 0.0]), ((0, 3.0),))
    lifted = apply_penalties(biased, [0], [], SamplingParams(repetition_penalty=2.0))
    np.testing.assert_allclose(lifted, [1.0, 0.0])


def test_the_order_differs_from_vllms_where_min_p_meets_top_p():
    """Top-p then min-p (this chain, transformers') keeps three tokens here; min-p then top-p (vLLM) keeps two."""
    logits = np.log([0.4, 0.35, 0.2, 0.05])
    params = SamplingParams(temperature=1.0, top_p=0.76, min_p=0.3)
    assert np.flatnonzero(probabilities(logits, params)).tolist() == [0, 1, 2]
    vllm_order = top_p_filter(min_p_filter(logits, 0.3), 0.76)
    assert kept(vllm_order) == [0, 1]


def test_nan_or_infinite_logits_are_refused_naming_the_token():
    for bad, shown in [(np.nan, "NaN"), (np.inf, "inf"), (1e39, "1e+39")]:
        logits = np.zeros(5)
        logits[2] = bad
        with pytest.raises(LogitsError, match=re.escape(f"{shown} at token 2")):
            Sampler(SamplingParams())(logits)
    with pytest.raises(LogitsError, match="every logit is -inf"):
        probabilities(np.full(3, -np.inf), SamplingParams(temperature=1.0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=1e-39), "temperature"),
        (dict(temperature=TEMPERATURE_FLOOR / 2), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="0.5"), "temperature"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(min_p=float("nan")), "min_p"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(repetition_penalty=1e-300), "repetition_penalty"),
        (dict(repetition_penalty=101.0), "repetition_penalty"),
        (dict(presence_penalty=float("inf")), "presence_penalty"),
        (dict(seed=-1), "seed"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logit_bias={5: 101.0}), "logit_bias"),
        (dict(logit_bias={5: float("nan")}), "logit_bias"),
        (dict(logit_bias={-1: 1.0}), "logit_bias"),
        (dict(logit_bias={"5": 1.0}), "logit_bias"),
        (dict(logit_bias=[(5, 1.0), (5, 2.0)]), "logit_bias"),
        (dict(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS_TOKENS + 1)}), "logit_bias"),
        (dict(logit_bias=7), "logit_bias"),
    ],
)
def test_out_of_range_parameters_are_named(kwargs, name):
    with pytest.raises(SamplingParamsError, match=name) as refusal:
        SamplingParams(**kwargs)
    assert refusal.value.name == name


def test_logit_bias_is_kept_sorted_and_checked_against_the_vocabulary():
    params = SamplingParams(logit_bias={7: -1, 2: 100})
    assert params.logit_bias == ((2, 100.0), (7, -1.0)) and hash(params)
    params.check_vocabulary(8)
    with pytest.raises(TokenOutOfRangeError, match="token 7"):
        params.check_vocabulary(7)
