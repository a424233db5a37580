"""Bounds on float32 rounding that the kernels' results are held to, against float64 products."""

from __future__ import annotations

import numpy as np

UNIT_ROUNDOFF = 2.0**-24


def assert_within_summation_bound(actual: np.ndarray, x: np.ndarray, weights: np.ndarray) -> None:
    """``actual`` is ``x @ weights.T`` in float32 within ``2 (C + 2) u sum_i |x_i w_i|`` per output."""
    expected = x.astype(np.float64) @ weights.T.astype(np.float64)
    bound = 2 * (x.shape[1] + 2) * UNIT_ROUNDOFF * (np.abs(x).astype(np.float64) @ np.abs(weights).T.astype(np.float64))
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    assert np.all(np.abs(actual.astype(np.float64) - expected) <= bound), np.max(np.abs(actual - expected) - bound)
