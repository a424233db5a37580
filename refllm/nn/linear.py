"""A dense projection, the way checkpoints store it: y = x W^T + b."""

from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x: [..., in], weight: [out, in], bias: [out] -> [..., out]."""
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    return y
