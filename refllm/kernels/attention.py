"""Numba attention over a paged KV arena, and the K/V write into it.

The arena keeps one layer's keys and values as ``key_cache``/``value_cache``:
[N, Z, K, E] float32 (N blocks of Z token slots: Z is the block size). A sequence's token at
position p sits in block ``block_table[p // Z]`` at offset ``p % Z``; its slot
number is ``block_table[p // Z] * Z + p % Z``. Block tables arrive padded to
one int32 array [B, max blocks]; entries past a sequence's last block are
never read.

Every kernel computes what ``refllm.nn.attention.attention`` computes (the
NumPy twin, property-tested against it in tests/kernels/test_attention_kernels.py),
except that keys are read in place from their blocks and the softmax is
streamed: chunk by chunk, a running maximum and denominator are kept and the
output accumulator is rescaled whenever the maximum grows, so the scores are
never materialised. Keys the mask hides are never visited, so a sliding
window costs only the window.

Precision: scores are float64 sums of exact float64 products (an error in a
score is multiplied by the softmax, so it gets the wide type); the
exponentials, and each chunk's weighted sum of at most CHUNK_KEYS values, are
float32; the running sums across chunks and the denominators are float64. A
result thus strays from the exact spec by a few float32 roundings of the
values averaged (about 2e-7 for values of size 1), a fifth of the tests'
absolute tolerance in the worst of 400 random cases.

Scalars use sentinels so one compiled signature serves every call:
``window`` 0 means no sliding window, ``softcap`` 0.0 means no soft-capping.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from refllm.kernels.arithmetic import ceil_div
from refllm.kernels.exp import exp_nonpositive
from refllm.kernels.intrinsics import SUM_FASTMATH, prefetch

# Keys are visited in chunks of this many: scores, exponentials and the weighted sum of values
# of a chunk each run as one loop of CHUNK_KEYS, long enough for LLVM's 16-lane loops (which
# handle 64 elements per round) to run vectorised instead of falling to their scalar remainder.
CHUNK_KEYS = 64


@njit(cache=True, inline="always")
def _slot(block_table: np.ndarray, position: int, block_size: int) -> int:
    """The arena slot of a sequence's token at ``position``: its block's number * Z + offset."""
    return block_table[position // block_size] * block_size + position % block_size


@njit(cache=True, inline="always")
def _prefetch_keys(
    key_cache: np.ndarray, value_cache: np.ndarray, block_table: np.ndarray, key_start: int, key_end: int
) -> None:
    """Ask for the keys and values key_start .. key_end - 1 to be brought into cache.

    Each block is contiguous, which the hardware prefetcher follows, but the next
    block lies anywhere in the arena, where it cannot guess.
    """
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    row = num_kv_heads * head_dim  # floats per slot
    for position in range(key_start, key_end):
        slot = _slot(block_table, position, block_size)
        for i in range(0, row, 16):  # 16 float32 = one 64-byte cache line
            prefetch(key_cache, slot * row + i)
            prefetch(value_cache, slot * row + i)


@njit(cache=True, fastmath=SUM_FASTMATH)
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

    queries: [H, E] float32, key_cache/value_cache: [N, Z, K, E], block_table:
    [blocks] int32. Writes maxes: [H], denominators: [H], acc: [H, E] (float64):
    acc[h] = sum_j exp(score[h, j] - maxes[h]) * value[j], denominators[h] the
    same sum without the values.

    Chunk by chunk, for each head: the chunk's scores (four keys at a time, so
    each query lane loaded feeds four sums), their maximum, the exponentials,
    and the weighted sum of the chunk's values (four keys at a time again); the
    running sums are rescaled and the chunk's sums added. A chunk's keys and
    values are read from memory once, while the previous chunk is computed,
    and then served from cache to the other heads of their group.
    """
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    num_heads = queries.shape[0]
    group = num_heads // num_kv_heads  # GQA: query heads g * group .. (g + 1) * group - 1 read KV head g
    keys = key_cache.reshape(-1, num_kv_heads, head_dim)  # [N * Z, K, E]: a slot number indexes a key
    values = value_cache.reshape(-1, num_kv_heads, head_dim)
    queries64 = np.empty((num_heads, head_dim), np.float64)  # converted once, to score in float64
    for h in range(num_heads):
        for e in range(head_dim):
            queries64[h, e] = queries[h, e]
    slots = np.empty(CHUNK_KEYS, np.int64)
    weights = np.empty(CHUNK_KEYS, np.float32)  # one head's scores over the chunk, then its softmax weights
    chunk_acc = np.empty(head_dim, np.float32)
    maxes[:] = -np.inf
    denominators[:] = 0.0
    acc[:] = 0.0

    for chunk_start in range(key_start, key_end, CHUNK_KEYS):
        n = min(CHUNK_KEYS, key_end - chunk_start)
        for j in range(n):
            slots[j] = _slot(block_table, chunk_start + j, block_size)
        _prefetch_keys(key_cache, value_cache, block_table, chunk_start + n, min(chunk_start + n + CHUNK_KEYS, key_end))
        for h in range(num_heads):
            g = h // group
            query = queries64[h]
            j = 0
            while j + 4 <= n:
                k0, k1 = keys[slots[j], g], keys[slots[j + 1], g]
                k2, k3 = keys[slots[j + 2], g], keys[slots[j + 3], g]
                s0 = s1 = s2 = s3 = 0.0
                for e in range(head_dim):
                    s0 += query[e] * k0[e]
                    s1 += query[e] * k1[e]
                    s2 += query[e] * k2[e]
                    s3 += query[e] * k3[e]
                weights[j], weights[j + 1], weights[j + 2], weights[j + 3] = s0, s1, s2, s3
                j += 4
            for j in range(j, n):
                key = keys[slots[j], g]
                s0 = 0.0
                for e in range(head_dim):
                    s0 += query[e] * key[e]
                weights[j] = s0

            chunk_max = -np.inf
            for j in range(n):
                score = weights[j] * scale
                if softcap > 0.0:
                    score = softcap * math.tanh(score / softcap)
                weights[j] = score
                chunk_max = max(chunk_max, score)
            new_max = max(maxes[h], chunk_max)
            correction = math.exp(maxes[h] - new_max)  # 0.0 on the first chunk (exp(-inf))
            maxes[h] = new_max
            shift = np.float32(new_max)
            for j in range(n):
                weights[j] = exp_nonpositive(weights[j] - shift)
            total = 0.0
            for j in range(n):
                total += weights[j]
            denominators[h] = denominators[h] * correction + total

            chunk_acc[:] = 0.0
            j = 0
            while j + 4 <= n:
                w0, w1, w2, w3 = weights[j], weights[j + 1], weights[j + 2], weights[j + 3]
                v0, v1 = values[slots[j], g], values[slots[j + 1], g]
                v2, v3 = values[slots[j + 2], g], values[slots[j + 3], g]
                for e in range(head_dim):
                    chunk_acc[e] += w0 * v0[e] + w1 * v1[e] + w2 * v2[e] + w3 * v3[e]
                j += 4
            for j in range(j, n):
                w0, v0 = weights[j], values[slots[j], g]
                for e in range(head_dim):
                    chunk_acc[e] += w0 * v0[e]
            for e in range(head_dim):
                acc[h, e] = acc[h, e] * correction + chunk_acc[e]


