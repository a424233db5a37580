"""What a sampling parameter means in each engine: small NumPy reference pipelines, one per named semantics.

Engines agree on the words (temperature, top-k, top-p, min-p, penalties) and
disagree on what they do. Each ``Semantics`` is written as read from that
engine's source (docs/oracle.md#sampling-conformance has the table):

- ``transformers``: repetition penalty over prompt and output, then temperature,
  top-k (ties at the k-th value kept), top-p, min-p; no presence or frequency
  penalty; any temperature > 0 taken as given.
- ``vllm``: penalties (repetition over prompt and output, presence and
  frequency over the output), then temperature, **min-p**, top-k (ties kept),
  top-p; a temperature in (0, 0.01) is raised to 0.01.
- ``llama.cpp`` (its default chain): penalties over the last 64 tokens of
  prompt and output together, then top-k (exactly k), top-p, min-p and
  **temperature last**.
- ``openai``: presence and frequency penalties over the output, temperature,
  top-p; no top-k, min-p or repetition penalty.

Temperature 0 is greedy everywhere: the largest logit after the penalties.
``reference_distribution`` runs a semantics on one case in float64 and says
whether any filter's decision lay within ``margin`` of its threshold (such a
case is decided by rounding, not by the semantics, so the properties set it aside).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SMALLEST_CHECKED_PROBABILITY = 1e-30  # a token the reference gives less may underflow to 0 in a backend
PARAMETERS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True)
class SamplerParams:
    """One request's sampling parameters, as plain values; an adapter turns them into its engine's own type.

    ``top_k`` 0, ``top_p`` 1, ``min_p`` 0, ``repetition_penalty`` 1 and the other penalties 0 are "off";
    ``seed`` seeds the request's own random generator.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0

    def active(self) -> tuple[str, ...]:
        """The parameters set to something other than "off" (temperature counts unless it is 1)."""
        off = SamplerParams()
        return tuple(name for name in PARAMETERS if getattr(self, name) != getattr(off, name))


class SamplingMismatch(AssertionError):
    """A sampler that does not mean what the semantics means; the message holds the case to replay."""


@dataclass(frozen=True)
class SamplingCase:
    """One question for a sampler: logits [V] and a request's parameters and history."""

    logits: np.ndarray
    params: SamplerParams
    prompt_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()

    def describe(self) -> str:
        active = ", ".join(f"{name}={getattr(self.params, name)!r}" for name in self.params.active()) or "all off"
        logits = np.array2string(self.logits, precision=9, separator=", ", max_line_width=1000)
        return f"logits={logits}, {active}, prompt={list(self.prompt_tokens)}, output={list(self.output_tokens)}"


