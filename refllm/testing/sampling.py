"""Sampling conformance: does a backend's sampler mean what a named semantics means?

Three properties, each run on a backend's own entry point (docs/oracle.md#sampling-conformance):

- ``check_probabilities(probabilities, semantics)``: the distribution the sampler draws from, on
  hypothesis-drawn logits (ties, near-ties, -inf, ranges up to 1e4) and parameters, equals the
  semantics' reference: exactly the same tokens may be drawn (up to swapping tied tokens), each tie
  group with the same mass.
- ``check_draws(sampler, semantics)``: tokens actually drawn never fall outside the reference's
  support, and their counts fit the reference distribution (a chi-square test whose false-alarm
  rate is stated and whose seeds are fixed, so a run is reproducible).
- ``check_seeds(sampler)``: a seeded request draws the same tokens alone, beside others, in any
  order of the batch, and when it sits out steps (preempted) and comes back.

``probabilities(logits, params, prompt_tokens, output_tokens) -> [V]`` takes float64 logits and a
``SamplerParams``; ``sampler`` is a factory of fresh samplers, each called with a batch of
``SamplingRow`` and returning one token per row, keeping each request's random state by its id.
This module holds the first (it needs hypothesis); ``refllm.testing.sampling_draws`` the other two,
``probabilities_from_logits`` (the entry point made of a processed-logits function),
``sampler_from_probabilities`` (a sampler made of a ``probabilities`` function) and
``refllm_probabilities`` and ``refllm_sampler``, refllm's own sampler behind these entry points.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from refllm.testing.sampling_draws import ProbabilitiesFn
from refllm.testing.sampling_semantics import (
    SMALLEST_CHECKED_PROBABILITY,
    ReferenceDistribution,
    SamplerParams,
    SamplingCase,
    SamplingMismatch,
    Semantics,
    get_semantics,
    reference_distribution,
    tie_groups,
)

# --- the distribution ------------------------------------------------------------------------------


def compare_distribution(ref: ReferenceDistribution, got: np.ndarray, rtol: float, atol: float) -> str:
    """'' when ``got`` is the reference distribution up to swapping tied tokens; otherwise what differs."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.probabilities.shape or not np.all(np.isfinite(got)) or np.any(got < 0):
        return f"not a probability vector of {ref.probabilities.size} finite values >= 0: {got!r}"
    if abs(got.sum() - 1) > 1e-5:
        return f"the probabilities sum to {got.sum()!r}, not 1"
    for tokens in tie_groups(ref.penalized):
        want, have = ref.probabilities[tokens], got[tokens]
        kept, drawn = int(np.count_nonzero(want)), int(np.count_nonzero(have))
        small = kept and want.sum() / kept < SMALLEST_CHECKED_PROBABILITY
        if drawn > kept or (drawn < kept and not small) or abs(have.sum() - want.sum()) > atol + rtol * want.sum():
            which = f"tied tokens {tokens.tolist()}" if tokens.size > 1 else f"token {tokens[0]}"
            return (
                f"{which}: the semantics gives probability {want.sum():.9g} to {kept} of them, "
                f"the backend {have.sum():.9g} to {drawn}"
            )
    return ""


@st.composite
def logits_vectors(draw) -> np.ndarray:
    """Float32-exact logits [2, 16]: ties, float32 neighbours, values 0.001 to 0.1 apart, -inf, ranges up to 1e4."""
    scale = draw(st.sampled_from([1.0, 1.0, 10.0, 1e3, 1e4]))
    values: list[np.float32] = []
    for _ in range(draw(st.integers(2, 16))):
        kind = draw(st.sampled_from(["fresh", "fresh", "tie", "neighbour", "close", "-inf"] if values else ["fresh"]))
        earlier = values[draw(st.integers(0, len(values) - 1))] if values else np.float32(0)
        if kind == "fresh" or not np.isfinite(earlier):
            values.append(np.float32(draw(st.floats(-4, 4)) * scale))
        elif kind == "tie":
            values.append(earlier)
        elif kind == "neighbour":
            values.append(np.nextafter(earlier, np.float32(np.inf), dtype=np.float32))
        elif kind == "close":
            values.append(np.float32(earlier + draw(st.sampled_from([1e-3, 1e-2, 0.1]))))
        else:
            values.append(np.float32(-np.inf))
    return np.asarray(values, dtype=np.float64)


