"""Writing and attending one layer of keys and values stored in blocks, for a batch of sequences.

    keys, values: [N, Z, K, E], one layer of the paged arena
    slot of position p = block_table[p // Z] * Z + p % Z

Float32 blocks go to the Numba kernels, imported with the first arena that
needs them (``load_kernels``: import refllm loads no Numba). Given an
``attend`` function instead, each sequence's keys and values are gathered
through its block table and handed to it as plain arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class BatchView(NamedTuple):
    """What the kernels need for one batch of sequences and T new tokens each."""

    block_tables: np.ndarray  # [B, max blocks] int32, padded with block 0 (never read)
    lengths: np.ndarray  # [B] int64 committed tokens: the new tokens start here
    slots: np.ndarray  # [B, T] int64: where the new tokens' keys and values go


def write_blocks(
    keys: np.ndarray, values: np.ndarray, slots: np.ndarray, k: np.ndarray, v: np.ndarray, use_kernels: bool
) -> None:
    """Store k [B, T, K, E] and v [B, T, K, value width] at ``slots`` [B, T]."""
    if use_kernels:
        load_kernels().write_kv(keys, values, slots, _as_f32(k), _as_f32(v))
    else:
        _slots(keys)[slots] = k
        _slots(values)[slots] = v


def attend_blocks(
    keys: np.ndarray,
    values: np.ndarray,
    view: BatchView,
    q: np.ndarray,
    scale: float,
    window: int | None,
    softcap: float | None,
    attend: Callable | None,
) -> np.ndarray:
    """q: [B, T, H, E] at positions length + t -> [B, T, H, E]: one decode or prefill-chunk kernel call
    (``attend`` None), or ``attend`` over each sequence's gathered keys and values."""
    if attend is not None:
        return _gathered_attention(keys, values, view, q, scale, window, softcap, attend)
    batch, num_new, num_heads, head_dim = q.shape
    q = _as_f32(q)
    arena = (keys, values, view.block_tables)
    scalars = (float(scale), window or 0, float(softcap or 0.0))  # 0 = no window, no soft-capping
    if num_new == 1:
        decode_q = q.reshape(batch, num_heads, head_dim)
        out = load_kernels().paged_decode_attention(decode_q, *arena, view.lengths + 1, *scalars)
        return out.reshape(q.shape)
    return load_kernels().paged_prefill_attention(q, *arena, view.lengths, *scalars)


def _gathered_attention(
    keys: np.ndarray, values: np.ndarray, view: BatchView, q: np.ndarray, scale, window, softcap, attend: Callable
) -> np.ndarray:
    """``attend`` over each sequence's keys and values, gathered through its block table."""
    num_new = q.shape[1]
    block_size = keys.shape[1]
    key_slots, value_slots = _slots(keys), _slots(values)  # [N * Z, K, E]
    out = []
    for row, (table, length) in enumerate(zip(view.block_tables, view.lengths)):
        positions = np.arange(length + num_new)
        slots = table[positions // block_size] * block_size + positions % block_size
        out.append(attend(q[row], key_slots[slots], value_slots[slots], positions[length:], scale, window, softcap))
    return np.stack(out)


def _slots(layer_blocks: np.ndarray) -> np.ndarray:
    """[N, Z, K, E] -> [N * Z, K, E], a view: slot block * Z + offset holds one position."""
    num_blocks, block_size = layer_blocks.shape[:2]  # not -1: an arena without values has size 0
    return layer_blocks.reshape(num_blocks * block_size, *layer_blocks.shape[2:])


def _as_f32(x: np.ndarray) -> np.ndarray:
    """The kernels are compiled for C-contiguous float32 arrays only."""
    return np.ascontiguousarray(x, dtype=np.float32)


@functools.cache
def load_kernels():
    """The Numba kernels over float32 blocks."""
    from refllm.kernels import attention

    return attention
