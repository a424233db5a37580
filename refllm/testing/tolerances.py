"""Named tolerance profiles: how close a backend's outputs must be to the reference.

A backend is compared with refllm's float32 spec. How far apart two correct
implementations may drift depends on the arithmetic the backend runs, so
each profile is named after it, and its allowance is measured, not guessed:
``benchmarks/calibrate_profiles.py`` runs each arithmetic against float64
truth on tiny models of every architecture (weights from near-uniform to
peaked logits) and records the error per position.

Errors are relative to the **spread** of the expected logits (their standard
deviation over the vocabulary), since that is what decides which token wins:
a row passes when ``max |actual - expected| <= spread_tol * std(expected)``.
An absolute or ``|x|``-relative allowance lets every bug through on a model
whose logits are close together. Hidden states are compared the same way (the
spread over the hidden dims). ``top_n`` is the near-tie rule of greedy
comparison: two backends may pick different tokens at a step only if each
one's token is among the other's ``top_n`` most likely.

Rounding error grows with the position (more keys to attend over, more
rounded steps behind each one): a profile with ``growth_positions`` P allows
``spread_tol * sqrt(1 + t / P)`` of the spread at position t, calibrated on the
kit's own draws up to its longest ``long_horizon`` sequence (320 positions).

That growth is calibrated on the worst model drawn (weights of std 1, where
attention scores reach the hundreds; routers whose rounded scores pick
another expert), so it would let through bugs that stay inside it on the
models where a low-precision engine's error is small. A drawn model's
conditioning is known: its architecture and weight std. ``for_checkpoint``
narrows a low-precision profile to the allowance measured on the kit's draws
of that model (``CONDITIONING_FILE``, written by ``calibrate_profiles.py
--conditioning``), ``CONDITIONING_MARGIN`` times the worst error of an engine
emulating the precision; a model outside the table (a real checkpoint) keeps
the profile's own, the worst case.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from refllm.errors import InvalidInputError, RefllmKeyError


CONDITIONING_FILE = Path(__file__).with_name("conditioning.json")
CONDITIONING_MARGIN = 3.0  # on the worst error measured by drawn model, in place of 2 on the worst model of all


class UnknownProfileError(RefllmKeyError):
    """A tolerance profile name that is not in PROFILES."""


def drawn_model(checkpoint) -> str | None:
    """What decides a drawn model's conditioning: "<model_type> std <weight std>", and for a mixture of
    experts how its routers were drawn ("... random router", or tied: ROUTERS); None if not drawn."""
    std = checkpoint.weight_options.get("std")
    if std is None:
        return None
    routers = f" {checkpoint.weight_options.get('router', 'random')} router" if checkpoint.config.experts else ""
    return f"{(checkpoint.config_json or {}).get('model_type')} std {std:g}{routers}"


def spread(expected: np.ndarray) -> np.ndarray:
    """std over the last axis, [..., 1]; never below float32 rounding of the row's largest value."""
    expected = np.asarray(expected, np.float64)
    floor = np.finfo(np.float32).eps * np.max(np.abs(expected), axis=-1, keepdims=True)
    return np.maximum(np.std(expected, axis=-1, keepdims=True), np.maximum(floor, 1e-30))


@dataclass(frozen=True)
class Tolerance:
    name: str
    spread_tol: float  # allowed max |Δ| per row, as a fraction of the expected row's std
    top_n: int
    reason: str
    growth_positions: int | None = None  # the allowance grows as sqrt(1 + position / this); None: flat

    def growth(self, positions=0) -> np.ndarray:
        """The factor on spread_tol at ``positions`` (an int, or an array of the rows' positions)."""
        positions = np.asarray(positions, np.float64)
        if np.any(positions < 0):
            raise InvalidInputError(f"positions must be >= 0; got {positions.min():g}")
        if self.growth_positions is None:
            return np.ones_like(positions)
        return np.sqrt(1 + positions / self.growth_positions)

    def allowance(self, expected: np.ndarray, positions=0) -> np.ndarray:
        """The allowed |Δ| of each row, [..., 1]; ``positions``: each row's position (broadcast), 0 unless given."""
        return self.spread_tol * self.growth(positions)[..., None] * spread(expected)

    def excess(self, actual: np.ndarray, expected: np.ndarray, positions=0) -> np.ndarray:
        """How far each element is past its row's allowance: <= 0 where it passes (same shapes in and out)."""
        actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        return np.abs(actual - expected) - self.allowance(expected, positions)

    def close(self, actual: np.ndarray, expected: np.ndarray, positions=0) -> bool:
        return np.shape(actual) == np.shape(expected) and bool(np.all(self.excess(actual, expected, positions) <= 0))

    def for_checkpoint(self, checkpoint) -> Tolerance:
        """This profile at the allowance measured on the kit's draws of ``checkpoint``'s model
        (``drawn_model``); itself for any other checkpoint, and for a profile not in PROFILES."""
        model = drawn_model(checkpoint)
        measured = CONDITIONED.get(self.name, {}).get(model)
        if self != PROFILES.get(self.name) or measured is None:
            return self
        return replace(self, spread_tol=measured, reason=f"measured on the kit's {model} draws ({CONDITIONING_FILE.name})")

    def describe(self) -> str:
        if self.growth_positions is None:
            return f"{self.spread_tol:g} x the row's spread"
        return f"{self.spread_tol:g} x sqrt(1 + position / {self.growth_positions}) x the row's spread"


