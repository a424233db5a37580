"""Drawn attention shapes and keys and values scattered over paged blocks, for the attention kernels' property
tests (refllm/kernels/attention.py) against the spec (refllm/nn/attention.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

RTOL, ATOL = 1e-5, 1e-6  # a kernel against the spec computed in float64 from the same float32 inputs


@st.composite
def attention_shapes(draw: st.DrawFn) -> dict:
    num_kv_heads = draw(st.integers(1, 3))
    return {
        "num_kv_heads": num_kv_heads,
        "num_heads": num_kv_heads * draw(st.sampled_from([1, 2, 3, 4])),  # GQA ratios
        "head_dim": draw(st.sampled_from([1, 7, 24, 64])),
        "block_size": draw(st.integers(1, 64)),
        "window": draw(st.none() | st.integers(1, 40)),
        "softcap": draw(st.none() | st.sampled_from([1.0, 5.0, 30.0])),
        "scale_factor": draw(st.floats(0.5, 2.0)),  # times 1 / sqrt(E), as models scale
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def blocked(rng: np.random.Generator, lengths: list[int], shape: dict) -> tuple:
    """Random keys and values of each sequence, scattered over blocks in random order.

    -> key_cache/value_cache: [N, S, K, E], block_tables: [B, max blocks] int32,
    keys/values: per sequence [length, K, E] (the same numbers, contiguous).
    """
    size, kv_heads, head_dim = shape["block_size"], shape["num_kv_heads"], shape["head_dim"]
    blocks_per_seq = [-(-length // size) for length in lengths]
    num_blocks = sum(blocks_per_seq) + 2  # two blocks nobody owns
    key_cache = rng.standard_normal((num_blocks, size, kv_heads, head_dim), dtype=np.float32)
    value_cache = rng.standard_normal((num_blocks, size, kv_heads, head_dim), dtype=np.float32)
    order = rng.permutation(num_blocks).astype(np.int32)
    tables = np.zeros((len(lengths), max(blocks_per_seq)), np.int32)
    keys, values, used = [], [], 0
    for row, (length, count) in enumerate(zip(lengths, blocks_per_seq)):
        tables[row, :count] = order[used : used + count]
        used += count
        keys.append(key_cache[tables[row, :count]].reshape(-1, kv_heads, head_dim)[:length])
        values.append(value_cache[tables[row, :count]].reshape(-1, kv_heads, head_dim)[:length])
    return key_cache, value_cache, tables, keys, values


def kernel_scalars(shape: dict) -> tuple[float, int, float]:
    """(scale, window, soft-cap) of a drawn shape as the kernels take them: 0 for no window, no soft-cap."""
    scale = shape["scale_factor"] / np.sqrt(shape["head_dim"])
    return scale, shape["window"] or 0, shape["softcap"] or 0.0
