"""Sampling: SamplingParams and a chain of pure functions over one logits vector.

The model returns logits; choosing the next token happens here, in this order
(the order vLLM and transformers use):

    penalties (repetition, presence, frequency) -> temperature
    -> top-k -> top-p -> min-p -> draw (or argmax when temperature == 0)

Each filter maps logits [V] to logits [V] with the excluded tokens set to -inf,
so each can be tested on an exact probability vector.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from refllm.errors import InvalidInputError


class SamplingParamsError(InvalidInputError):
    """A sampling parameter outside its valid range; ``name`` is the parameter and ``rule`` what it must be."""

    def __init__(self, message: str, name: str | None = None, rule: str | None = None):
        super().__init__(message)
        self.name, self.rule = name, rule


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Defaults are greedy decoding of up to 64 tokens.

    temperature: 0 is greedy (argmax); larger flattens the distribution.
    top_k: keep the k most likely tokens (0 keeps all).
    top_p: keep the smallest set whose probability reaches p (1.0 keeps all).
    min_p: drop tokens less likely than min_p times the most likely one (0 keeps all).
    repetition_penalty: divide positive / multiply negative logits of seen tokens (1.0 is off).
    presence_penalty, frequency_penalty: subtract per generated token, once / per occurrence.
    seed: makes sampling reproducible; None draws from fresh entropy.
    logprobs: also return the log-probabilities of the top-n tokens at each step.
    n: completions per prompt (parallel sampling).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    n: int = 1
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature", "must be >= 0"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 keeps every token)"),
            (0 < self.top_p <= 1, "top_p", "must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p", "must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty", "must be > 0"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]"),
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (self.logprobs is None or self.logprobs >= 0, "logprobs", "must be >= 0"),
            (self.n >= 1, "n", "must be >= 1"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise SamplingParamsError(f"{name}={getattr(self, name)!r} {rule}", name, rule)
        # Accept lists from JSON callers; keep the frozen dataclass hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if any(not s for s in self.stop):
            raise SamplingParamsError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p = logits - log(sum(exp(logits))), computed stably in float64."""
    x = logits.astype(np.float64)
    shifted = x - np.max(x)
    return shifted - np.log(np.sum(np.exp(shifted)))


def apply_penalties(
    logits: np.ndarray, prompt_tokens: Sequence[int], output_tokens: Sequence[int], params: SamplingParams
) -> np.ndarray:
    """Repetition penalty over prompt and output (transformers' rule); presence/frequency over output (OpenAI's)."""
    logits = logits.astype(np.float32, copy=True)
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray([*prompt_tokens, *output_tokens], dtype=np.int64))
        if seen.size:
            values = logits[seen]
            logits[seen] = np.where(
                values > 0, values / params.repetition_penalty, values * params.repetition_penalty
            )
    if (params.presence_penalty or params.frequency_penalty) and output_tokens:
        counts = Counter(output_tokens)
        tokens = np.fromiter(counts.keys(), np.int64)
        occurrences = np.fromiter(counts.values(), np.float32)
        logits[tokens] -= params.presence_penalty + params.frequency_penalty * occurrences
    return logits


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits (ties at the k-th value are kept too)."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the most likely tokens until their probability sum reaches p (always at least one)."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, kind="stable")
    probs = np.exp(log_softmax(logits[order]))
    before = np.cumsum(probs) - probs  # mass of the tokens ranked above each one
    keep = np.zeros(logits.size, bool)
    keep[order[before < p]] = True
    return np.where(keep, logits, -np.inf)


def min_p_filter(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Drop tokens whose probability is below min_p times the top token's."""
    if min_p <= 0:
        return logits
    logp = log_softmax(logits)
    return np.where(logp >= np.max(logp) + np.log(min_p), logits, -np.inf)


def processed_logits(
    logits: np.ndarray, params: SamplingParams, prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = ()
) -> np.ndarray:
    """The whole chain before the draw: logits [V] -> logits [V] (excluded tokens at -inf)."""
    logits = apply_penalties(logits, prompt_tokens, output_tokens, params)
    if params.greedy:
        return logits
    logits = logits / np.float32(params.temperature)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def probabilities(
    logits: np.ndarray, params: SamplingParams, prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = ()
) -> np.ndarray:
    """The distribution the next token is drawn from, [V] float64 summing to 1."""
    return np.exp(log_softmax(processed_logits(logits, params, prompt_tokens, output_tokens)))


@dataclass
class TokenChoice:
    token: int
    logprob: float  # under the model's raw distribution
    top_logprobs: list[tuple[int, float]]  # the n most likely tokens, when asked for


class Sampler:
    """Draws tokens for one sequence: holds its random generator so a seed makes the run reproducible."""

    def __init__(self, params: SamplingParams, rng: np.random.Generator | None = None):
        self.params = params
        self.rng = rng if rng is not None else np.random.default_rng(params.seed)

    def __call__(
        self, logits: np.ndarray, prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = ()
    ) -> TokenChoice:
        processed = processed_logits(logits, self.params, prompt_tokens, output_tokens)
        if self.params.greedy:
            token = int(np.argmax(processed))
        else:
            probs = np.exp(log_softmax(processed))
            token = int(self.rng.choice(probs.size, p=probs))
        raw = log_softmax(logits)
        top = []
        if self.params.logprobs:
            best = np.argsort(-raw, kind="stable")[: self.params.logprobs]
            top = [(int(t), float(raw[t])) for t in best]
        return TokenChoice(token, float(raw[token]), top)