@dataclass(frozen=True)
class SamplingRow:
    """One request's next token to draw: its id (the key of its random state), logits and history."""

    request_id: int
    logits: np.ndarray
    params: SamplerParams
    prompt_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Semantics:
    """One engine's meaning of the sampling parameters.

    order: temperature and the filters, in the order they run after the penalties.
    top_k_ties: "kept" (every token tied with the k-th survives) or "cut" (exactly k survive).
    repetition_scope, penalty_scope: which tokens the repetition penalty and the presence/frequency
    penalties count ("prompt+output" or "output"), None where the engine has no such penalty.
    penalty_window: only the last n tokens of that scope count (llama.cpp's penalty_last_n), None for all.
    temperature_floor: a temperature in (0, floor) is raised to the floor.
    """

    name: str
    order: tuple[str, ...]
    top_k_ties: str
    repetition_scope: str | None
    penalty_scope: str | None
    penalty_window: int | None = None
    temperature_floor: float = 0.0

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters this semantics defines; the others must stay off when checking against it."""
        penalties = ("repetition_penalty",) * bool(self.repetition_scope)
        penalties += ("presence_penalty", "frequency_penalty") * bool(self.penalty_scope)
        return self.order + penalties


SEMANTICS = {
    "transformers": Semantics(
        "transformers", ("temperature", "top_k", "top_p", "min_p"), "kept", "prompt+output", None
    ),
    "vllm": Semantics(
        "vllm", ("temperature", "min_p", "top_k", "top_p"), "kept", "prompt+output", "output", temperature_floor=0.01
    ),
    "llama.cpp": Semantics(
        "llama.cpp", ("top_k", "top_p", "min_p", "temperature"), "cut", "prompt+output", "prompt+output",
        penalty_window=64,
    ),  # fmt: skip
    "openai": Semantics("openai", ("temperature", "top_p"), "kept", None, "output"),
}


def get_semantics(name: str | Semantics) -> Semantics:
    """A semantics by name (or itself); a ValueError names the known ones."""
    if isinstance(name, Semantics):
        return name
    if name not in SEMANTICS:
        raise ValueError(f"unknown sampling semantics {name!r}; known: {', '.join(SEMANTICS)}")
    return SEMANTICS[name]


@dataclass(frozen=True)
class ReferenceDistribution:
    """The distribution a semantics draws from, [V] float64 summing to 1, with what the checks need beside it.

    penalized: the logits after the penalties: tokens with equal values here are interchangeable (which of
    two tied tokens a cut keeps is the engine's sort order, not its semantics).
    borderline: some filter's decision lay within the margin of its threshold.
    """

    probabilities: np.ndarray
    penalized: np.ndarray
    borderline: bool


def tie_groups(penalized: np.ndarray) -> list[np.ndarray]:
    """The token ids of each run of equal penalized logits: the tokens a semantics cannot tell apart."""
    _, group = np.unique(penalized, return_inverse=True)
    return [np.flatnonzero(group == g) for g in range(group.max() + 1)]


def penalized_logits(
    semantics: Semantics, logits: np.ndarray, params: SamplerParams, prompt: Sequence[int], output: Sequence[int]
) -> np.ndarray:
    """Repetition penalty (divide a positive logit, multiply a negative one), then presence and frequency."""
    x = np.array(logits, dtype=np.float64)

    def scope(name: str | None) -> list[int]:
        tokens = [*prompt, *output] if name == "prompt+output" else list(output) if name == "output" else []
        return tokens[-semantics.penalty_window :] if semantics.penalty_window else tokens

    seen = np.unique(np.asarray(scope(semantics.repetition_scope), dtype=np.int64))
    if params.repetition_penalty != 1.0 and seen.size:
        x[seen] = np.where(x[seen] > 0, x[seen] / params.repetition_penalty, x[seen] * params.repetition_penalty)
    counts = Counter(scope(semantics.penalty_scope))
    for token, count in counts.items():
        x[token] -= params.presence_penalty + params.frequency_penalty * count
    return x


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log p = x - log(sum(exp(x))), shifted by the largest value first."""
    shifted = x - np.max(x)
    return shifted - np.log(np.sum(np.exp(shifted)))


def _temperature(x: np.ndarray, temperature: float) -> tuple[np.ndarray, bool]:
    """(x - max) / T: softmax(x / T) with the largest at 0, so that no small T overflows."""
    return (x - np.max(x)) / temperature, False


def _top_k(x: np.ndarray, k: int, ties: str) -> tuple[np.ndarray, bool]:
    if k <= 0 or k >= x.size:
        return x, False
    order = np.argsort(-x, kind="stable")
    keep = x >= x[order[k - 1]] if ties == "kept" else np.isin(np.arange(x.size), order[:k])
    return np.where(keep, x, -np.inf), False


def _top_p(x: np.ndarray, p: float, margin: float) -> tuple[np.ndarray, bool]:
    """Keep each token whose more likely tokens hold less than p: the smallest set reaching p, crossing token kept."""
    if p >= 1.0:
        return x, False
    order = np.argsort(-x, kind="stable")
    probs = np.exp(log_softmax(x[order]))
    before = np.cumsum(probs) - probs
    keep = np.zeros(x.size, bool)
    keep[order[before < p]] = True
    borderline = bool(np.any(np.abs(before[probs > 0] - p) <= margin))
    return np.where(keep, x, -np.inf), borderline


def _min_p(x: np.ndarray, min_p: float, margin: float) -> tuple[np.ndarray, bool]:
    """Keep tokens at least min_p times as likely as the most likely one."""
    if min_p <= 0:
        return x, False
    logp = log_softmax(x)
    threshold = np.max(logp) + np.log(min_p)
    finite = np.isfinite(logp)
    borderline = bool(np.any(np.abs(logp[finite] - threshold) <= margin))
    return np.where(logp >= threshold, x, -np.inf), borderline


def reference_distribution(
    semantics: str | Semantics,
    logits: np.ndarray,
    params: SamplerParams,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    margin: float = 1e-6,
) -> ReferenceDistribution:
    """The distribution ``semantics`` draws the next token from, for logits [V] (finite or -inf, one finite)."""
    semantics = get_semantics(semantics)
    x = penalized_logits(semantics, logits, params, prompt, output)
    penalized = x.copy()
    temperature = params.temperature
    if 0 < temperature < semantics.temperature_floor:
        temperature = semantics.temperature_floor
    if temperature == 0:
        point = np.zeros(x.size)
        point[int(np.argmax(x))] = 1.0
        return ReferenceDistribution(point, penalized, False)
    steps = {
        "temperature": lambda x: _temperature(x, temperature),
        "top_k": lambda x: _top_k(x, params.top_k, semantics.top_k_ties),
        "top_p": lambda x: _top_p(x, params.top_p, margin),
        "min_p": lambda x: _min_p(x, params.min_p, margin),
    }
    borderline = False
    for step in semantics.order:
        x, near = steps[step](x)
        borderline |= near
    return ReferenceDistribution(np.exp(log_softmax(x)), penalized, borderline)
