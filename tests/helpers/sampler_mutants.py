"""The sampler mutation gallery: refllm's sampling chain with one deliberate bug each.

Each probability mutant is a ``probabilities(logits, params, prompt_tokens, output_tokens)`` entry
point, as ``refllm.testing.sampling.check_probabilities`` takes them: refllm's chain
(``refllm.runtime.sampling``) with one step replaced. The seed mutants are sampler factories whose
requests draw from the wrong generator: one shared by all, one per seed, one seeded anew on resuming.
The sampling properties must catch every one (``tests/testing/test_oracle_sampling.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from refllm.runtime import sampling as chain
from refllm.testing.sampling_draws import refllm_params, refllm_probabilities
from refllm.testing.sampling_semantics import SamplerParams, SamplingRow


def _chain(
    logits, params: SamplerParams, prompt, output, penalties=chain.apply_penalties, top_k=chain.top_k_filter,
    top_p=chain.top_p_filter, min_p_before_temperature=False,
) -> np.ndarray:  # fmt: skip
    """refllm's ``probabilities`` with the steps given in place of its own."""
    params = refllm_params(params)
    x = penalties(chain.check_logits(logits), prompt, output, params)
    if params.greedy:
        return np.eye(x.size)[int(np.argmax(x))]
    if min_p_before_temperature:
        x = chain.min_p_filter(x, params.min_p)
    x = top_p(top_k(chain.apply_temperature(x, params.temperature), params.top_k), params.top_p)
    if not min_p_before_temperature:
        x = chain.min_p_filter(x, params.min_p)
    return np.exp(chain.log_softmax(x))


def _top_p_without_crossing(logits: np.ndarray, p: float) -> np.ndarray:
    """Keeps the tokens whose mass, their own included, stays below p: the token that crosses p is dropped."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, kind="stable")
    through = np.cumsum(np.exp(chain.log_softmax(logits[order])))
    keep = np.zeros(logits.size, bool)
    keep[order[through < p]] = True
    keep[order[0]] = True
    return np.where(keep, logits, -np.inf)


def _repetition_divides_all(logits, prompt, output, params) -> np.ndarray:
    """Divides every seen token's logit by the penalty, so a negative one becomes more likely."""
    logits = logits.copy()
    logits[np.unique(np.asarray([*prompt, *output], dtype=np.int64))] /= params.repetition_penalty
    return chain.apply_penalties(logits, prompt, output, replace(params, repetition_penalty=1.0))


def _penalties_over_prompt(logits, prompt, output, params) -> np.ndarray:
    """Counts the prompt's tokens for the presence and frequency penalties too."""
    logits = chain.apply_penalties(logits, prompt, output, replace(params, presence_penalty=0.0, frequency_penalty=0.0))
    for token, count in Counter([*prompt, *output]).items():
        logits[token] -= params.presence_penalty + params.frequency_penalty * count
    return logits


def top_p_drops_crossing_token(logits, params, prompt, output):
    return _chain(logits, params, prompt, output, top_p=_top_p_without_crossing)


def min_p_before_temperature(logits, params, prompt, output):
    return _chain(logits, params, prompt, output, min_p_before_temperature=True)


def repetition_divides_negative_logits(logits, params, prompt, output):
    return _chain(logits, params, prompt, output, penalties=_repetition_divides_all)


def penalties_count_the_prompt(logits, params, prompt, output):
    return _chain(logits, params, prompt, output, penalties=_penalties_over_prompt)


def top_k_cuts_ties(logits, params, prompt, output):
    """Keeps exactly k tokens (llama.cpp's rule), where refllm and transformers keep every tie at the k-th."""

    def exactly_k(x: np.ndarray, k: int) -> np.ndarray:
        if k <= 0 or k >= x.size:
            return x
        return np.where(np.isin(np.arange(x.size), np.argsort(-x, kind="stable")[:k]), x, -np.inf)

    return _chain(logits, params, prompt, output, top_k=exactly_k)


def shared_generator():
    """A sampler whose requests all draw from one generator, seeded by the first request it sees."""
    shared: list[np.random.Generator] = []

    def generator_for(row: SamplingRow, _: int) -> np.random.Generator:
        if not shared:
            shared.append(np.random.default_rng(row.params.seed))
        return shared[0]

    return _seeded_sampler(generator_for)


def _seeded_sampler(generator_for):
    """A sampler drawing each row from refllm's distribution with ``generator_for(row, call)``'s generator."""
    calls = [0]

    def sample(rows: Sequence[SamplingRow]) -> list[int]:
        calls[0] += 1
        tokens = []
        for row in rows:
            p = refllm_probabilities(row.logits, row.params, row.prompt_tokens, row.output_tokens)
            tokens.append(int(generator_for(row, calls[0]).choice(p.size, p=p)))
        return tokens

    return sample


def generator_per_seed():
    """A sampler whose requests share a generator when they share a seed."""
    generators: dict[int, np.random.Generator] = {}

    def generator_for(row: SamplingRow, _: int) -> np.random.Generator:
        if row.params.seed not in generators:
            generators[row.params.seed] = np.random.default_rng(row.params.seed)
        return generators[row.params.seed]

    return _seeded_sampler(generator_for)


def reseeded_on_resume():
    """A sampler that seeds a request's generator anew when it comes back after sitting out a step, as an
    engine that rebuilds a preempted request's state from its parameters."""
    generators: dict[int, np.random.Generator] = {}
    last_call: dict[int, int] = {}

    def generator_for(row: SamplingRow, call: int) -> np.random.Generator:
        if last_call.get(row.request_id) != call - 1:
            generators[row.request_id] = np.random.default_rng(row.params.seed)
        last_call[row.request_id] = call
        return generators[row.request_id]

    return _seeded_sampler(generator_for)


# (name, mutant, the semantics whose properties catch it): the probability mutants
PROBABILITY_MUTANTS = [
    ("top-p drops the crossing token", top_p_drops_crossing_token, "transformers"),
    ("min-p before temperature", min_p_before_temperature, "transformers"),
    ("repetition penalty divides negative logits", repetition_divides_negative_logits, "transformers"),
    ("presence and frequency penalties count the prompt", penalties_count_the_prompt, "openai"),
    ("top-k cuts ties at the k-th value", top_k_cuts_ties, "transformers"),
]
SEED_MUTANTS = [shared_generator, generator_per_seed, reseeded_on_resume]
