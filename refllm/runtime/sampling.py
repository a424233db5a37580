"""Sampling: SamplingParams and the chain of pure functions that picks the next token from logits [V].

The chain, in this order (each step maps logits [V] to logits [V] in float64, a token
it rules out set to -inf, so each can be tested on an exact probability vector):

    check_logits -> apply_logit_bias -> apply_penalties
    -> temperature 0: the first largest logit (a point mass; top-k, top-p and min-p keep it anyway)
    -> otherwise: apply_temperature -> top_k_filter -> top_p_filter -> min_p_filter -> softmax -> draw

``probabilities`` is the distribution the token is drawn from, so a point mass for
greedy decoding. Every accepted SamplingParams gives finite logits and a distribution
without NaN from any logits ``check_logits`` accepts: the chain runs in float64, and
temperature divides logits already shifted so that their largest is 0. transformers
runs the same order after its logits processors; vLLM applies min-p before top-k and
top-p, and llama.cpp's default chain puts temperature last (docs/runtime.md#sampling).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from refllm.errors import InvalidInputError, TokenOutOfRangeError

TEMPERATURE_FLOOR = 1e-5  # a temperature is 0 (greedy) or at least this
LOGIT_BIAS_LIMIT = 100.0  # a bias is in [-100, 100], as OpenAI defines logit_bias
MAX_LOGIT_BIAS_TOKENS = 1024
REPETITION_PENALTY_RANGE = (0.01, 100.0)
FLOAT32_MAX = float(np.finfo(np.float32).max)


class SamplingParamsError(InvalidInputError):
    """A sampling parameter outside its valid range; ``name`` is the parameter and ``rule`` what it must be."""

    def __init__(self, message: str, name: str | None = None, rule: str | None = None):
        super().__init__(message)
        self.name, self.rule = name, rule


class LogitsError(InvalidInputError):
    """Logits no token can be drawn from (NaN, +inf, past float32's range, or none finite): a failed forward pass."""


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Defaults are greedy decoding of up to 64 tokens.

    temperature: 0 is greedy (argmax); otherwise at least TEMPERATURE_FLOOR, larger flattens.
    top_k: keep the k most likely tokens, ties at the k-th kept too (0 keeps all).
    top_p: keep the smallest set whose probability reaches p (1.0 keeps all).
    min_p: drop tokens less likely than min_p times the most likely one (0 keeps all).
    repetition_penalty: divide positive / multiply negative logits of tokens in the prompt or output (1.0 is off).
    presence_penalty, frequency_penalty: subtract per generated token, once / per occurrence.
    logit_bias: {token id: bias in [-100, 100]} added to the logits first (kept as sorted pairs).
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
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        low, high = REPETITION_PENALTY_RANGE
        checks = [
            ("temperature", _is_real, lambda t: t == 0 or t >= TEMPERATURE_FLOOR,
             f"must be 0 (greedy) or at least {TEMPERATURE_FLOOR:g}"),
            ("top_k", _is_whole, lambda k: k >= 0, "must be >= 0 (0 keeps every token)"),
            ("top_p", _is_real, lambda p: 0 < p <= 1, "must be in (0, 1]"),
            ("min_p", _is_real, lambda p: 0 <= p <= 1, "must be in [0, 1]"),
            ("repetition_penalty", _is_real, lambda r: low <= r <= high, f"must be in [{low:g}, {high:g}]"),
            ("presence_penalty", _is_real, lambda x: -2 <= x <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", _is_real, lambda x: -2 <= x <= 2, "must be in [-2, 2]"),
            ("seed", _is_whole, lambda s: s >= 0, "must be a whole number >= 0"),
            ("max_tokens", _is_whole, lambda m: m >= 1, "must be >= 1"),
            ("logprobs", _is_whole, lambda k: k >= 0, "must be >= 0"),
            ("n", _is_whole, lambda n: n >= 1, "must be >= 1"),
        ]  # fmt: skip
        for name, of_type, in_range, rule in checks:
            value = getattr(self, name)
            if value is None and name in ("seed", "logprobs"):
                continue
            if not (of_type(value) and in_range(value)):
                raise SamplingParamsError(f"{name}={value!r:.60} {rule}", name, rule)
        # Accept lists and dicts from JSON callers; keep the frozen dataclass hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if any(not s for s in self.stop):
            raise SamplingParamsError("stop strings must not be empty", "stop")
        object.__setattr__(self, "logit_bias", _checked_logit_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse a logit_bias token id outside [0, vocab_size) (SamplingParams alone cannot know the vocabulary)."""
        outside = [token for token, _ in self.logit_bias if token >= vocab_size]
        if outside:
            raise TokenOutOfRangeError(
                f"logit_bias names token {outside[0]}, outside the vocabulary [0, {vocab_size})"
            )


def _checked_logit_bias(value: Mapping[int, float] | Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """{token: bias} or (token, bias) pairs -> pairs sorted by token, each checked."""
    rule = f"must map token ids (>= 0) to biases in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]"
    try:
        pairs = [(token, bias) for token, bias in (value.items() if isinstance(value, Mapping) else value)]
    except (TypeError, ValueError):
        raise SamplingParamsError(f"logit_bias {rule}; got {value!r:.60}", "logit_bias", rule) from None
    if len(pairs) > MAX_LOGIT_BIAS_TOKENS:
        raise SamplingParamsError(
            f"logit_bias names {len(pairs)} tokens; at most {MAX_LOGIT_BIAS_TOKENS}", "logit_bias", rule
        )
    checked: dict[int, float] = {}
    for token, bias in pairs:
        if not (_is_whole(token) and token >= 0 and _is_real(bias) and abs(bias) <= LOGIT_BIAS_LIMIT):
            raise SamplingParamsError(f"logit_bias {rule}; got {token!r:.30}: {bias!r:.30}", "logit_bias", rule)
        if int(token) in checked:
            raise SamplingParamsError(f"logit_bias names token {token} twice", "logit_bias", rule)
        checked[int(token)] = float(bias)
    return tuple(sorted(checked.items()))


# --- the chain -------------------------------------------------------------------------------------


def check_logits(logits: np.ndarray) -> np.ndarray:
    """logits [V] -> float64 [V]; refused unless every value is finite within float32's range or -inf (never)."""
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0 or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise LogitsError(f"logits must be a non-empty vector of numbers; got {x.dtype} of shape {x.shape}")
    x = x.astype(np.float64)
    bad = np.flatnonzero(np.isnan(x) | (x > FLOAT32_MAX) | ((x < -FLOAT32_MAX) & np.isfinite(x)))
    if bad.size:
        value = "NaN" if np.isnan(x[bad[0]]) else f"{x[bad[0]]:g}"
        raise LogitsError(
            f"the logits hold {value} at token {bad[0]}"
            f"{f' (and {bad.size - 1} more)' if bad.size > 1 else ''}: no token can be drawn from them"
        )
    if not np.isfinite(x).any():
        raise LogitsError("every logit is -inf: no token can be drawn")
    return x


def apply_logit_bias(logits: np.ndarray, logit_bias: Sequence[tuple[int, float]]) -> np.ndarray:
    """Add each bias to its token's logit (OpenAI's logit_bias): -100 all but bans a token, +100 all but forces it."""
    if not logit_bias:
        return logits
    tokens, biases = zip(*logit_bias)
    if max(tokens) >= logits.size:
        raise TokenOutOfRangeError(f"logit_bias names token {max(tokens)}, outside the vocabulary [0, {logits.size})")
    logits = logits.copy()
    logits[list(tokens)] += biases
    return logits


def apply_penalties(
    logits: np.ndarray, prompt_tokens: Sequence[int], output_tokens: Sequence[int], params: SamplingParams
) -> np.ndarray:
    """Repetition penalty over prompt and output (transformers' and vLLM's rule); presence/frequency over the
    output only (OpenAI's)."""
    logits = np.asarray(logits, np.float64).copy()
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
        occurrences = np.fromiter(counts.values(), np.float64)
        logits[tokens] -= params.presence_penalty + params.frequency_penalty * occurrences
    return logits


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(logits - max) / T: the softmax of logits / T, with the largest at 0 so that no small T overflows."""
    return (logits - np.max(logits)) / temperature


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits (ties at the k-th value are kept too, as transformers and vLLM do)."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep each token whose more likely tokens (ties in index order) hold less than p (so at least one)."""
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


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p = logits - log(sum(exp(logits))), computed stably in float64."""
    x = np.asarray(logits, np.float64)
    shifted = x - np.max(x)
    return shifted - np.log(np.sum(np.exp(shifted)))


def processed_logits(
    logits: np.ndarray, params: SamplingParams, prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = ()
) -> np.ndarray:
    """The chain before the draw: logits [V] -> float64 logits [V] (excluded tokens at -inf).

    For greedy decoding the chain stops after the penalties: the token is their argmax.
    """
    logits = apply_logit_bias(check_logits(logits), params.logit_bias)
    logits = apply_penalties(logits, prompt_tokens, output_tokens, params)
    if params.greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    return min_p_filter(logits, params.min_p)


def probabilities(
    logits: np.ndarray, params: SamplingParams, prompt_tokens: Sequence[int] = (), output_tokens: Sequence[int] = ()
) -> np.ndarray:
    """The distribution the next token is drawn from, [V] float64 summing to 1: for greedy decoding, a point
    mass on the first largest processed logit."""
    processed = processed_logits(logits, params, prompt_tokens, output_tokens)
    if params.greedy:
        point = np.zeros(processed.size)
        point[int(np.argmax(processed))] = 1.0
        return point
    return np.exp(log_softmax(processed))


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
        probs = probabilities(logits, self.params, prompt_tokens, output_tokens)
        token = int(np.argmax(probs)) if self.params.greedy else int(self.rng.choice(probs.size, p=probs))
        raw = log_softmax(logits)  # before logit_bias, penalties and temperature, as vLLM's raw_logprobs
        top = []
        if self.params.logprobs:
            best = np.argsort(-raw, kind="stable")[: self.params.logprobs]
            top = [(int(t), float(raw[t])) for t in best]
        return TokenChoice(token, float(raw[token]), top)
