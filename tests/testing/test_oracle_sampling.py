"""Sampling conformance: the peers' semantics pinned by hand-worked cases, refllm's sampler passing the
properties for the semantics it claims, and the sampler mutation gallery caught by them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refllm.testing import (
    SEMANTICS,
    SamplerParams,
    SamplingMismatch,
    check_draws,
    check_probabilities,
    check_seeds,
    probabilities_from_logits,
    reference_distribution,
    refllm_probabilities,
    refllm_sampler,
    sampler_from_probabilities,
)
from refllm.runtime.sampling import processed_logits
from refllm.testing.sampling_draws import chi_square_survival, goodness_of_fit, refllm_params
from refllm.testing.sampling_semantics import get_semantics, penalized_logits
from tests.helpers.sampler_mutants import (
    PROBABILITY_MUTANTS,
    SEED_MUTANTS,
    min_p_before_temperature,
    top_p_drops_crossing_token,
)

REFLLM_FLOOR = 1e-5  # refllm refuses a temperature in (0, 1e-5) rather than guess what it means


def distribution(semantics: str, probs, **params) -> np.ndarray:
    return reference_distribution(semantics, np.log(np.asarray(probs, float)), SamplerParams(**params)).probabilities


# --- the semantics, worked by hand -------------------------------------------------------------------


def test_vllm_applies_min_p_before_top_p_where_transformers_applies_it_after():
    # top-p 0.76 over (0.4, 0.35, 0.2, 0.05) keeps three (0.75 is still below 0.76); min-p 0.3 of 0.4 keeps 0.2.
    # vLLM: min-p first drops 0.05; renormalized by 0.95, the first two hold 0.789 > 0.76, so top-p keeps two.
    probs = [0.4, 0.35, 0.2, 0.05]
    transformers, vllm = (distribution(name, probs, top_p=0.76, min_p=0.3) for name in ("transformers", "vllm"))
    np.testing.assert_allclose(transformers, np.array([0.4, 0.35, 0.2, 0]) / 0.95)
    np.testing.assert_allclose(vllm, np.array([0.4, 0.35, 0, 0]) / 0.75)


def test_llama_cpp_filters_before_temperature():
    # llama.cpp: top-p 0.6 at temperature 1 keeps (0.5, 0.3); temperature 0.5 then squares them.
    # transformers: temperature 0.5 first gives (0.25, 0.09, 0.04) / 0.38, whose top token alone holds 0.66 > 0.6.
    probs = [0.5, 0.3, 0.2]
    llama_cpp = distribution("llama.cpp", probs, temperature=0.5, top_p=0.6)
    transformers = distribution("transformers", probs, temperature=0.5, top_p=0.6)
    np.testing.assert_allclose(llama_cpp, np.array([0.25, 0.09, 0]) / 0.34)
    np.testing.assert_allclose(transformers, [1, 0, 0])


def test_top_k_keeps_ties_at_the_kth_value_except_in_llama_cpp():
    logits, params = np.array([1.0, 1.0, 1.0, 0.0]), SamplerParams(top_k=2)
    np.testing.assert_allclose(reference_distribution("transformers", logits, params).probabilities, [1 / 3] * 3 + [0])
    cut = reference_distribution("llama.cpp", logits, params).probabilities
    assert np.count_nonzero(cut) == 2 and cut[:3].sum() == pytest.approx(1.0) and set(cut[cut > 0]) == {0.5}


def test_the_top_p_crossing_token_is_kept():
    # 0.5 alone falls short of 0.6, so the token that crosses it (0.3) is kept, and nothing after it.
    np.testing.assert_allclose(distribution("transformers", [0.5, 0.3, 0.2], top_p=0.6), [0.625, 0.375, 0])


def test_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones():
    logits, params = np.array([2.0, -2.0, 1.0]), SamplerParams(repetition_penalty=2.0)
    for name in ("transformers", "vllm", "llama.cpp"):
        penalized = penalized_logits(SEMANTICS[name], logits, params, prompt=[0], output=[1])
        np.testing.assert_array_equal(penalized, [1.0, -4.0, 1.0])


def test_presence_and_frequency_count_the_output_except_in_llama_cpp():
    params = SamplerParams(presence_penalty=0.5, frequency_penalty=0.25)
    for name, expected in [("openai", [0, -1, 0]), ("vllm", [0, -1, 0]), ("llama.cpp", [-0.75, -1, 0])]:
        penalized = penalized_logits(SEMANTICS[name], np.zeros(3), params, prompt=[0], output=[1, 1])
        np.testing.assert_allclose(penalized, expected)
    assert "presence_penalty" not in SEMANTICS["transformers"].parameters  # transformers has none


def test_llama_cpp_penalizes_only_the_last_64_tokens():
    prompt, params = [0] + [1] * 64, SamplerParams(repetition_penalty=2.0)  # token 0 is 65 tokens back
    assert penalized_logits(SEMANTICS["llama.cpp"], np.ones(2), params, prompt, [])[0] == 1.0
    assert penalized_logits(SEMANTICS["transformers"], np.ones(2), params, prompt, [])[0] == 0.5


def test_tiny_temperatures():
    logits = np.array([0.0, 0.001, -1.0])
    tiny, floor = (reference_distribution("vllm", logits, SamplerParams(temperature=t)) for t in (0.001, 0.01))
    np.testing.assert_array_equal(tiny.probabilities, floor.probabilities)  # vLLM raises (0, 0.01) to 0.01
    np.testing.assert_allclose(tiny.probabilities[:2], np.array([1, math.e**0.1]) / (1 + math.e**0.1), rtol=1e-12)
    exact = reference_distribution("transformers", logits, SamplerParams(temperature=0.001)).probabilities
    np.testing.assert_allclose(exact[:2], np.array([1, math.e]) / (1 + math.e), rtol=1e-12)  # divided as given
    for name in SEMANTICS:  # temperature 0 is greedy everywhere
        greedy = reference_distribution(name, logits, SamplerParams(temperature=0)).probabilities
        np.testing.assert_array_equal(greedy, [0, 1, 0])


def test_an_unknown_semantics_is_refused_by_name():
    with pytest.raises(ValueError, match="'vLLM'.*transformers, vllm, llama.cpp, openai"):
        get_semantics("vLLM")


# --- the statistics ----------------------------------------------------------------------------------


def test_chi_square_survival_matches_closed_forms():
    for dof in (2, 4, 10, 40):  # even: Q(k, x) = exp(-x) * sum_{i<k} x^i / i!
        for x in (0.05, 1.0, 7.5, 30.0, 90.0):
            k = dof // 2
            closed = math.exp(-x) * sum(x**i / math.factorial(i) for i in range(k))
            assert chi_square_survival(2 * x, dof) == pytest.approx(closed, rel=1e-10, abs=1e-300)
    for statistic in (0.01, 1.0, 3.84, 10.83, 50.0):  # one degree of freedom: erfc(sqrt(x / 2))
        assert chi_square_survival(statistic, 1) == pytest.approx(math.erfc(math.sqrt(statistic / 2)), rel=1e-10)


def test_the_goodness_of_fit_test_has_its_stated_false_alarm_rate():
    rng = np.random.default_rng(0)
    probs = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.006, 0.003, 0.001])  # the tail pooled
    trials, alpha = 4000, 0.05
    false_alarms = sum(
        chi_square_survival(*goodness_of_fit(probs * 2000, rng.multinomial(2000, probs))) < alpha
        for _ in range(trials)
    )
    spread = 4 * math.sqrt(alpha * (1 - alpha) / trials)
    assert abs(false_alarms / trials - alpha) < spread


# --- refllm's own sampler ----------------------------------------------------------------------------


@pytest.mark.parametrize("semantics", ["transformers", "openai"])
def test_refllm_samples_as_it_claims(semantics):
    """refllm's chain is transformers' order and repetition penalty, and OpenAI's presence and frequency."""
    assert check_probabilities(refllm_probabilities, semantics, min_temperature=REFLLM_FLOOR) >= 150
    assert len(check_draws(refllm_sampler, semantics, min_temperature=REFLLM_FLOOR)) == 8


