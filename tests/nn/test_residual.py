"""How sublayers join the residual stream (refllm.nn.residual): placements, Granite's scale, Cohere's parallel layer."""

from __future__ import annotations

import numpy as np

from refllm.nn.residual import parallel_residual_block, residual_block

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 3, 4))
W1, W2 = RNG.normal(size=(4, 4)), RNG.normal(size=(4, 4))


def f(h):
    return np.tanh(h @ W1)


def g(h):
    return np.sin(h @ W2)


def norm(h):
    return h / np.linalg.norm(h, axis=-1, keepdims=True)


def test_each_placement_puts_its_norms_where_it_says():
    np.testing.assert_array_equal(residual_block(X, f, norm, None), X + f(norm(X)))  # pre-norm
    np.testing.assert_array_equal(residual_block(X, f, norm, np.cos), X + np.cos(f(norm(X))))  # sandwich
    np.testing.assert_array_equal(residual_block(X, f, None, norm), X + norm(f(X)))  # post-norm


def test_a_scale_multiplies_the_sublayers_output_before_the_add():
    np.testing.assert_array_equal(residual_block(X, f, norm, None, scale=0.25), X + f(norm(X)) * 0.25)


def test_a_parallel_layer_feeds_one_normed_copy_to_both_sublayers_and_adds_both():
    np.testing.assert_array_equal(parallel_residual_block(X, [f, g], norm), X + f(norm(X)) + g(norm(X)))
