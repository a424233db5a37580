"""float32 arithmetic as the x86 kernels do it, in NumPy: a fused multiply-add (one rounding), and the fixed
order in which an 8-lane register is summed.

``fma32(a, b, c)`` is ``vfmadd``: a * b + c rounded once to float32. NumPy has no fused multiply-add, so it is
built from float64: the product of two float32 is exact there, the sum is rounded to odd (the nearest float64
with an odd last bit when the sum is inexact), and rounding that to float32 is then the correctly rounded
result, because float64 has more than 24 + 1 bits.
"""

from __future__ import annotations

import numpy as np


def fma32(a, b, c) -> np.ndarray:
    """a * b + c with one rounding to float32 (arrays broadcast)."""
    product = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    return add_rounded_once(product, np.asarray(c, np.float32).astype(np.float64))


def add_rounded_once(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c (float64, each exact) rounded once to float32, through a sum rounded to odd."""
    total = p + c
    virtual = total - p
    error = (p - (total - virtual)) + (c - virtual)  # TwoSum: p + c == total + error exactly
    even = (np.asarray(total).view(np.int64) & 1) == 0
    toward = np.where(error > 0, np.inf, -np.inf)
    total = np.where((error != 0) & even, np.nextafter(total, toward), total)
    return total.astype(np.float32)


def hsum8(lanes: np.ndarray) -> np.ndarray:
    """ggml's ``hsum_float_8`` of [..., 8] float32: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))."""
    lanes = np.asarray(lanes, np.float32)
    quad = lanes[..., 4:] + lanes[..., :4]
    pair = quad[..., :2] + quad[..., 2:]
    return pair[..., 0] + pair[..., 1]