@njit(cache=True)
def _first_visible_key(position: int, window: int) -> int:
    return 0 if window <= 0 else max(0, position - window + 1)


# Decode splits each sequence's keys into partitions of this many keys, so a
# single long sequence still spreads over every core. Partition boundaries
# depend only on the sequence itself, never on the rest of the batch, so a
# sequence's output does not change with the batch it is decoded in. One chunk
# each: at 256 keys, a 300-key context split 256 + 44 and one thread did most of
# the work; in 64s it splits 5 ways (SmolLM2's layer: 40 -> 32 us a call, the same
# at 1000 keys, where merging more partitions costs what the balance saves).
DECODE_PARTITION_KEYS = CHUNK_KEYS


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

    q: [B, H, E] float32, key_cache/value_cache: [N, Z, K, E] float32,
    block_tables: [B, max blocks] int32, context_lens: [B] int64 (keys of each
    sequence, the new token's included; its query sits at context_lens - 1)
    -> [B, H, E] float32.

    NumPy twin: ``refllm.nn.attention.attention(q[b][None], keys, values,
    [context_lens[b] - 1], scale, window, softcap)`` per sequence, with keys and
    values gathered from the blocks.

    Parallel over (sequence, key partition), every head in one pass over the
    partition's keys; a serial pass then merges the partitions.
    """
    batch, num_heads, head_dim = q.shape
    first_keys = np.empty(batch, np.int64)
    num_partitions = 1
    for b in range(batch):
        first_keys[b] = _first_visible_key(context_lens[b] - 1, window)
        visible = context_lens[b] - first_keys[b]
        num_partitions = max(num_partitions, ceil_div(visible, DECODE_PARTITION_KEYS))

    maxes = np.empty((batch, num_partitions, num_heads), np.float64)
    denominators = np.empty((batch, num_partitions, num_heads), np.float64)
    acc = np.empty((batch, num_partitions, num_heads, head_dim), np.float64)
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
            q[b], key_cache, value_cache, block_tables[b], key_start, key_end, scale, softcap,
            maxes[b, part], denominators[b, part], acc[b, part],
        )

    return _merge_partitions(maxes, denominators, acc)


# Serial, and a function of its own: in a parallel function Numba turns every whole-array
# statement (``merged[:] = 0.0``) into a parallel region of its own, which inside this
# loop cost 0.6 us per head and sequence, twice the attention itself on short sequences.
@njit(cache=True)
def _merge_partitions(maxes: np.ndarray, denominators: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """maxes/denominators: [B, P, H], acc: [B, P, H, E] float64, partition p's streaming sums
    -> [B, H, E] float32: with M the largest partition maximum,
    out = sum_p acc_p exp(m_p - M) / sum_p d_p exp(m_p - M)."""
    batch, num_partitions, num_heads, head_dim = acc.shape
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


@njit(cache=True)
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

    q: [B, T, H, E] float32, key_cache/value_cache: [N, Z, K, E] float32 (the
    chunk's keys already written), block_tables: [B, max blocks] int32,
    prefix_lens: [B] int64 (keys before the chunk; query t sits at
    prefix_lens + t) -> [B, T, H, E] float32.

    NumPy twin: ``refllm.nn.attention.attention(q[b], keys, values,
    prefix_lens[b] + arange(T), scale, window, softcap)`` per sequence, with keys
    and values gathered from the blocks.
    """
    batch, num_tokens = q.shape[:2]
    visible_ends = np.empty((batch, num_tokens), np.int64)
    for b in range(batch):
        for t in range(num_tokens):
            visible_ends[b, t] = prefix_lens[b] + t + 1  # causal: up to the query itself
    return paged_prefill_attention_to(q, key_cache, value_cache, block_tables, prefix_lens, visible_ends, scale,
                                      window, softcap)  # fmt: skip


@njit(cache=True, parallel=True)
def paged_prefill_attention_to(
    q: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    prefix_lens: np.ndarray,
    visible_ends: np.ndarray,
    scale: float,
    window: int,
    softcap: float,
) -> np.ndarray:
    """``paged_prefill_attention`` with the end of each query's keys given: query t of sequence b sees the keys
    ``first .. visible_ends[b, t] - 1``, ``first`` the start of its sliding window. Past its own position for
    the tokens of an image that attend to each other (Gemma 3): the image's end.

    visible_ends: [B, T] int64 (at least prefix_lens[b] + t + 1, at most the keys written).
    NumPy twin: ``refllm.nn.attention.attention(..., image_spans=...)`` per sequence.

    Parallel over (sequence, token), every head in one pass over the blocks
    that token may see.
    """
    batch, num_tokens, num_heads, head_dim = q.shape
    out = np.empty((batch, num_tokens, num_heads, head_dim), np.float32)
    for item in prange(batch * num_tokens):
        b = item // num_tokens
        t = item % num_tokens
        position = prefix_lens[b] + t
        maxes = np.empty(num_heads, np.float64)
        denominators = np.empty(num_heads, np.float64)
        acc = np.empty((num_heads, head_dim), np.float64)
        _attend_keys(
            q[b, t], key_cache, value_cache, block_tables[b], _first_visible_key(position, window),
            visible_ends[b, t], scale, softcap, maxes, denominators, acc,
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

    key_cache/value_cache: [N, Z, K, E] float32 (written), slots: [B, T] int64
    (slot = block * Z + offset), k/v: [B, T, K, E] float32.

    NumPy twin: ``key_cache.reshape(N * Z, K, E)[slots] = k`` (and the same for v).
    """
    block_size = key_cache.shape[1]
    batch, num_tokens = slots.shape
    for b in range(batch):
        for t in range(num_tokens):
            block = slots[b, t] // block_size
            offset = slots[b, t] % block_size
            key_cache[block, offset] = k[b, t]
            value_cache[block, offset] = v[b, t]
