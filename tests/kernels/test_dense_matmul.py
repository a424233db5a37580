"""The float32 projection kernel against its NumPy twin, ``x @ W.T`` (refllm.nn.linear.linear).

Each example draws a weight matrix and tokens whose counts cross the kernel's
tiles (4 rows; 4 or 1 tokens), lanes (16 columns) and chunk (64 tokens)
boundaries, and checks the result against the product in float64 within the
float32 summation-order bound
``2 (C + 2) u sum_i |x_i w_i|`` per output (u = 2^-24), the same bound the
quantized kernels meet. A token's result must not depend on the other tokens
it is multiplied with, bit for bit: a decode step equals the same token in a
batch or in a prompt chunk.
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels import dense_matmul as module
from refllm.kernels.dense_matmul import TOKEN_CHUNK, dense_matmul
from refllm.kernels.dense_matmul import linear as linear_kernel
from tests.helpers.rounding import assert_within_summation_bound

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def products(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    rows = draw(st.integers(1, 70))
    cols = draw(st.sampled_from([1, 3, 16, 17, 64, 100]))
    tokens = draw(st.integers(1, 12) | st.integers(TOKEN_CHUNK - 2, TOKEN_CHUNK + 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))  # extreme magnitudes, no overflow
    weights = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    return x, weights


@SETTINGS
@given(products())
def test_kernel_equals_the_product_within_float32_summation_rounding(product):
    x, weights = product
    assert_within_summation_bound(dense_matmul(x, weights), x, weights)


@SETTINGS
@given(products(), st.data())
def test_a_tokens_result_does_not_depend_on_the_tokens_around_it(product, data):
    x, weights = product
    together = dense_matmul(x, weights)
    t = data.draw(st.integers(0, len(x) - 1))
    first = data.draw(st.integers(0, t))
    np.testing.assert_array_equal(dense_matmul(x[t : t + 1], weights)[0], together[t])
    np.testing.assert_array_equal(dense_matmul(x[first:], weights)[t - first], together[t])


def test_linear_runs_a_float32_matrix_through_the_kernel_with_any_leading_shape_and_a_bias():
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((10, 24)).astype(np.float32)
    bias = rng.standard_normal(10).astype(np.float32)
    x = rng.standard_normal((2, 3, 24)).astype(np.float32)
    out = linear_kernel(x, weights, bias)
    assert out.shape == (2, 3, 10)
    np.testing.assert_array_equal(out, dense_matmul(x.reshape(6, 24), weights).reshape(2, 3, 10) + bias)
    assert_within_summation_bound(out.reshape(6, 10) - bias, x.reshape(6, 24), weights)


@pytest.mark.parametrize("tile", ["_tile_4x1", "_tile_4x4", "_tile_1x1"])
def test_the_tiles_multiply_add_16_lane_vectors(tile):
    """The optimised LLVM IR of each tile multiplies and adds <16 x float> vectors."""
    kernel = numba.njit(getattr(module, tile).py_func)  # uncached: cached code hides its IR
    kernel(np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32), 0, 0, np.zeros((4, 4), np.float32))
    assert re.search(r"call [^(]*@llvm\.fmuladd\.v16f32\(<16 x float>", kernel.inspect_llvm(kernel.signatures[0]))
