"""RMSNorm in one pass per row: the forward pass's norms without NumPy's per-call overhead.

NumPy twin: ``refllm.nn.norm.rms_norm`` (tests/kernels/test_norm_rope_kernels.py).

    rms_norm(x) = x / sqrt(mean(x^2) + eps) * (offset + w)

A decode step normalises one 576-wide row some 60 times; NumPy spends about
8 us on each in seven calls (square, mean, add, sqrt, divide, add, multiply),
this kernel about 1. The same float32 operations in the same order, except the
mean of squares, which sums in float64 (NumPy sums float32 pairwise): outputs
agree with the spec's to a few float32 ulps.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _rms_norm_rows(x: np.ndarray, weight: np.ndarray, eps: np.float32, offset: np.float32) -> np.ndarray:
    """x [N, D] float32, weight [D] -> [N, D]."""
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        total = 0.0
        for i in range(x.shape[1]):
            total += np.float64(x[r, i]) * np.float64(x[r, i])
        root = np.sqrt(np.float32(total / x.shape[1]) + eps)
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] / root * (offset + weight[i])
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """x: [..., N] float32, weight: [N] -> [..., N], as ``refllm.nn.norm.rms_norm``."""
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    weight = np.asarray(weight, dtype=np.float32)
    return _rms_norm_rows(rows, weight, np.float32(eps), np.float32(offset)).reshape(x.shape)
