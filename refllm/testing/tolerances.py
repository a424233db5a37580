"""Named tolerance profiles: how close a backend's outputs must be to the reference.

A backend is compared with refllm's float32 spec. How far apart two correct
implementations may drift depends on the arithmetic the backend runs, so
each profile is named after it and carries the reasoning for its numbers.

Logits pass when, elementwise, ``|actual - expected| <= atol + rtol * |expected|``.
Hidden states are compared with the same rule after dividing both by the
reference's largest magnitude, since their scale varies by architecture
(Gemma multiplies embeddings by sqrt(D)). ``top_n`` is the near-tie rule of
greedy comparison: two backends may pick different tokens at a step only if
each one's token is among the other's ``top_n`` most likely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refllm.errors import RefllmKeyError


class UnknownProfileError(RefllmKeyError):
    """A tolerance profile name that is not in PROFILES."""


@dataclass(frozen=True)
class Tolerance:
    name: str
    atol: float
    rtol: float
    top_n: int
    reason: str

    def excess(self, actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
        """How far each element is past its allowance: <= 0 where it passes (same shapes in and out)."""
        actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        return np.abs(actual - expected) - (self.atol + self.rtol * np.abs(expected))

    def close(self, actual: np.ndarray, expected: np.ndarray) -> bool:
        return np.shape(actual) == np.shape(expected) and bool(np.all(self.excess(actual, expected) <= 0))

    def close_scaled(self, actual: np.ndarray, expected: np.ndarray) -> bool:
        """``close`` on both arrays divided by the largest |expected| (hidden states of any scale)."""
        scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
        return self.close(np.asarray(actual) / scale, np.asarray(expected) / scale)


PROFILES: dict[str, Tolerance] = {
    p.name: p
    for p in [
        Tolerance(
            "float32", atol=1e-4, rtol=1e-4, top_n=2,
            reason="float32 rounds at 6e-8; a different summation order (blocked attention, fused or "
            "batched matmuls) moves tiny-model logits by 1e-6 to 1e-5, so 1e-4 leaves a tenfold margin, "
            "while the bugs that matter (a RoPE base, an epsilon, a mask edge) move them by 1e-3 or more. "
            "Greedy tokens may differ only at an exact-to-1e-4 tie, so the runner-up suffices.",
        ),
        Tolerance(
            "float16", atol=2e-2, rtol=1e-2, top_n=3,
            reason="float16 keeps 11 significant bits (rounding 4.9e-4); weights and activations rounded "
            "at every matmul input compound over the layers to about 0.5% of a logit, so 1e-2 relative "
            "plus 2e-2 absolute for logits near zero. Near-ties within that band reorder the top three.",
        ),
        Tolerance(
            "bfloat16", atol=1e-1, rtol=5e-2, top_n=5,
            reason="bfloat16 keeps 8 significant bits (rounding 3.9e-3, eight times float16's), so the "
            "float16 allowance grows eightfold to 5e-2 relative and 1e-1 absolute; greedy comparison "
            "uses the top five, as vLLM's bfloat16 model tests do.",
        ),
        Tolerance(
            "int8", atol=1e-1, rtol=5e-2, top_n=5,
            reason="8-bit block quantization (Q8_0: one scale per 32 weights) rounds each weight by at "
            "most half a step, 1/254 of its block's largest magnitude: about bfloat16's relative error, "
            "so bfloat16's numbers.",
        ),
        Tolerance(
            "q4", atol=5e-1, rtol=2e-1, top_n=10,
            reason="4-bit block quantization (Q4_0, Q4_K) has 16 levels, a rounding error of 3% to 7% of "
            "each block's range; logits drift by tenths and greedy paths fork at any near-tie, so only "
            "the top ten is a meaningful agreement.",
        ),
    ]
}  # fmt: skip


def get_profile(profile: str | Tolerance) -> Tolerance:
    """A Tolerance from its name (or itself)."""
    if isinstance(profile, Tolerance):
        return profile
    if profile not in PROFILES:
        raise UnknownProfileError(f"unknown tolerance profile {profile!r}; known: {', '.join(PROFILES)}")
    return PROFILES[profile]
