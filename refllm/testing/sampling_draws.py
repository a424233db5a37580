"""Sampling conformance on drawn tokens: support and goodness of fit, and seeds that ignore the batch.

A sampler here is what an engine runs each step: ``sampler(rows) -> one token per row``, each
``SamplingRow`` naming its request (the key of that request's random state), its logits, parameters
and history. ``check_draws`` and ``check_seeds`` take a factory of fresh samplers.

- ``check_draws``: on ``cases`` fixed cases (drawn from ``seed``), ``draws`` requests with distinct
  seeds each draw one token; a token outside the semantics' support fails at once, and the counts
  are held to the reference distribution by a chi-square test at ``false_alarm_rate / cases`` per
  case, so a correct sampler fails a run with probability at most ``false_alarm_rate``. The seeds are
  fixed, so a given sampler passes or fails the same way every run.
- ``check_seeds``: each request drawn alone, then beside the others in shuffled batches (after the
  first schedule, requests also sit out steps, as if preempted, and come back); two of them are the
  same request with the same seed. Every request must draw the same tokens every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from refllm.runtime.sampling import Sampler, SamplingParams, probabilities
from refllm.testing.sampling_semantics import (
    SamplerParams,
    SamplingCase,
    SamplingMismatch,
    SamplingRow,
    Semantics,
    get_semantics,
    reference_distribution,
    tie_groups,
)

BatchSampler = Callable[[Sequence[SamplingRow]], Sequence[int]]
ProbabilitiesFn = Callable[[np.ndarray, SamplerParams, tuple, tuple], np.ndarray]
SMALLEST_EXPECTED_COUNT = 5  # the chi-square approximation needs about this many expected draws per bin


def chi_square_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X chi-square with ``dof`` degrees of freedom: Q(dof/2, statistic/2), the
    regularized upper incomplete gamma function (a series below a + 1, a continued fraction above)."""
    a, x = dof / 2, statistic / 2
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1 - total * math.exp(log_front))
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    fraction = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        fraction *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return math.exp(log_front) * fraction