def sampler_params(semantics: Semantics, logits: np.ndarray, min_temperature: float = 0.0) -> st.SearchStrategy:
    """Parameters the semantics defines, each off or drawn over its range (tiny temperatures included; top-k
    often cutting through tied logits)."""
    ranked = np.sort(logits)[::-1]
    cuts_through_ties = [k for k in range(1, logits.size) if ranked[k - 1] == ranked[k]] or [1]
    temperatures = st.one_of(
        st.just(0.0), st.just(1.0), st.floats(0.05, 4.0), st.floats(4.0, 100.0),
        st.sampled_from([1e-6, 1e-5, 1e-3, 0.005, 0.02]),
    ).filter(lambda t: t == 0 or t >= min_temperature)  # fmt: skip
    drawn = {
        "temperature": temperatures,
        "top_k": st.one_of(st.just(0), st.integers(1, logits.size + 1), st.sampled_from(cuts_through_ties)),
        "top_p": st.one_of(st.just(1.0), st.floats(0.01, 1.0), st.sampled_from([1e-9, 0.5, 0.8, 0.9, 0.95, 1 - 1e-6])),
        "min_p": st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.sampled_from([1e-9, 0.05, 0.1, 0.2, 0.5, 1.0])),
        "repetition_penalty": st.one_of(st.just(1.0), st.floats(0.5, 3.0)),
        "presence_penalty": st.one_of(st.just(0.0), st.floats(-2.0, 2.0)),
        "frequency_penalty": st.one_of(st.just(0.0), st.floats(-2.0, 2.0)),
    }
    chosen = {name: drawn[name] for name in semantics.parameters}
    return st.builds(SamplerParams, seed=st.integers(0, 2**32 - 1), **chosen)


@st.composite
def sampling_cases(draw, semantics: Semantics, min_temperature: float = 0.0) -> SamplingCase:
    logits = draw(logits_vectors())
    if not np.isfinite(logits).any():
        logits[0] = 0.0
    tokens = st.lists(st.integers(0, logits.size - 1), max_size=8).map(tuple)
    params = draw(sampler_params(semantics, logits, min_temperature))
    return SamplingCase(logits, params, draw(tokens), draw(tokens))


def check_probabilities(
    probabilities_fn: ProbabilitiesFn,
    semantics: str | Semantics = "transformers",
    max_examples: int = 300,
    seed: int = 0,
    min_temperature: float = 0.0,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    margin: float = 1e-6,
    shrink: bool = True,
) -> int:
    """Hold ``probabilities_fn`` to ``semantics`` on ``max_examples`` drawn cases -> the cases compared.

    Raises SamplingMismatch for the smallest failing case. A case where a filter's decision lies within
    ``margin`` of its threshold is set aside (rounding decides it); ``min_temperature`` keeps drawn
    temperatures at 0 or above it, for a sampler that refuses smaller ones.
    """
    semantics = get_semantics(semantics)
    compared = 0
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(max_examples=max_examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip
    @hypothesis_seed(seed)
    @given(case=sampling_cases(semantics, min_temperature))
    def test(case: SamplingCase) -> None:
        nonlocal compared
        history = (case.prompt_tokens, case.output_tokens)
        ref = reference_distribution(semantics, case.logits, case.params, *history, margin=margin)
        if ref.borderline:
            reject()
        got = probabilities_fn(case.logits.copy(), case.params, *history)
        compared += 1
        difference = compare_distribution(ref, got, rtol, atol)
        if difference:
            raise SamplingMismatch(f"not the {semantics.name} semantics: {difference}\n  case: {case.describe()}")

    test()
    return compared
