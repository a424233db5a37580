"""Rotary position embedding in one pass, and its angles kept in a table.

NumPy twins: ``refllm.nn.rope.apply_rope`` and ``refllm.nn.rope.rope_cos_sin``
(tests/kernels/test_norm_rope_kernels.py).

For each head, dimensions i and i + R/2 (i < R/2) rotate together:

    x'[i]       = x[i] cos[i] - x[i + R/2] sin[i]
    x'[i + R/2] = x[i + R/2] cos[i + R/2] + x[i] sin[i + R/2]

and dimensions R .. E - 1 pass through: the spec's x cos + rotate_half(x) sin,
with the same float32 operations, so the results are the spec's bit for bit.
One call replaces the spec's slicing, concatenations and products (about 7 us
per call on a decode step, against about 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from refllm.nn.rope import cos_sin, inverse_frequencies, rotary_dims


@njit(cache=True)
def _rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [N, H, E], cos/sin [N, R] -> [N, H, E]."""
    out = np.empty_like(x)
    rotary = cos.shape[1]
    half = rotary // 2
    for n in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                first, second = x[n, h, i], x[n, h, i + half]
                out[n, h, i] = first * cos[n, i] + -second * sin[n, i]
                out[n, h, i + half] = second * cos[n, i + half] + first * sin[n, i + half]
            for i in range(rotary, x.shape[2]):
                out[n, h, i] = x[n, h, i]
    return out


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: [B, T, heads, E], cos/sin: [B, T, R] -> [B, T, heads, E], as ``refllm.nn.rope.apply_rope``."""
    B, T, heads, E = x.shape
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(B * T, heads, E)
    cos = np.ascontiguousarray(cos, dtype=np.float32).reshape(B * T, -1)
    sin = np.ascontiguousarray(sin, dtype=np.float32).reshape(B * T, -1)
    return _rope_rows(rows, cos, sin).reshape(x.shape)


class RopeTable:
    """cos/sin for positions [0, n), computed once and grown on demand: ``rope_cos_sin``'s twin, the fast op set's.

    The same elementwise float operations on the same numbers as the spec's, once per position instead
    of once per layer and step (tests/kernels/test_norm_rope_kernels.py). Dynamic NTK scaling depends on the
    sequence length, so past ``max_position_embeddings`` its angles are recomputed for each forward
    pass, as the spec does.
    """

    def __init__(self, params: Any, head_dim: int, max_position_embeddings: int, dtype=np.float32):
        self.params = params
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.dtype = np.dtype(dtype)
        self.inv_freq, self.attention_factor = inverse_frequencies(params, head_dim, max_position_embeddings)
        empty = np.zeros((0, rotary_dims(params, head_dim)), self.dtype)
        self.table = (empty, empty)  # (cos, sin), replaced whole so a concurrent reader never mixes sizes

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions: [B, T] -> cos, sin: [B, T, R]."""
        seq_len = int(positions.max()) + 1
        if self.params.rope_type == "dynamic" and seq_len > self.max_position_embeddings:
            inv_freq, factor = inverse_frequencies(self.params, self.head_dim, self.max_position_embeddings, seq_len)
            return cos_sin(inv_freq, positions, factor, self.dtype)
        cos, sin = self.table
        if seq_len > len(cos):
            size = max(seq_len, 2 * len(cos), 256)
            cos, sin = self.table = cos_sin(self.inv_freq, np.arange(size), self.attention_factor, self.dtype)
        return cos[positions], sin[positions]