def test_a_processed_logits_entry_point_is_checked_through_its_softmax():
    def refllm_processed_logits(logits, params, prompt, output):
        return processed_logits(logits, refllm_params(params), prompt, output)

    probabilities = probabilities_from_logits(refllm_processed_logits)
    assert check_probabilities(probabilities, "transformers", min_temperature=REFLLM_FLOOR) >= 150


def test_refllm_seeds_ignore_the_batch_and_preemption():
    check_seeds(refllm_sampler)


@pytest.mark.parametrize("semantics", ["vllm", "llama.cpp"])
def test_the_properties_tell_refllm_from_the_semantics_it_does_not_claim(semantics):
    """vLLM differs from refllm only on narrow cases (a temperature below 0.01 beside a near-tie, min-p cutting
    what top-p would keep), so this looks further than the default budget; the search stops at the first."""
    with pytest.raises(SamplingMismatch, match=f"not the {semantics} semantics"):
        check_probabilities(refllm_probabilities, semantics, 1000, min_temperature=REFLLM_FLOOR, shrink=False)


# --- the mutation gallery ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "mutant", "semantics"), PROBABILITY_MUTANTS, ids=[m[0] for m in PROBABILITY_MUTANTS])
def test_each_sampler_mutant_is_caught(name, mutant, semantics):
    with pytest.raises(SamplingMismatch, match=f"not the {semantics} semantics"):
        check_probabilities(mutant, semantics, min_temperature=REFLLM_FLOOR, shrink=False)


def test_a_shrunk_failure_is_a_case_to_read():
    with pytest.raises(SamplingMismatch) as failure:
        check_probabilities(top_p_drops_crossing_token, min_temperature=REFLLM_FLOOR)
    assert "top_p=" in str(failure.value) and "case: logits=" in str(failure.value)


@pytest.mark.parametrize("mutant", [top_p_drops_crossing_token, min_p_before_temperature])
def test_draws_alone_catch_a_mutant(mutant):
    """A backend that only draws tokens is held to the distribution by its counts."""
    with pytest.raises(SamplingMismatch, match="draws fit its distribution with p = |which it never draws"):
        check_draws(sampler_from_probabilities(mutant), min_temperature=REFLLM_FLOOR)


@pytest.mark.parametrize("mutant", SEED_MUTANTS, ids=[m.__name__ for m in SEED_MUTANTS])
def test_each_seed_mutant_is_caught(mutant):
    with pytest.raises(SamplingMismatch, match=r"drew \[.*\] alone but \[.*\] in batches"):
        check_seeds(mutant)
