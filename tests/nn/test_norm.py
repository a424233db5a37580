"""LayerNorm without a bias (refllm.nn.norm.layer_norm): its equation, and what it does to a row."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.nn.norm import layer_norm


def test_layer_norm_follows_its_equation_row_by_row():
    rng = np.random.default_rng(0)
    x, weight, eps = rng.normal(3.0, 2.0, size=(2, 3, 5)), rng.normal(size=5), 1e-5
    expected = np.empty_like(x)
    for index in np.ndindex(x.shape[:-1]):
        row = x[index]
        mean = sum(row) / len(row)
        variance = sum((v - mean) ** 2 for v in row) / len(row)
        expected[index] = [(v - mean) / math.sqrt(variance + eps) * w for v, w in zip(row, weight)]
    np.testing.assert_allclose(layer_norm(x, weight, None, eps), expected, rtol=1e-13, atol=1e-13)


@settings(max_examples=40, deadline=None)
@given(width=st.integers(2, 64), shift=st.floats(-1e3, 1e3), scale=st.floats(1e-2, 1e2), seed=st.integers(0, 2**16))
def test_layer_norm_ignores_where_a_row_sits_and_how_wide_it_spreads(width, shift, scale, seed):
    """Unit weights give a row of mean 0 and variance 1 (less eps's share), whatever it was shifted and scaled by."""
    row = np.random.default_rng(seed).normal(size=(1, width))
    row = (row - row.mean()) / row.std()  # a spread of 1 to scale from: eps's share stays below 1e-7
    normed = layer_norm(row, np.ones(width), None, 1e-12)
    np.testing.assert_allclose(normed.mean(), 0.0, atol=1e-9)
    np.testing.assert_allclose(normed.var(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(layer_norm(row * scale + shift, np.ones(width), None, 1e-12), normed, atol=1e-6)


def test_a_weight_per_head_scales_each_head_of_queries_on_its_own():
    """Cohere's q/k norm: x [B, T, H, E] against weight [H, E] normalises each head over E with its own row."""
    rng = np.random.default_rng(1)
    q, weight = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(3, 4))
    out = layer_norm(q, weight, None, 1e-5)
    for head in range(3):
        np.testing.assert_allclose(out[:, :, head], layer_norm(q[:, :, head], weight[head], None, 1e-5), rtol=1e-15)
