"""The Numba paged-attention kernels against their NumPy twin, refllm.nn.attention.attention.

Each example lays random keys and values into blocks in a random order, then
checks the kernel, which reads through the block tables, against the spec on
the same keys gathered into one contiguous array.

The spec runs on those float32 numbers in float64 arithmetic: that is the
value the spec's formula defines, free of its own float32 rounding. Run in
float32, the spec itself strays past rtol 1e-5 / atol 1e-6 where the softmax
average cancels (outputs near zero from values near one), so a comparison
with it would measure the spec's rounding, not the kernel's.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels.attention import DECODE_PARTITION_KEYS, paged_decode_attention, paged_prefill_attention, write_kv
from refllm.kernels.exp import exp_nonpositive
from refllm.kv import CacheConfig, CacheShape, PagedKVArena
from refllm.nn.attention import attention
from tests.helpers.paged_attention import ATOL, RTOL, attention_shapes, blocked, kernel_scalars

SETTINGS = settings(max_examples=40, deadline=None)


def spec(q, keys, values, positions, scale, window, softcap) -> np.ndarray:
    """refllm.nn.attention.attention on the same float32 inputs, computed in float64."""
    f64 = np.float64
    return attention(q.astype(f64), keys.astype(f64), values.astype(f64), positions, scale, window, softcap)


@SETTINGS
@given(shape=attention_shapes(), lengths=st.lists(st.integers(1, 300), min_size=1, max_size=4))
def test_decode_kernel_matches_spec(shape: dict, lengths: list[int]) -> None:
    rng = np.random.default_rng(shape["seed"])
    key_cache, value_cache, tables, keys, values = blocked(rng, lengths, shape)
    q = rng.standard_normal((len(lengths), shape["num_heads"], shape["head_dim"]), dtype=np.float32)
    scale, window, softcap = kernel_scalars(shape)

    out = paged_decode_attention(q, key_cache, value_cache, tables, np.array(lengths, np.int64), scale, window, softcap)

    for b, length in enumerate(lengths):
        position = np.array([length - 1])
        expected = spec(q[b][None], keys[b], values[b], position, scale, shape["window"], shape["softcap"])
        np.testing.assert_allclose(out[b], expected[0], rtol=RTOL, atol=ATOL)


@settings(max_examples=10, deadline=None)
@given(shape=attention_shapes(), length=st.integers(DECODE_PARTITION_KEYS, 3 * DECODE_PARTITION_KEYS + 5))
def test_decode_kernel_merges_key_partitions(shape: dict, length: int) -> None:
    rng = np.random.default_rng(shape["seed"])
    key_cache, value_cache, tables, keys, values = blocked(rng, [length], shape)
    q = rng.standard_normal((1, shape["num_heads"], shape["head_dim"]), dtype=np.float32)
    scale, _, softcap = kernel_scalars(shape)

    out = paged_decode_attention(q, key_cache, value_cache, tables, np.array([length], np.int64), scale, 0, softcap)

    expected = spec(q, keys[0], values[0], np.array([length - 1]), scale, None, shape["softcap"])
    np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)


@SETTINGS
@given(
    shape=attention_shapes(),
    prefix_lens=st.lists(st.integers(0, 150), min_size=1, max_size=3),
    num_tokens=st.integers(2, 40),
)
def test_prefill_kernel_matches_spec(shape: dict, prefix_lens: list[int], num_tokens: int) -> None:
    rng = np.random.default_rng(shape["seed"])
    lengths = [prefix + num_tokens for prefix in prefix_lens]
    key_cache, value_cache, tables, keys, values = blocked(rng, lengths, shape)
    q = rng.standard_normal((len(lengths), num_tokens, shape["num_heads"], shape["head_dim"]), dtype=np.float32)
    scale, window, softcap = kernel_scalars(shape)

    out = paged_prefill_attention(
        q, key_cache, value_cache, tables, np.array(prefix_lens, np.int64), scale, window, softcap
    )

    for b, prefix in enumerate(prefix_lens):
        positions = prefix + np.arange(num_tokens)
        expected = spec(q[b], keys[b], values[b], positions, scale, shape["window"], shape["softcap"])
        np.testing.assert_allclose(out[b], expected, rtol=RTOL, atol=ATOL)


@SETTINGS
@given(
    block_size=st.integers(1, 8),
    num_tokens=st.integers(1, 12),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_write_kernel_matches_fancy_index_assignment(block_size: int, num_tokens: int, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_blocks, kv_heads, head_dim = 3 * batch * (num_tokens // block_size + 1), 2, 5
    key_cache = rng.standard_normal((num_blocks, block_size, kv_heads, head_dim), dtype=np.float32)
    value_cache = key_cache + 1
    slots = rng.permutation(num_blocks * block_size)[: batch * num_tokens].reshape(batch, num_tokens).astype(np.int64)
    k = rng.standard_normal((batch, num_tokens, kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((batch, num_tokens, kv_heads, head_dim), dtype=np.float32)
    expected_k, expected_v = key_cache.copy(), value_cache.copy()
    expected_k.reshape(-1, kv_heads, head_dim)[slots] = k
    expected_v.reshape(-1, kv_heads, head_dim)[slots] = v

    write_kv(key_cache, value_cache, slots, k, v)

    np.testing.assert_array_equal(key_cache, expected_k)
    np.testing.assert_array_equal(value_cache, expected_v)


def test_decode_output_does_not_depend_on_the_batch() -> None:
    shape = {"num_kv_heads": 2, "num_heads": 6, "head_dim": 24, "block_size": 16}
    rng = np.random.default_rng(7)
    lengths = [700, 3, 260]
    key_cache, value_cache, tables, _, _ = blocked(rng, lengths, shape)
    q = rng.standard_normal((3, 6, 24), dtype=np.float32)
    together = paged_decode_attention(q, key_cache, value_cache, tables, np.array(lengths, np.int64), 0.2, 0, 0.0)
    for b, length in enumerate(lengths):
        alone = paged_decode_attention(
            q[b : b + 1], key_cache, value_cache, tables[b : b + 1], np.array([length], np.int64), 0.2, 0, 0.0
        )
        np.testing.assert_array_equal(alone[0], together[b])


@SETTINGS
@given(
    shape=attention_shapes(),
    chunks=st.lists(st.integers(1, 30), min_size=1, max_size=5),
)
def test_arena_chunked_prefill_then_decode_matches_spec(shape: dict, chunks: list[int]) -> None:
    """The arena's write + attention over chunk splits and decode steps, for two sequences of different lengths."""
    rng = np.random.default_rng(shape["seed"])
    kv_heads, heads, head_dim = shape["num_kv_heads"], shape["num_heads"], shape["head_dim"]
    cache_shape = CacheShape(num_layers=1, num_kv_heads=kv_heads, head_dim=head_dim)
    arena = PagedKVArena(cache_shape, CacheConfig(block_size=shape["block_size"]), max_context=256)
    scale = kernel_scalars(shape)[0]
    keys = [np.zeros((0, kv_heads, head_dim), np.float32) for _ in range(2)]
    values = [np.zeros((0, kv_heads, head_dim), np.float32) for _ in range(2)]
    steps = [([0], chunks[0])] + [([0, 1], num_new) for num_new in [*chunks[1:], *chunks[:1], 1, 1]]
    for seq_ids, num_new in steps:  # sequence 0 starts a chunk ahead; then both go on together
        k = rng.standard_normal((len(seq_ids), num_new, kv_heads, head_dim), dtype=np.float32)
        v = rng.standard_normal(k.shape, dtype=np.float32)
        q = rng.standard_normal((len(seq_ids), num_new, heads, head_dim), dtype=np.float32)
        arena.reserve(seq_ids, num_new)
        arena.write(0, seq_ids, k, v)
        out = arena.attention(0, seq_ids, q, scale, shape["window"], shape["softcap"])
        for row, seq_id in enumerate(seq_ids):
            positions = len(keys[seq_id]) + np.arange(num_new)
            keys[seq_id] = np.concatenate([keys[seq_id], k[row]])
            values[seq_id] = np.concatenate([values[seq_id], v[row]])
            expected = spec(q[row], keys[seq_id], values[seq_id], positions, scale, shape["window"], shape["softcap"])
            np.testing.assert_allclose(out[row], expected, rtol=RTOL, atol=ATOL)
        arena.commit(seq_ids, num_new)


@settings(max_examples=200, deadline=None)
@given(x=st.floats(-200.0, 0.0, width=32))
def test_vector_exponential_is_within_float32_rounding(x: float) -> None:
    value = float(exp_nonpositive(np.float32(x)))
    exact = np.exp(np.float64(np.float32(x)))
    if x >= -87.0:
        assert abs(value - exact) <= 2e-7 * exact
    else:  # clamped to exp(-87): far below any weight beside the running maximum's exp(0) = 1
        assert value == float(exp_nonpositive(np.float32(-87.0))) < 2.0**-125


def test_vector_exponential_on_a_dense_grid() -> None:
    x = np.linspace(-87.0, 0.0, 1001, dtype=np.float32)
    values = np.array([exp_nonpositive(v) for v in x], np.float64)
    exact = np.exp(x.astype(np.float64))
    assert np.all(np.abs(values - exact) <= 2e-7 * exact)
