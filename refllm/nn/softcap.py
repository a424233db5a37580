"""Soft-capping: a smooth clamp of scores into (-cap, cap).

    soft_cap(x) = cap * tanh(x / cap)

Near zero it is the identity (tanh(u) ~ u), far out it flattens at +-cap, so no
score or logit can run away. Attention scores are capped after scaling, before
the causal mask, so the mask's -inf stays -inf (a capped -inf would be -cap and
let masked keys back in); final logits may be capped too.
"""

from __future__ import annotations

import numpy as np


def soft_cap(x: np.ndarray, cap: float) -> np.ndarray:
    """x: any shape -> same shape, each value squashed into (-cap, cap)."""
    return cap * np.tanh(x / cap)
