"""Writing and attending one layer of keys and values stored in blocks, for a batch of sequences.

    keys, values: [N, Z, K, E], one layer of the paged arena
    slot of position p = block_table[p // Z] * Z + p % Z

Float32 blocks go to the Numba kernels, imported with the first arena that
needs them (``load_kernels``: import refllm loads no Numba). Given an
``attend`` function instead, each sequence's keys and values are gathered
through its block table and handed to it as plain arrays.

Image spans (Gemma 3's images, whose tokens see each other) reach the kernels as
the end of each new token's keys (``visible_ends``), and ``attend`` as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from refllm.nn.attention import ImageSpans


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
    image_spans: Sequence[ImageSpans] | None = None,
) -> np.ndarray:
    """q: [B, T, H, E] at positions length + t -> [B, T, H, E]: one decode or prefill-chunk kernel call
    (``attend`` None), or ``attend`` over each sequence's gathered keys and values.

    image_spans: per row, the (start, end) positions of images whose tokens see each other (ending
    within the new tokens)."""
    if attend is not None:
        return _gathered_attention(keys, values, view, q, scale, window, softcap, attend, image_spans)
    batch, num_new, num_heads, head_dim = q.shape
    q = _as_f32(q)
    arena = (keys, values, view.block_tables)
    scalars = (float(scale), window or 0, float(softcap or 0.0))  # 0 = no window, no soft-capping
    if image_spans is not None and any(image_spans):
        ends = visible_ends(view.lengths, num_new, image_spans)
        return load_kernels().paged_prefill_attention_to(q, *arena, view.lengths, ends, *scalars)
    if num_new == 1:
        decode_q = q.reshape(batch, num_heads, head_dim)
        out = load_kernels().paged_decode_attention(decode_q, *arena, view.lengths + 1, *scalars)
        return out.reshape(q.shape)
    return load_kernels().paged_prefill_attention(q, *arena, view.lengths, *scalars)


def visible_ends(lengths: np.ndarray, num_new: int, image_spans: Sequence[ImageSpans]) -> np.ndarray:
    """[B, T] int64: one past the last key each new token sees; its own position + 1, or for a token of
    an image whose tokens see each other, the image's end."""
    ends = lengths[:, None] + np.arange(1, num_new + 1)  # [B, T]
    for row, spans in enumerate(image_spans):
        for start, end in spans:
            inside = (ends[row] > start) & (ends[row] <= end)  # tokens at positions start .. end - 1
            ends[row, inside] = np.maximum(ends[row, inside], end)
    return ends


def _gathered_attention(
    keys: np.ndarray, values: np.ndarray, view: BatchView, q: np.ndarray, scale, window, softcap, attend: Callable,
    image_spans: Sequence[ImageSpans] | None = None,
) -> np.ndarray:
    """``attend`` over each sequence's keys and values, gathered through its block table."""
    num_new = q.shape[1]
    block_size = keys.shape[1]
    key_slots, value_slots = _slots(keys), _slots(values)  # [N * Z, K, E]
    out = []
    for row, (table, length) in enumerate(zip(view.block_tables, view.lengths)):
        positions = np.arange(length + num_new)
        slots = table[positions // block_size] * block_size + positions % block_size
        spans = {"image_spans": image_spans[row]} if image_spans is not None and image_spans[row] else {}
        out.append(
            attend(q[row], key_slots[slots], value_slots[slots], positions[length:], scale, window, softcap, **spans)
        )
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
