"""Integer arithmetic the kernels share."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for a >= 0, b > 0: how many parts of b items hold a items."""
    return (a + b - 1) // b