PROFILES: dict[str, Tolerance] = {
    p.name: p
    for p in [
        Tolerance(
            "float32", spread_tol=2e-4, top_n=2,
            reason="measured float32 error against float64 truth (spec ops, and fast ops over the paged arena): "
            "median 5e-7, 99.9th percentile 1.3e-5, worst 2.9e-5 of the spread; 2e-4 leaves a sevenfold "
            "margin for another summation order, while the bugs that matter move logits by 1e-3 of the "
            "spread or more. Greedy tokens may differ only at an exact tie, so the runner-up suffices.",
        ),
        Tolerance(
            "float16", spread_tol=1.6, growth_positions=64, top_n=3,
            reason="an engine rounding weights and activations to float16 (11 bits): worst 4.9e-2 of the spread "
            "over 24 positions; on 1000 of the kit's long_horizon draws (up to 320 positions), float16 logits "
            "reach 2.5e-3 and a float16 KV cache 1.4 (p99.9 0.15), worst 0.80 x sqrt(1 + t / 64) at position 120 "
            "(weights of std 1: attention scores in the hundreds); 1.6 is a twofold margin over that. Near-ties within "
            "that band reorder the top three.",
        ),
        Tolerance(
            "bfloat16", spread_tol=4.5, growth_positions=64, top_n=5,
            reason="an engine holding weights, activations and the residual stream in bfloat16 (8 bits), sums "
            "in float32: on 1000 of the kit's long_horizon draws (up to 320 positions) p99.9 0.98 of the "
            "spread before position 32 and 2.0 past 256, worst 3.9, that is 2.2 x sqrt(1 + t / 64) at "
            "position 138 (weights of std 1, and routers that pick another expert); 4.5 is a twofold margin. "
            "Greedy comparison uses the top five, as vLLM's bfloat16 tests do.",
        ),
        Tolerance(
            "int8", spread_tol=6.0, growth_positions=64, top_n=5,
            reason="projections' weights in 8-bit absmax blocks (Q8_0): worst 1.5 of the spread over 24 "
            "positions; their inputs quantized the same way, on 1000 of the kit's long_horizon draws (up to 320 "
            "positions): p99.9 1.4 to 2.7, worst 4.8, that is 2.85 x sqrt(1 + t / 64) at position 116 (weights "
            "of std 1, and routers that pick another expert); 6 is a 2.1-fold margin.",
        ),
        Tolerance(
            "q4", spread_tol=8.0, top_n=10,
            reason="projection weights in 4-bit blocks (Q4_0's 16 levels): median 0.49, 99.9th percentile 4.1, "
            "worst 5.3 of the spread; 8 is a 1.5-fold margin. On tiny models 4-bit weights move logits by "
            "more than their spread, so this profile catches only gross bugs there; check 4-bit backends "
            "on real weights (golden files, KL divergence) instead. Only the top ten is a meaningful "
            "greedy agreement.",
        ),
    ]
}  # fmt: skip


CONDITIONED: dict[str, dict[str, float]] = json.loads(CONDITIONING_FILE.read_text())["allowances"]
# profile name -> {drawn_model(checkpoint): spread_tol}


def get_profile(profile: str | Tolerance) -> Tolerance:
    """A Tolerance from its name (or itself)."""
    if isinstance(profile, Tolerance):
        return profile
    if profile not in PROFILES:
        raise UnknownProfileError(f"unknown tolerance profile {profile!r}; known: {', '.join(PROFILES)}")
    return PROFILES[profile]
