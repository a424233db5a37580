"""The gated-activation kernel against its NumPy twin, ``refllm.nn.mlp.gated``.

The kernel computes act(g) up as g sigmoid(k) up (k = g for SiLU, 2 z for GELU-tanh)
with e = exp(-|k|) from a polynomial good to 2e-7 relative (about 2 ulps). Its error
against the exact value: e's 2 ulps reach sigmoid at most as they are (d sigmoid / sigmoid
<= de / e), and the divide and the two products round once each, so under 6 ulps;
the spec's exp and divide (or tanh, add and products) are within 2 more. Hence
8 float32 ulps of the spec's value, and two absolute terms where ulps say nothing:

- |k| > 87: the polynomial stops at exp(-87) = 1.6e-38 where the spec's sigmoid goes
  on to 0, so the output may be off by |g up| 2^-125;
- GELU-tanh: the spec rounds tanh(z) to float32 before adding 1; next to tanh = -1 its
  ulp is 2^-24, which 1 + tanh(z) keeps as an absolute error, times 0.5 |g up|.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels.activation import gated as gated_kernel
from refllm.nn.mlp import gated

SETTINGS = settings(max_examples=80, deadline=None)


def assert_within_derived_bound(actual: np.ndarray, expected: np.ndarray, gate, up, activation: str) -> None:
    size = np.abs(gate.astype(np.float64) * up)
    bound = 8 * np.spacing(np.abs(expected)).astype(np.float64) + size * 2.0**-125
    if activation == "gelu_pytorch_tanh":
        bound += size * 2.0**-24
    excess = np.abs(actual.astype(np.float64) - expected) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, f"gate {gate[worst]!r} up {up[worst]!r}: {actual[worst]!r}, spec {expected[worst]!r}"


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),  # odd sizes, several rows
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 10.0, 1e3, 1e12]),  # tiny, ordinary, saturated, overflowing exp
    activation=st.sampled_from(["silu", "gelu_pytorch_tanh"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_gated_kernel_equals_the_spec_within_the_derived_bound(shape, scale, activation, seed):
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal(shape) * scale).astype(np.float32)
    up = rng.standard_normal(shape).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # the spec's own GELU cubes overflow at 1e12
        expected = gated(gate, up, activation)
    actual = gated_kernel(gate, up, activation)
    assert actual.dtype == np.float32 and actual.shape == shape
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite)
    assert_within_derived_bound(actual[finite], expected[finite], gate[finite], up[finite], activation)


def test_special_values_follow_the_spec():
    gate = np.array([0.0, -0.0, 1e-45, -88.0, 88.0, -1e30, 1e30], np.float32)
    up = np.ones_like(gate)
    for activation in ("silu", "gelu_pytorch_tanh"):
        with np.errstate(over="ignore", invalid="ignore"):
            expected = gated(gate, up, activation)
        actual = gated_kernel(gate, up, activation)
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(actual[~finite], expected[~finite])
        assert_within_derived_bound(actual[finite], expected[finite], gate[finite], up[finite], activation)


def test_an_unknown_activation_is_refused_by_name():
    with pytest.raises(ValueError, match="'relu'"):
        gated_kernel(np.ones(3, np.float32), np.ones(3, np.float32), "relu")