def draw_cases(semantics: Semantics, count: int, seed: int, min_temperature: float = 0.0) -> list[SamplingCase]:
    """``count`` cases with at least two tokens that may be drawn, none decided within rounding of a threshold."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        vocab = int(rng.integers(4, 13))
        logits = rng.normal(0.0, 2.0, vocab).astype(np.float32).astype(np.float64)
        if rng.random() < 0.5:
            logits[rng.integers(vocab)] = logits[rng.integers(vocab)]  # a tie
        ranges = {
            "temperature": lambda: rng.uniform(max(0.3, min_temperature), 2.0),
            "top_k": lambda: int(rng.integers(1, vocab)),
            "top_p": lambda: rng.uniform(0.3, 0.95),
            "min_p": lambda: rng.uniform(0.02, 0.3),
            "repetition_penalty": lambda: rng.uniform(0.5, 2.0),
            "presence_penalty": lambda: rng.uniform(-1.0, 1.0),
            "frequency_penalty": lambda: rng.uniform(-1.0, 1.0),
        }
        params = SamplerParams(**{name: ranges[name]() for name in semantics.parameters if rng.random() < 0.6})
        history = [tuple(int(t) for t in rng.integers(0, vocab, rng.integers(0, 7))) for _ in range(2)]
        case = SamplingCase(logits, params, *history)
        ref = reference_distribution(semantics, logits, params, *history)
        if not ref.borderline and np.count_nonzero(ref.probabilities) >= 2:
            cases.append(case)
    return cases


def draw_tokens(sampler: BatchSampler, case: SamplingCase, draws: int, first_seed: int, batch_size: int) -> list[int]:
    """One token from each of ``draws`` requests that differ only in their seeds, ``batch_size`` rows a call."""
    tokens: list[int] = []
    for start in range(0, draws, batch_size):
        rows = [
            SamplingRow(i, case.logits.copy(), replace(case.params, seed=first_seed + i), *case_history(case))
            for i in range(start, min(draws, start + batch_size))
        ]
        tokens.extend(int(token) for token in sampler(rows))
    return tokens


def case_history(case: SamplingCase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return case.prompt_tokens, case.output_tokens


def goodness_of_fit(expected: np.ndarray, observed: np.ndarray) -> tuple[float, int]:
    """(chi-square statistic, degrees of freedom) over bins of at least SMALLEST_EXPECTED_COUNT expected
    draws, the smaller ones pooled (into the smallest bin when the pool alone is too small)."""
    large = expected >= SMALLEST_EXPECTED_COUNT
    bins_expected, bins_observed = list(expected[large]), list(observed[large])
    pooled_expected, pooled_observed = expected[~large].sum(), observed[~large].sum()
    if pooled_expected >= SMALLEST_EXPECTED_COUNT or not bins_expected:
        bins_expected.append(pooled_expected)
        bins_observed.append(pooled_observed)
    elif pooled_expected > 0:
        smallest = int(np.argmin(bins_expected))
        bins_expected[smallest] += pooled_expected
        bins_observed[smallest] += pooled_observed
    e, o = np.asarray(bins_expected), np.asarray(bins_observed)
    return float(np.sum((o - e) ** 2 / e)), len(e) - 1


def check_draws(
    sampler_factory: Callable[[], BatchSampler],
    semantics: str | Semantics = "transformers",
    cases: int = 8,
    draws: int = 2000,
    false_alarm_rate: float = 1e-3,
    seed: int = 0,
    min_temperature: float = 0.0,
    batch_size: int = 100,
) -> list[float]:
    """Hold the tokens a sampler draws to ``semantics`` -> each case's p-value; SamplingMismatch if one fails."""
    semantics = get_semantics(semantics)
    p_values = []
    for index, case in enumerate(draw_cases(semantics, cases, seed, min_temperature)):
        first_seed = (seed * cases + index) * draws
        tokens = draw_tokens(sampler_factory(), case, draws, first_seed, batch_size)
        ref = reference_distribution(semantics, case.logits, case.params, *case_history(case))
        groups = tie_groups(ref.penalized)
        counts = np.bincount(np.asarray(tokens), minlength=case.logits.size)
        expected = np.array([ref.probabilities[g].sum() * draws for g in groups])
        observed = np.array([counts[g].sum() for g in groups])
        outside = [g.tolist() for g, e, o in zip(groups, expected, observed) if e == 0 and o > 0]
        if outside:
            raise SamplingMismatch(
                f"not the {semantics.name} semantics: drew token(s) {outside}, which it never draws\n"
                f"  case: {case.describe()}"
            )
        statistic, dof = goodness_of_fit(expected, observed)
        p_value = chi_square_survival(statistic, dof) if dof else 1.0
        if p_value < false_alarm_rate / cases:
            table = ", ".join(f"{g.tolist()}: {o} vs {e:.1f}" for g, e, o in zip(groups, expected, observed) if e or o)
            raise SamplingMismatch(
                f"not the {semantics.name} semantics: {draws} draws fit its distribution with p = {p_value:.2g}"
                f" (chi-square {statistic:.1f} on {dof} degrees of freedom), below {false_alarm_rate / cases:.2g}\n"
                f"  drawn vs expected per token: {table}\n  case: {case.describe()}"
            )
        p_values.append(p_value)
    return p_values


