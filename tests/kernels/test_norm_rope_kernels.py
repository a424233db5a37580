"""The RMSNorm and RoPE kernels and the RoPE table against their NumPy twins (refllm.nn.norm, refllm.nn.rope).

Shapes cross the ones the forward pass uses ([B, T, D] hidden states, [B, T, H, E]
per-head queries and keys, partial rotary dimensions), values span extreme
magnitudes. RoPE is the spec bit for bit; RMSNorm sums its squares in float64
where NumPy sums float32 pairwise, so it agrees to 4 float32 ulps (2^-21 relative).
The table's cos/sin are the spec's own numbers, for positions across the sizes it
grows by and past a dynamic NTK model's max_position_embeddings.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels.norm import rms_norm as rms_norm_kernel
from refllm.kernels.rope import RopeTable
from refllm.kernels.rope import apply_rope as apply_rope_kernel
from refllm.nn.norm import rms_norm
from refllm.nn.rope import apply_rope, rope_cos_sin
from refllm.rope_parameters import ROPE_TYPES, RopeParameters

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    width=st.integers(1, 700),
    scale=st.sampled_from([1e-15, 1e-3, 1.0, 1e3, 1e15]),  # the spec's float32 sum of squares stays finite
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    offset=st.sampled_from([0.0, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_rms_norm_kernel_equals_the_spec_within_4_ulps(shape, width, scale, eps, offset, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((*shape, width)) * scale).astype(np.float32)
    weight = rng.standard_normal(width).astype(np.float32)
    expected = rms_norm(x, weight, eps, offset)
    actual = rms_norm_kernel(x, weight, eps, offset)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=2.0**-21, atol=0)


@SETTINGS
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 9),
    heads=st.integers(1, 5),
    half_rotary=st.integers(1, 40),
    passed=st.sampled_from([0, 0, 1, 16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_rope_kernel_is_the_spec_bit_for_bit(batch, tokens, heads, half_rotary, passed, seed):
    rng = np.random.default_rng(seed)
    rotary = 2 * half_rotary
    x = rng.standard_normal((batch, tokens, heads, rotary + passed)).astype(np.float32)
    angles = rng.uniform(0, 1000, (batch, tokens, half_rotary))
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    np.testing.assert_array_equal(apply_rope_kernel(x, cos, sin), apply_rope(x, cos, sin))


@SETTINGS
@given(
    rope_type=st.sampled_from(ROPE_TYPES),
    theta=st.sampled_from([10_000.0, 500_000.0, 1_000_000.0]),
    head_dim=st.sampled_from([8, 12, 64]),
    partial=st.sampled_from([1.0, 0.5]),
    dtype=st.sampled_from([np.float32, np.float64]),
    steps=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 40)), min_size=1, max_size=5),
    start=st.integers(0, 600),
)
def test_the_rope_table_holds_the_specs_cos_and_sin(rope_type, theta, head_dim, partial, dtype, steps, start):
    """Steps of several rows at positions that cross 256 (the table's first size) and 16 (where a dynamic
    NTK base starts to grow): each lookup gives what the spec computes for those positions."""
    params = RopeParameters(
        theta=theta, rope_type=rope_type, partial_rotary_factor=partial, factor=4.0,
        original_max_position_embeddings=16,
    )  # fmt: skip
    table = RopeTable(params, head_dim, 16, dtype)
    for rows, tokens in steps:
        positions = start + np.arange(tokens) + np.arange(rows)[:, None] * 7  # [B, T]
        for looked_up, computed in zip(table.lookup(positions), rope_cos_sin(params, head_dim, 16, positions, dtype)):
            assert looked_up.dtype == dtype
            np.testing.assert_array_equal(looked_up, computed)
        start += tokens
