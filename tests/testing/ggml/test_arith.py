"""The float32 steps of the ggml spec: a fused multiply-add rounded once, and the 8-lane sum's order."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from refllm.testing.ggml.arith import fma32, hsum8

# no subnormals: a library loaded in the same process may flush them to zero, and the kernels never meet them
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False, min_value=-2.0**50,
                     max_value=2.0**50)  # fmt: skip


def _nearest_float32(exact: Fraction) -> np.float32:
    """The float32 nearest ``exact``, ties to even, found among the neighbours of its float64 rounding."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.array(c).view(np.uint32)) & 1))


@given(finite32, finite32, finite32)
def test_fma32_rounds_the_exact_result_once(a, b, c):
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    assert fma32(np.float32(a), np.float32(b), np.float32(c)) == _nearest_float32(exact)


def test_fma32_is_not_a_multiply_then_an_add():
    a = b = np.float32(1 + 2**-12)  # a * b = 1 + 2**-11 + 2**-24, a tie float32 rounds to 1 + 2**-11
    c = np.float32(-(1 + 2**-11))
    assert fma32(a, b, c) == np.float32(2.0**-24)
    assert np.float32(a * b) + c == 0


def test_hsum8_adds_the_halves_then_the_pairs():
    lanes = np.array([1e8, 1, -1e8, 1, 1, 1, 1, 1], np.float32)
    quads = lanes[4:] + lanes[:4]  # 1e8 + 1, 2, -1e8 + 1, 2 in float32
    assert hsum8(lanes) == (quads[0] + quads[2]) + (quads[1] + quads[3])
    assert hsum8(lanes) != np.float32(sum(float(x) for x in lanes))