def check_seeds(
    sampler_factory: Callable[[], BatchSampler],
    requests: int = 6,
    steps: int = 8,
    schedules: int = 3,
    vocab_size: int = 16,
    seed: int = 0,
) -> None:
    """Every seeded request draws the same tokens alone and in every batch; SamplingMismatch names the first
    request and step that did not. Request 1 repeats request 0 (same prompt, same seed) under its own id."""
    rng = np.random.default_rng(seed)
    prompts = [tuple(int(t) for t in rng.integers(0, vocab_size, rng.integers(1, 6))) for _ in range(requests)]
    seeds = [int(s) for s in rng.integers(0, 2**31, requests)]
    prompts[1], seeds[1] = prompts[0], seeds[0]

    def row(r: int, output: list[int]) -> SamplingRow:
        logits = np.random.default_rng([seed, len(output), *prompts[r], *output]).normal(0.0, 1.5, vocab_size)
        return SamplingRow(r, logits, SamplerParams(seed=seeds[r]), prompts[r], tuple(output))

    alone = []
    for r in range(requests):
        sampler, output = sampler_factory(), []
        for _ in range(steps):
            output.append(int(sampler([row(r, output)])[0]))
        alone.append(output)
    for schedule in range(schedules):
        order_rng, sampler = np.random.default_rng([seed, schedule]), sampler_factory()
        outputs: list[list[int]] = [[] for _ in range(requests)]
        beside: list[list[list[int]]] = [[] for _ in range(requests)]
        while unfinished := [r for r in range(requests) if len(outputs[r]) < steps]:
            present = [r for r in unfinished if schedule == 0 or order_rng.random() < 0.6] or unfinished[:1]
            batch = [int(r) for r in order_rng.permutation(present)]
            for r, token in zip(batch, sampler([row(r, outputs[r]) for r in batch])):
                beside[r].append(batch)
                outputs[r].append(int(token))
        for r in range(requests):
            if outputs[r] != alone[r]:
                step = next(t for t in range(steps) if outputs[r][t] != alone[r][t])
                raise SamplingMismatch(
                    f"request {r} (seed {seeds[r]}) drew {alone[r]} alone but {outputs[r]} in batches "
                    f"(schedule {schedule}); first at step {step}, in the batch {beside[r][step]}"
                )


def probabilities_from_logits(processed_logits_fn: ProbabilitiesFn) -> ProbabilitiesFn:
    """A probabilities entry point made of one that returns processed logits [V] (ruled-out tokens at -inf):
    their softmax, and for temperature 0 the point mass on their first largest value."""

    def probabilities_fn(logits: np.ndarray, params: SamplerParams, prompt: tuple, output: tuple) -> np.ndarray:
        x = np.asarray(processed_logits_fn(logits, params, prompt, output), dtype=np.float64)
        if params.temperature == 0:
            return np.eye(x.size)[int(np.argmax(x))]
        weights = np.exp(x - np.max(x))
        return weights / weights.sum()

    return probabilities_fn


def sampler_from_probabilities(probabilities_fn: ProbabilitiesFn) -> Callable[[], BatchSampler]:
    """A sampler factory drawing each row from ``probabilities_fn`` with its request's own generator."""

    def factory() -> BatchSampler:
        generators: dict[int, np.random.Generator] = {}

        def sample(rows: Sequence[SamplingRow]) -> list[int]:
            tokens = []
            for row in rows:
                if row.request_id not in generators:
                    generators[row.request_id] = np.random.default_rng(row.params.seed)
                p = np.asarray(probabilities_fn(row.logits, row.params, row.prompt_tokens, row.output_tokens), float)
                tokens.append(int(generators[row.request_id].choice(p.size, p=p / p.sum())))
            return tokens

        return sample

    return factory


def refllm_params(params: SamplerParams) -> SamplingParams:
    """The kit's parameters as refllm's own SamplingParams."""
    return SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
        repetition_penalty=params.repetition_penalty, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, seed=params.seed,
    )  # fmt: skip


def refllm_probabilities(logits: np.ndarray, params: SamplerParams, prompt: tuple, output: tuple) -> np.ndarray:
    """refllm's sampler as a probabilities entry point (``refllm.runtime.sampling.probabilities``)."""
    return probabilities(logits, refllm_params(params), prompt, output)


def refllm_sampler() -> BatchSampler:
    """A fresh refllm sampler: one ``Sampler`` per request, seeded as the engine seeds a single completion."""
    samplers: dict[int, Sampler] = {}

    def sample(rows: Sequence[SamplingRow]) -> list[int]:
        for row in rows:
            if row.request_id not in samplers:
                samplers[row.request_id] = Sampler(refllm_params(row.params))
        return [samplers[r.request_id](r.logits, r.prompt_tokens, r.output_tokens).token for r in rows]

    return sample
