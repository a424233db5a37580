"""Numba attention over a paged KV arena, and the K/V write into it.

The arena keeps one layer's keys and values as ``key_cache``/``value_cache``:
[N, S, K, E] float32 (N blocks of S token slots). A sequence's token at
position p sits in block ``block_table[p // S]`` at offset ``p % S``; its slot
number is ``block_table[p // S] * S + p % S``. Block tables arrive padded to
one int32 array [B, max blocks]; entries past a sequence's last block are
never read.

Every kernel computes what ``refllm.nn.attention.attention`` computes (the
NumPy twin, property-tested against it in tests/test_attention_kernels.py),
except that keys are read in place from their blocks and the softmax is
streamed: block by block, a running maximum and denominator are kept and the
output accumulator is rescaled whenever the maximum grows, so the scores are
never materialised. Keys the mask hides are never visited, so a sliding
window costs only the window. Sums run in float64, which keeps the kernels
within float32 rounding of the spec whatever the summation order. Fast-math
is off except for the two reordering flags on the dot product (see ``_dot``).

Scalars use sentinels so one compiled signature serves every call:
``window`` 0 means no sliding window, ``softcap`` 0.0 means no soft-capping.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from refllm.kernels.prefetch import prefetch


# The one place fast-math flags are on, and only these two: "reassoc" lets the
# compiler split this sum into SIMD lanes and add the lanes up at the end, and
# "contract" lets it fuse each multiply-add. Both only change how an E-term
# float64 sum is rounded (by about 1e-16 relative, far below float32
# resolution); no approximate functions and no NaN/Inf assumptions come with
# them. Without them the dot runs one element at a time and takes about two
# thirds of the decode kernel's time. (A float32 sum here was about 1.1x
# faster and put the kernel 7x closer to the tests' tolerance.)
@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot(q: np.ndarray, k: np.ndarray) -> float:
    """q: [E] float64, k: [E] float32 -> q . k in float64."""
    total = 0.0
    for e in range(q.shape[0]):
        total += q[e] * k[e]
    return total


@njit(cache=True)
def _attend_keys(
    queries: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    key_start: int,
    key_end: int,
    scale: float,
    softcap: float,
    maxes: np.ndarray,
    denominators: np.ndarray,
    acc: np.ndarray,
) -> None:
    """Streaming softmax of every query head at one position over the keys key_start .. key_end - 1.

    queries: [H, E] float64, key_cache/value_cache: [N, S, K, E], block_table:
    [blocks] int32. Writes maxes: [H], denominators: [H], acc: [H, E] (float64):
    acc[h] = sum_j exp(score[h, j] - maxes[h]) * value[j], denominators[h] the
    same sum without the values. All heads go through a block before the next
    one, so each block is read once, front to back, while it is in cache, and
    the next block is prefetched meanwhile (blocks lie anywhere in the arena,
    where the hardware prefetcher cannot guess them).
    """
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    num_heads = queries.shape[0]
    group = num_heads // num_kv_heads  # GQA: query heads g * group .. (g + 1) * group - 1 read KV head g
    block_elements = block_size * num_kv_heads * head_dim
    scores = np.empty((num_heads, block_size), np.float64)  # [H, S]: one block's scores, then weights
    value = np.empty(head_dim, np.float64)  # one value row, converted once for all its query heads
    maxes[:] = -np.inf
    denominators[:] = 0.0
    acc[:] = 0.0

    last_block = (key_end - 1) // block_size
    for logical_block in range(key_start // block_size, last_block + 1):
        block = block_table[logical_block]
        block_start = logical_block * block_size
        lo = max(key_start - block_start, 0)
        hi = min(key_end - block_start, block_size)
        if logical_block < last_block:
            following = block_table[logical_block + 1] * block_elements
            for i in range(0, block_elements, 16):  # 16 float32 = one 64-byte cache line
                prefetch(key_cache, following + i)
                prefetch(value_cache, following + i)

        for offset in range(lo, hi):
            for g in range(num_kv_heads):
                key = key_cache[block, offset, g]
                for h in range(g * group, (g + 1) * group):
                    score = _dot(queries[h], key) * scale
                    if softcap > 0.0:
                        score = softcap * math.tanh(score / softcap)
                    scores[h, offset] = score

        for h in range(num_heads):
            new_max = maxes[h]
            for offset in range(lo, hi):
                new_max = max(new_max, scores[h, offset])
            correction = math.exp(maxes[h] - new_max)  # 0.0 on the first block (exp(-inf))
            denominators[h] *= correction
            for e in range(head_dim):
                acc[h, e] *= correction
            maxes[h] = new_max
            for offset in range(lo, hi):
                weight = math.exp(scores[h, offset] - new_max)
                scores[h, offset] = weight
                denominators[h] += weight

        for offset in range(lo, hi):
            for g in range(num_kv_heads):
                stored = value_cache[block, offset, g]
                for e in range(head_dim):
                    value[e] = stored[e]
                for h in range(g * group, (g + 1) * group):
                    weight = scores[h, offset]
                    for e in range(head_dim):
                        acc[h, e] += weight * value[e]


@njit(cache=True)
def _first_visible_key(position: int, window: int) -> int:
    return 0 if window <= 0 else max(0, position - window + 1)


# Decode splits each sequence's keys into partitions of this many keys, so a
# single long sequence still spreads over every core. Partition boundaries
# depend only on the sequence itself, never on the rest of the batch, so a
# sequence's output does not change with the batch it is decoded in.
DECODE_PARTITION_KEYS = 256


@njit(cache=True, parallel=True)
def paged_decode_attention(
    q: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    context_lens: np.ndarray,
    scale: float,
    window: int,
    softcap: float,
) -> np.ndarray:
    """Decode: one new query per sequence, sequences of different lengths.

    q: [B, H, E] float32, key_cache/value_cache: [N, S, K, E] float32,
    block_tables: [B, max blocks] int32, context_lens: [B] int64 (keys of each
    sequence, the new token's included; its query sits at context_lens - 1)
    -> [B, H, E] float32.

    NumPy twin: ``refllm.nn.attention.attention(q[b][None], keys, values,
    [context_lens[b] - 1], scale, window, softcap)`` per sequence, with keys and
    values gathered from the blocks.

    Parallel over (sequence, key partition), every head in one pass over the
    partition's blocks. A serial pass over (sequence, head) then merges the
    partitions: with M the largest partition maximum,
    out = sum_p acc_p exp(m_p - M) / sum_p d_p exp(m_p - M).
    """
    batch, num_heads, head_dim = q.shape
    first_keys = np.empty(batch, np.int64)
    num_partitions = 1
    for b in range(batch):
        first_keys[b] = _first_visible_key(context_lens[b] - 1, window)
        visible = context_lens[b] - first_keys[b]
        num_partitions = max(num_partitions, (visible + DECODE_PARTITION_KEYS - 1) // DECODE_PARTITION_KEYS)

    maxes = np.empty((batch, num_partitions, num_heads), np.float64)
    denominators = np.empty((batch, num_partitions, num_heads), np.float64)
    acc = np.empty((batch, num_partitions, num_heads, head_dim), np.float64)
    queries = q.astype(np.float64)
    for item in prange(batch * num_partitions):
        b = item // num_partitions
        part = item % num_partitions
        key_start = first_keys[b] + part * DECODE_PARTITION_KEYS
        key_end = min(key_start + DECODE_PARTITION_KEYS, context_lens[b])
        if key_start >= key_end:  # this sequence is shorter: an empty partition weighs nothing
            maxes[b, part] = -np.inf
            denominators[b, part] = 0.0
            acc[b, part] = 0.0
            continue
        _attend_keys(
            queries[b], key_cache, value_cache, block_tables[b], key_start, key_end, scale, softcap,
            maxes[b, part], denominators[b, part], acc[b, part],
        )

    # The merge is a few multiply-adds per partition: cheaper serially than as a second parallel region.
    out = np.empty((batch, num_heads, head_dim), np.float32)
    merged = np.empty(head_dim, np.float64)
    for b in range(batch):
        for h in range(num_heads):
            top = -np.inf
            for part in range(num_partitions):
                top = max(top, maxes[b, part, h])
            denominator = 0.0
            merged[:] = 0.0
            for part in range(num_partitions):
                weight = math.exp(maxes[b, part, h] - top)
                denominator += weight * denominators[b, part, h]
                for e in range(head_dim):
                    merged[e] += weight * acc[b, part, h, e]
            for e in range(head_dim):
                out[b, h, e] = merged[e] / denominator
    return out


@njit(cache=True, parallel=True)
def paged_prefill_attention(
    q: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    prefix_lens: np.ndarray,
    scale: float,
    window: int,
    softcap: float,
) -> np.ndarray:
    """Prefill chunk: T new queries per sequence over the cached prefix and, causally, the chunk.

    q: [B, T, H, E] float32, key_cache/value_cache: [N, S, K, E] float32 (the
    chunk's keys already written), block_tables: [B, max blocks] int32,
    prefix_lens: [B] int64 (keys before the chunk; query t sits at
    prefix_lens + t) -> [B, T, H, E] float32.

    NumPy twin: ``refllm.nn.attention.attention(q[b], keys, values,
    prefix_lens[b] + arange(T), scale, window, softcap)`` per sequence, with keys
    and values gathered from the blocks.

    Parallel over (sequence, token), every head in one pass over the blocks
    that token may see.
    """
    batch, num_tokens, num_heads, head_dim = q.shape
    out = np.empty((batch, num_tokens, num_heads, head_dim), np.float32)
    queries = q.astype(np.float64)
    for item in prange(batch * num_tokens):
        b = item // num_tokens
        t = item % num_tokens
        position = prefix_lens[b] + t
        maxes = np.empty(num_heads, np.float64)
        denominators = np.empty(num_heads, np.float64)
        acc = np.empty((num_heads, head_dim), np.float64)
        _attend_keys(
            queries[b, t], key_cache, value_cache, block_tables[b], _first_visible_key(position, window),
            position + 1, scale, softcap, maxes, denominators, acc,
        )
        for h in range(num_heads):
            for e in range(head_dim):
                out[b, t, h, e] = acc[h, e] / denominators[h]
    return out


@njit(cache=True)
def write_kv(
    key_cache: np.ndarray, value_cache: np.ndarray, slots: np.ndarray, k: np.ndarray, v: np.ndarray
) -> None:
    """Store new keys and values at their slots.

    key_cache/value_cache: [N, S, K, E] float32 (written), slots: [B, T] int64
    (slot = block * S + offset), k/v: [B, T, K, E] float32.

    NumPy twin: ``key_cache.reshape(N * S, K, E)[slots] = k`` (and the same for v).
    """
    block_size = key_cache.shape[1]
    batch, num_tokens = slots.shape
    for b in range(batch):
        for t in range(num_tokens):
            block = slots[b, t] // block_size
            offset = slots[b, t] % block_size
            key_cache[block, offset] = k[b, t]
            value_cache[block, offset] = v[b, t]
