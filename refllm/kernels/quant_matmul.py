"""Numba products with GGML-quantized weights: y = x @ W.T, W read from its blocks.

W [R, C] arrives as a GGUF file stores it: ``blocks`` [R, R_bytes] uint8, row
r the C / B blocks of weight row r, in one of the layouts that
``refllm/quant/formats.py`` draws and dequantizes (the NumPy spec). x stays
float32. docs/quantization.md tells the whole story; in short:

- ``quant_matvec`` (decode, one token): four rows at a time; each group of
  weights is decoded in registers and multiplied into x at once, and the rows
  16 ahead are prefetched from DRAM meanwhile.
- ``quant_matmul`` (prefill, batched decode, T >= 2 tokens): each row is
  decoded once into a float32 scratch, then multiplied into the tokens four
  rows by four tokens at a time (``_tile4x4``).
- ``dequantize_rows``: the decoder alone.

The first two are parallel over tasks of ``ROWS_PER_TASK`` rows, and each has a
``_serial`` twin for products too small to repay waking a thread pool.

How a row is walked. A row splits into *groups* read by L *lanes* in lockstep
(SIMD lanes once vectorised). Lane j of group g holds two weights,
w[base + j] and w[base + gap + j] with (base, gap, L) = ``_<family>_layout(g)``,
each of the form w = a q + c: a scale a and offset c per group (or per
sub-block), an integer q per weight. Per format,

    _<format>_params(row, g)        -> (a_first, c_first, a_second, c_second, bits), read once a group
    _<format>_lane(row, g, j, bits) -> (q_first, q_second), integers as float32

and ``_walks`` builds the format's decoder and a decode product from them. Every
format but Q4_K and Q5_K also has ``_<format>_lanes16(row, g, lane, bits)``, 16
lanes at once as vectors of ``refllm/kernels/intrinsics.py``, and decodes with
``_vector_dot4``: 16 lane sums per row kept across the groups and added up once
per row, where the lane loop's product adds them up in every group. The families:

    32-weight blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0)  group = block g; L = 16, gap 16
    Q4_K, Q5_K                                    group = a pair of 32-weight sub-blocks
                                                  (low and high nibbles of the same 32 bytes); L = 32, gap 32
    Q2_K, Q3_K, Q6_K                              group = two 16-weight sub-blocks 64 apart
                                                  that share their bytes; L = 16, gap 64

Exactness. a, c and q are the spec's numbers and a q + c is computed with the
spec's float32 operations, in functions compiled without fast-math (a caller's
flags do not reach into them), so ``dequantize_rows`` equals the spec bit for
bit. Only the products (``SUM_FASTMATH``) round differently from NumPy's ``x @ W.T``;
docs/quantization.md derives the bound the tests hold them to. The layouts live
in this one module on purpose: Numba invalidates a cached function when its own
file changes, and every kernel inlines every lane.

Vectorisation is asserted on the optimised LLVM IR by tests/test_quant_kernels.py.
On this project's AVX-512 machine ``inspect_asm`` shows the lane loop of Q4_K's
and Q5_K's ``_dot4_<format>`` as 16-lane vpmovzxbd/vcvtdq2ps/vfmadd231ps on zmm
registers, and ``_tile4x4``'s loop as sixteen zmm vfmadd231ps accumulators; the
other formats' products are vectors by construction.

Dimension letters: R weight rows (outputs), C columns (inputs), T tokens,
g group, j lane.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.intrinsics import (
    LANES,
    SUM_FASTMATH,
    add16,
    bits16,
    broadcast16,
    byte_bits16,
    int8s16,
    load16,
    mul16,
    multiply_add16,
    prefetch,
    sum16,
    zeros16,
)


# The formats the kernels read, by kernel code (the small int the compiled kernels branch on).
KERNEL_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FORMAT_CODES = {name: code for code, name in enumerate(KERNEL_FORMATS)}
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = range(len(KERNEL_FORMATS))

# How far ahead of the rows being multiplied ``quant_matvec`` prefetches. Decoding streams every
# weight from DRAM once per token; without the hint a thread waits out each cache miss (4.8 GB/s
# on one core of the project's machine, 6.5 on two), with rows 16 ahead requested it does not
# (12 and 19 GB/s; 8 rows ahead reached the same on two cores, 4 did not).
PREFETCH_ROWS = 16

# Rows per parallel task: a multiple of the 4 rows ``_dot4_<format>`` takes, and enough rows that
# ``quant_matmul``'s one scratch row per task is no cost; 16 still gives a 192-row projection 12 tasks.
ROWS_PER_TASK = 16

# The offset c of a format whose weights have none (w = a q): -0.0, because x + -0.0 == x for every
# x, signed zeros included, so a q + c is then exactly the spec's a q.
_NO_OFFSET = np.float32(-0.0)


# float16 bits -> float32, as NumPy converts them (NaN payloads included). One
# table load per scale is cheaper than decoding exponent and mantissa in scalar
# code, and the scales of a real tensor touch only a few of its cache lines.
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True)
def _f16(row: np.ndarray, offset: int) -> np.float32:
    """The little-endian float16 at byte ``offset`` of ``row``, as float32."""
    return _F16_TO_F32[np.int64(row[offset]) | np.int64(row[offset + 1]) << 8]


@njit(cache=True)
def _at(row: np.ndarray, index: int) -> int:
    """row[index] for index >= 0. The unsigned index spares Numba's negative-index wraparound, a per-lane
    select that keeps LLVM from seeing that consecutive lanes read consecutive bytes (it then
    loads them one by one)."""
    return row[np.uint64(index)]


@njit(cache=True)
def _prefetch_rows(blocks: np.ndarray, first: int, count: int) -> None:
    """Prefetch every cache line of rows first .. first + count - 1 that exist."""
    for r in range(first, min(first + count, blocks.shape[0])):
        row = blocks[r]
        for offset in range(0, row.shape[0], 64):
            prefetch(row, offset)


@njit(cache=True)
def _nibbles(byte: int) -> tuple[np.float32, np.float32]:
    """A byte's low and high nibble, as float32.

    Split in float arithmetic (exact for these small integers): LLVM then keeps
    16 lanes of 32 bits per AVX-512 register. The integer split (& 15, >> 4)
    is typed int64 by Numba and vectorises 8 lanes at a time.
    """
    value = np.float32(byte)
    high = np.floor(value * np.float32(0.0625))
    return value - np.float32(16.0) * high, high


@njit(cache=True)
def _bit(value: int, k: int) -> np.float32:
    """Bit k of ``value``, as float32 (0.0 or 1.0)."""
    return np.float32((value >> k) & 1)


@njit(cache=True)
def _u32(row: np.ndarray, offset: int) -> int:
    """The little-endian uint32 at byte ``offset`` of ``row``."""
    value = 0
    for i in range(4):
        value |= np.int64(row[offset + i]) << (8 * i)
    return value


# ---- 32-weight blocks: group g is block g; lane j yields weights j and j + 16 -----------------------


@njit(cache=True)
def _block32_layout(g: int) -> tuple[int, int, int]:
    return 32 * g, 16, 16


@njit(cache=True)
def _q4_0_params(row: np.ndarray, g: int) -> tuple:
    d = _f16(row, 18 * g)
    return d, _NO_OFFSET, d, _NO_OFFSET, 0


@njit(cache=True)
def _q4_0_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-17 qs: byte j holds q_j (low nibble), q_{j+16} (high); w = d * (q - 8)."""
    low, high = _nibbles(_at(row, 18 * g + 2 + j))
    return low - np.float32(8.0), high - np.float32(8.0)


@njit(cache=True)
def _q4_0_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    """Lanes lane .. lane + 15 of ``_q4_0_lane`` at once, as vectors (and so for each format)."""
    at, minus_eight = 18 * g + 2 + lane, broadcast16(np.float32(-8.0))
    return add16(byte_bits16(row, at, 0, 15), minus_eight), add16(byte_bits16(row, at, 4, 15), minus_eight)


@njit(cache=True)
def _q4_1_params(row: np.ndarray, g: int) -> tuple:
    d, m = _f16(row, 20 * g), _f16(row, 20 * g + 2)
    return d, m, d, m, 0


@njit(cache=True)
def _q4_1_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 m | 4-19 qs as Q4_0; w = d * q + m."""
    return _nibbles(_at(row, 20 * g + 4 + j))


@njit(cache=True)
def _q4_1_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    at = 20 * g + 4 + lane
    return byte_bits16(row, at, 0, 15), byte_bits16(row, at, 4, 15)


@njit(cache=True)
def _q5_0_params(row: np.ndarray, g: int) -> tuple:
    d = _f16(row, 22 * g)
    return d, _NO_OFFSET, d, _NO_OFFSET, _u32(row, 22 * g + 2)


@njit(cache=True)
def _q5_0_lane(row: np.ndarray, g: int, j: int, qh: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-5 qh: bit i is bit 4 of q_i | 6-21 qs as Q4_0; w = d * (q - 16)."""
    low, high = _nibbles(_at(row, 22 * g + 6 + j))
    sixteen = np.float32(16.0)
    return low + sixteen * _bit(qh, j) - sixteen, high + sixteen * _bit(qh, j + 16) - sixteen


@njit(cache=True)
def _q5_0_lanes16(row: np.ndarray, g: int, lane: int, qh: int) -> tuple:
    at, sixteen, minus_sixteen = 22 * g + 6 + lane, broadcast16(np.float32(16.0)), broadcast16(np.float32(-16.0))
    low = add16(multiply_add16(sixteen, bits16(qh, lane), byte_bits16(row, at, 0, 15)), minus_sixteen)
    return low, add16(multiply_add16(sixteen, bits16(qh, lane + 16), byte_bits16(row, at, 4, 15)), minus_sixteen)


@njit(cache=True)
def _q5_1_params(row: np.ndarray, g: int) -> tuple:
    d, m = _f16(row, 24 * g), _f16(row, 24 * g + 2)
    return d, m, d, m, _u32(row, 24 * g + 4)


@njit(cache=True)
def _q5_1_lane(row: np.ndarray, g: int, j: int, qh: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 m | 4-7 qh as Q5_0 | 8-23 qs as Q4_0; w = d * q + m."""
    low, high = _nibbles(_at(row, 24 * g + 8 + j))
    return low + np.float32(16.0) * _bit(qh, j), high + np.float32(16.0) * _bit(qh, j + 16)


@njit(cache=True)
def _q5_1_lanes16(row: np.ndarray, g: int, lane: int, qh: int) -> tuple:
    at, sixteen = 24 * g + 8 + lane, broadcast16(np.float32(16.0))
    return (
        multiply_add16(sixteen, bits16(qh, lane), byte_bits16(row, at, 0, 15)),
        multiply_add16(sixteen, bits16(qh, lane + 16), byte_bits16(row, at, 4, 15)),
    )


@njit(cache=True)
def _q8_0_params(row: np.ndarray, g: int) -> tuple:
    d = _f16(row, 34 * g)
    return d, _NO_OFFSET, d, _NO_OFFSET, 0


@njit(cache=True)
def _q8_0_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-33 int8 q_j at byte 2 + j; w = d * q."""
    return np.float32(np.int8(_at(row, 34 * g + 2 + j))), np.float32(np.int8(_at(row, 34 * g + 18 + j)))


@njit(cache=True)
def _q8_0_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    return int8s16(row, 34 * g + 2 + lane), int8s16(row, 34 * g + 18 + lane)


# ---- Q4_K, Q5_K: super-block b = g // 4; group i = g % 4 is sub-blocks 2i (low nibbles), 2i + 1 ----


@njit(cache=True)
def _k_pairs_layout(g: int) -> tuple[int, int, int]:
    return 256 * (g // 4) + 64 * (g % 4), 32, 32


@njit(cache=True)
def _k_scale_min(row: np.ndarray, offset: int, s: int) -> tuple[np.float32, np.float32]:
    """6-bit scale and min of sub-block s from the 12 scale bytes at ``offset`` (formats._k_scales_and_mins)."""
    if s < 4:
        return np.float32(row[offset + s] & 63), np.float32(row[offset + s + 4] & 63)
    scale = (np.int64(row[offset + s + 4]) & 15) | (np.int64(row[offset + s - 4]) >> 6) << 4
    minimum = (np.int64(row[offset + s + 4]) >> 4) | (np.int64(row[offset + s]) >> 6) << 4
    return np.float32(scale), np.float32(minimum)


@njit(cache=True)
def _k_pair_params(row: np.ndarray, g: int, type_size: int) -> tuple:
    """Sub-blocks 2i and 2i + 1 of a Q4_K/Q5_K super-block: w = (d * scale) q - dmin * min."""
    o = type_size * (g // 4)
    d, dmin = _f16(row, o), _f16(row, o + 2)
    scale_low, min_low = _k_scale_min(row, o + 4, 2 * (g % 4))
    scale_high, min_high = _k_scale_min(row, o + 4, 2 * (g % 4) + 1)
    return d * scale_low, -(dmin * min_low), d * scale_high, -(dmin * min_high), 0


@njit(cache=True)
def _q4_k_params(row: np.ndarray, g: int) -> tuple:
    return _k_pair_params(row, g, 144)


@njit(cache=True)
def _q4_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 dmin | 4-15 scales | 16-143 qs: byte 32i + j holds q_j of sub-block 2i (low nibble)
    and of sub-block 2i + 1 (high nibble)."""
    return _nibbles(_at(row, 144 * (g // 4) + 16 + 32 * (g % 4) + j))


@njit(cache=True)
def _q5_k_params(row: np.ndarray, g: int) -> tuple:
    return _k_pair_params(row, g, 176)


@njit(cache=True)
def _q5_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-15 as Q4_K | 16-47 qh: bit k of byte j is bit 4 of weight 32k + j | 48-175 qs as Q4_K."""
    o, i = 176 * (g // 4), g % 4
    low, high = _nibbles(_at(row, o + 48 + 32 * i + j))
    qh = _at(row, o + 16 + j)
    return low + np.float32(16.0) * _bit(qh, 2 * i), high + np.float32(16.0) * _bit(qh, 2 * i + 1)


# ---- Q2_K, Q3_K, Q6_K: 16 sub-blocks of 16. Weight 128h + 32s + l (sub-block 8h + 2s + l // 16) takes
# bits from byte l of half h, so sub-blocks s and s + 2 share bytes: group g is super-block g // 8,
# half h, s in {0, 1} and part p = l // 16; lane j = l % 16 yields s's weight and s + 2's. -------------


@njit(cache=True)
def _k_quads_layout(g: int) -> tuple[int, int, int]:
    h, s, p = _k_quad(g)
    return 256 * (g // 8) + 128 * h + 32 * s + 16 * p, 64, 16


@njit(cache=True)
def _k_quad(g: int) -> tuple[int, int, int]:
    """Group g -> (half h, sub-block pair s, part p) within its super-block."""
    return g % 8 // 4, g % 4 // 2, g % 2


@njit(cache=True)
def _q2_k_params(row: np.ndarray, g: int) -> tuple:
    o = 84 * (g // 8)
    h, s, p = _k_quad(g)
    d, dmin = _f16(row, o + 80), _f16(row, o + 82)
    first, second = row[o + 8 * h + 2 * s + p], row[o + 8 * h + 2 * s + 4 + p]  # scale | min << 4
    return (
        d * np.float32(first & 15), -(dmin * np.float32(first >> 4)),
        d * np.float32(second & 15), -(dmin * np.float32(second >> 4)), 0,
    )  # fmt: skip


@njit(cache=True)
def _q2_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-15 scale | min << 4 per sub-block | 16-79 qs: weight 128h + 32s + l is bits 2s..2s+1 of
    byte 16 + 32h + l | 80-81 d | 82-83 dmin; w = d * scale * q - dmin * min."""
    h, s, p = _k_quad(g)
    q = _at(row, 84 * (g // 8) + 16 + 32 * h + 16 * p + j)
    return np.float32((q >> (2 * s)) & 3), np.float32((q >> (2 * s + 4)) & 3)


@njit(cache=True)
def _q2_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    at = 84 * (g // 8) + 16 + 32 * h + 16 * p + lane
    return byte_bits16(row, at, 2 * s, 3), byte_bits16(row, at, 2 * s + 4, 3)


@njit(cache=True)
def _q3_k_scale(row: np.ndarray, offset: int, sub: int) -> np.float32:
    """Signed 6-bit scale of sub-block ``sub`` from the 12 bytes at ``offset`` (formats._q3_k_scales)."""
    low = np.int64(row[offset + sub]) & 15 if sub < 8 else np.int64(row[offset + sub - 8]) >> 4
    high = (np.int64(row[offset + 8 + sub % 4]) >> (2 * (sub // 4))) & 3
    return np.float32(np.int8(low | high << 4) - np.int8(32))


@njit(cache=True)
def _q3_k_params(row: np.ndarray, g: int) -> tuple:
    o = 110 * (g // 8)
    h, s, p = _k_quad(g)
    d = _f16(row, o + 108)
    first, second = _q3_k_scale(row, o + 96, 8 * h + 2 * s + p), _q3_k_scale(row, o + 96, 8 * h + 2 * s + 4 + p)
    return d * first, _NO_OFFSET, d * second, _NO_OFFSET, 0


@njit(cache=True)
def _q3_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-31 hmask: bit k of byte l is bit 2 of weight 32k + l, a clear bit meaning q -= 4 |
    32-95 qs: bits 0-1 as Q2_K | 96-107 scales | 108-109 d; w = d * scale * q."""
    h, s, p = _k_quad(g)
    o = 110 * (g // 8)
    q, mask = _at(row, o + 32 + 32 * h + 16 * p + j), _at(row, o + 16 * p + j)
    first = np.float32((q >> (2 * s)) & 3) - np.float32(4.0) * (np.float32(1.0) - _bit(mask, 4 * h + s))
    second = np.float32((q >> (2 * s + 4)) & 3) - np.float32(4.0) * (np.float32(1.0) - _bit(mask, 4 * h + s + 2))
    return first, second


@njit(cache=True)
def _q3_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    o, four, minus_four = 110 * (g // 8), broadcast16(np.float32(4.0)), broadcast16(np.float32(-4.0))
    q, mask = o + 32 + 32 * h + 16 * p + lane, o + 16 * p + lane
    first = multiply_add16(four, byte_bits16(row, mask, 4 * h + s, 1), byte_bits16(row, q, 2 * s, 3))
    second = multiply_add16(four, byte_bits16(row, mask, 4 * h + s + 2, 1), byte_bits16(row, q, 2 * s + 4, 3))
    return add16(first, minus_four), add16(second, minus_four)


@njit(cache=True)
def _q6_k_params(row: np.ndarray, g: int) -> tuple:
    o = 210 * (g // 8)
    h, s, p = _k_quad(g)
    d = _f16(row, o + 208)
    first, second = np.int8(row[o + 192 + 8 * h + 2 * s + p]), np.int8(row[o + 192 + 8 * h + 2 * s + 4 + p])
    return d * np.float32(first), _NO_OFFSET, d * np.float32(second), _NO_OFFSET, 0


@njit(cache=True)
def _q6_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-127 ql: bits 0-3 of weight 128h + 32s + l are the low (s < 2) or high nibble of
    byte 64h + 32(s % 2) + l | 128-191 qh: bits 4-5 are bits 2s..2s+1 of byte 128 + 32h + l |
    192-207 int8 scales | 208-209 d; w = (d * scale) * (q - 32)."""
    h, s, p = _k_quad(g)
    o = 210 * (g // 8)
    low, high = _nibbles(_at(row, o + 64 * h + 32 * s + 16 * p + j))
    qh = _at(row, o + 128 + 32 * h + 16 * p + j)
    first = low + np.float32(16.0) * np.float32((qh >> (2 * s)) & 3) - np.float32(32.0)
    second = high + np.float32(16.0) * np.float32((qh >> (2 * s + 4)) & 3) - np.float32(32.0)
    return first, second


@njit(cache=True)
def _q6_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    o, sixteen, minus_32 = 210 * (g // 8), broadcast16(np.float32(16.0)), broadcast16(np.float32(-32.0))
    ql, qh = o + 64 * h + 32 * s + 16 * p + lane, o + 128 + 32 * h + 16 * p + lane
    first = multiply_add16(sixteen, byte_bits16(row, qh, 2 * s, 3), byte_bits16(row, ql, 0, 15))
    second = multiply_add16(sixteen, byte_bits16(row, qh, 2 * s + 4, 3), byte_bits16(row, ql, 4, 15))
    return add16(first, minus_32), add16(second, minus_32)


# ---- one format's walks over a row, compiled for its (params, lane, layout) functions -----------------


@njit(cache=True, fastmath=SUM_FASTMATH)
def _group_total(params: tuple, first: float, second: float, x_first: float, x_second: float) -> float:
    """A group's share of a row's dot product: a (sum q x) + c (sum x), for its first and second weights."""
    return params[0] * first + params[1] * x_first + params[2] * second + params[3] * x_second


def _walks(params, lane, layout):
    """-> (decode, dot4, sums) of one format. The functions are compile-time constants here
    (closure variables), so each walk is compiled with direct calls into them, which LLVM inlines.
    """

    @njit
    def decode(row: np.ndarray, out: np.ndarray) -> None:
        """row [R_bytes] uint8 -> out [C] float32, the spec's weights bit for bit."""
        _, _, lanes = layout(0)
        # The same number, but one LLVM cannot fold to a constant: a constant 16 or 32 gets the
        # lane loop fully unrolled into scalar code before the loop vectoriser sees it.
        opaque_lanes = min(lanes, out.shape[0])
        for g in range(out.shape[0] // (2 * lanes)):
            base, gap, lanes = layout(g)
            a_first, c_first, a_second, c_second, bits = params(row, g)
            for j in range(opaque_lanes):
                q_first, q_second = lane(row, g, j, bits)
                out[np.uint64(base + j)] = a_first * q_first + c_first  # see _at
                out[np.uint64(base + gap + j)] = a_second * q_second + c_second

    @njit
    def sums(x: np.ndarray) -> np.ndarray:
        """x [C] -> [G, 2]: per group, the sum of the x its first and its second weights meet."""
        _, _, lanes = layout(0)
        out = np.zeros((x.shape[0] // (2 * lanes), 2), np.float32)
        for g in range(out.shape[0]):
            base, gap, lanes = layout(g)
            for j in range(lanes):
                out[g, 0] += x[base + j]
                out[g, 1] += x[base + gap + j]
        return out

    @njit(fastmath=SUM_FASTMATH)
    def dot4(rows: tuple, x: np.ndarray, x_sums: np.ndarray) -> tuple[np.float32, np.float32, np.float32, np.float32]:
        """Four rows [R_bytes] uint8 . x [C] float32 -> four float32.

        Per group, sum_j (a q_j + c) x_j = a (sum_j q_j x_j) + c (sum_j x_j): the lanes only
        multiply-add integers into x, and the scale, offset and x's sum join once per group.
        """
        row0, row1, row2, row3 = rows
        total0 = total1 = total2 = total3 = np.float32(0.0)
        _, _, lanes = layout(0)
        for g in range(x.shape[0] // (2 * lanes)):
            base, gap, lanes = layout(g)
            p0, p1, p2, p3 = params(row0, g), params(row1, g), params(row2, g), params(row3, g)
            f0 = f1 = f2 = f3 = s0 = s1 = s2 = s3 = np.float32(0.0)  # first and second weights' sums
            for j in range(lanes):
                x_first, x_second = x[np.uint64(base + j)], x[np.uint64(base + gap + j)]  # see _at
                q_first, q_second = lane(row0, g, j, p0[4])
                f0 += q_first * x_first
                s0 += q_second * x_second
                q_first, q_second = lane(row1, g, j, p1[4])
                f1 += q_first * x_first
                s1 += q_second * x_second
                q_first, q_second = lane(row2, g, j, p2[4])
                f2 += q_first * x_first
                s2 += q_second * x_second
                q_first, q_second = lane(row3, g, j, p3[4])
                f3 += q_first * x_first
                s3 += q_second * x_second
            x_first, x_second = x_sums[g, 0], x_sums[g, 1]
            total0 += _group_total(p0, f0, s0, x_first, x_second)
            total1 += _group_total(p1, f1, s1, x_first, x_second)
            total2 += _group_total(p2, f2, s2, x_first, x_second)
            total3 += _group_total(p3, f3, s3, x_first, x_second)
        return total0, total1, total2, total3

    return decode, dot4, sums


def _vector_dot4(params, lanes16, layout, shared_scale: bool, offset: bool):
    """-> dot4 of one format, its lanes as 16-wide vectors (``refllm/kernels/intrinsics.py``).

    Per group, sum_j (a q_j + c) x_j = a (sum_j q_j x_j) + c (sum_j x_j). Each row keeps 16 lane
    sums of a (q x) across its groups and one scalar sum of c (sum x), and adds its lanes once at
    the end. ``shared_scale``: both weights of a lane have the same a (the 32-weight blocks), so
    a multiplies their two products at once. ``offset``: the format's weights have an offset c;
    without one, c = -0.0 adds nothing, and skipping its sums took 7% off the Q8_0 LM head's time.

    Left to LLVM, a lane loop added up its lanes in every group: spelled out, the product streams
    1.4 to 1.7x the weights per second of that one for the 32-weight formats (one core and two,
    1536 x 576 matrices from DRAM; Q4_1 from 13.6 to 21.9 G/s on two), 1.6x for Q2_K and Q3_K,
    1.9x for Q6_K (1536 x 1024). Q4_K and Q5_K, whose groups are 32 lanes wide, ran 0.7 to 0.9x
    as fast this way and keep the loop.
    """

    @njit(inline="always")
    def add_group(row: np.ndarray, g: int, x: np.ndarray, x_sums: np.ndarray, lanes, offsets: float) -> tuple:
        """A row's 16 lane sums and its offset sum, with group g added."""
        base, gap, num_lanes = layout(g)
        a_first, c_first, a_second, c_second, bits = params(row, g)
        for lane in range(0, num_lanes, LANES):
            q_first, q_second = lanes16(row, g, lane, bits)
            x_first, x_second = load16(x, base + lane), load16(x, base + gap + lane)
            if shared_scale:
                products = multiply_add16(q_second, x_second, mul16(q_first, x_first))
                lanes = multiply_add16(broadcast16(a_first), products, lanes)
            else:
                lanes = multiply_add16(broadcast16(a_second), mul16(q_second, x_second), lanes)
                lanes = multiply_add16(broadcast16(a_first), mul16(q_first, x_first), lanes)
        if offset:
            offsets += c_first * x_sums[g, 0] + c_second * x_sums[g, 1]
        return lanes, offsets

    @njit
    def dot4(rows: tuple, x: np.ndarray, x_sums: np.ndarray) -> tuple[np.float32, np.float32, np.float32, np.float32]:
        """Four rows [R_bytes] uint8 . x [C] float32 -> four float32."""
        row0, row1, row2, row3 = rows
        lanes0 = lanes1 = lanes2 = lanes3 = zeros16()
        offsets0 = offsets1 = offsets2 = offsets3 = np.float32(0.0)
        for g in range(x_sums.shape[0]):
            lanes0, offsets0 = add_group(row0, g, x, x_sums, lanes0, offsets0)
            lanes1, offsets1 = add_group(row1, g, x, x_sums, lanes1, offsets1)
            lanes2, offsets2 = add_group(row2, g, x, x_sums, lanes2, offsets2)
            lanes3, offsets3 = add_group(row3, g, x, x_sums, lanes3, offsets3)
        return sum16(lanes0) + offsets0, sum16(lanes1) + offsets1, sum16(lanes2) + offsets2, sum16(lanes3) + offsets3

    return dot4


def _format_walks(params, lane, layout, lanes16=None, shared_scale: bool = False, offset: bool = True):
    """-> (decode, dot4, sums) of one format: dot4 on vectors where it has ``lanes16``, else the lane loop."""
    decode, lane_dot4, sums = _walks(params, lane, layout)
    if lanes16 is None:
        return decode, lane_dot4, sums
    return decode, _vector_dot4(params, lanes16, layout, shared_scale, offset), sums


# Q4_K and Q5_K multiply lane by lane: as vectors they measured 0.7-0.9x as fast. Q4_0, Q5_0, Q8_0,
# Q3_K and Q6_K weights have no offset (w = a q).
_decode_q4_0, _dot4_q4_0, _sums_q4_0 = _format_walks(
    _q4_0_params, _q4_0_lane, _block32_layout, _q4_0_lanes16, shared_scale=True, offset=False
)
_decode_q4_1, _dot4_q4_1, _sums_q4_1 = _format_walks(
    _q4_1_params, _q4_1_lane, _block32_layout, _q4_1_lanes16, shared_scale=True
)
_decode_q5_0, _dot4_q5_0, _sums_q5_0 = _format_walks(
    _q5_0_params, _q5_0_lane, _block32_layout, _q5_0_lanes16, shared_scale=True, offset=False
)
_decode_q5_1, _dot4_q5_1, _sums_q5_1 = _format_walks(
    _q5_1_params, _q5_1_lane, _block32_layout, _q5_1_lanes16, shared_scale=True
)
_decode_q8_0, _dot4_q8_0, _sums_q8_0 = _format_walks(
    _q8_0_params, _q8_0_lane, _block32_layout, _q8_0_lanes16, shared_scale=True, offset=False
)
_decode_q2_k, _dot4_q2_k, _sums_q2_k = _format_walks(_q2_k_params, _q2_k_lane, _k_quads_layout, _q2_k_lanes16)
_decode_q3_k, _dot4_q3_k, _sums_q3_k = _format_walks(
    _q3_k_params, _q3_k_lane, _k_quads_layout, _q3_k_lanes16, offset=False
)
_decode_q4_k, _dot4_q4_k, _sums_q4_k = _format_walks(_q4_k_params, _q4_k_lane, _k_pairs_layout)
_decode_q5_k, _dot4_q5_k, _sums_q5_k = _format_walks(_q5_k_params, _q5_k_lane, _k_pairs_layout)
_decode_q6_k, _dot4_q6_k, _sums_q6_k = _format_walks(
    _q6_k_params, _q6_k_lane, _k_quads_layout, _q6_k_lanes16, offset=False
)


@njit(cache=True, fastmath=SUM_FASTMATH)
def _tile4x4(w: np.ndarray, r: int, x: np.ndarray, t: int) -> tuple:
    """w [>= r + 4, C] . x [>= t + 4, C] -> the 16 dot products of rows r..r+3 with tokens t..t+3,
    row-major. Each weight and each x loaded feeds four multiply-adds (one per partner), where a
    lone dot product loads two numbers per multiply-add: loads, not arithmetic, bound it."""
    w0, w1, w2, w3 = w[r], w[r + 1], w[r + 2], w[r + 3]
    x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
    for i in range(w0.shape[0]):
        v0, v1, v2, v3 = x0[i], x1[i], x2[i], x3[i]
        u = w0[i]
        a00 += u * v0
        a01 += u * v1
        a02 += u * v2
        a03 += u * v3
        u = w1[i]
        a10 += u * v0
        a11 += u * v1
        a12 += u * v2
        a13 += u * v3
        u = w2[i]
        a20 += u * v0
        a21 += u * v1
        a22 += u * v2
        a23 += u * v3
        u = w3[i]
        a30 += u * v0
        a31 += u * v1
        a32 += u * v2
        a33 += u * v3
    return (a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)


# ---- dispatch on the format code ------------------------------------------------------------------------


@njit(cache=True)
def _decode_row(code: int, row: np.ndarray, out: np.ndarray) -> None:
    if code == Q4_0:
        _decode_q4_0(row, out)
    elif code == Q4_1:
        _decode_q4_1(row, out)
    elif code == Q5_0:
        _decode_q5_0(row, out)
    elif code == Q5_1:
        _decode_q5_1(row, out)
    elif code == Q8_0:
        _decode_q8_0(row, out)
    elif code == Q2_K:
        _decode_q2_k(row, out)
    elif code == Q3_K:
        _decode_q3_k(row, out)
    elif code == Q4_K:
        _decode_q4_k(row, out)
    elif code == Q5_K:
        _decode_q5_k(row, out)
    else:
        _decode_q6_k(row, out)


@njit(cache=True)
def _x_sums(code: int, x: np.ndarray) -> np.ndarray:
    if code == Q4_0:
        return _sums_q4_0(x)
    if code == Q4_1:
        return _sums_q4_1(x)
    if code == Q5_0:
        return _sums_q5_0(x)
    if code == Q5_1:
        return _sums_q5_1(x)
    if code == Q8_0:
        return _sums_q8_0(x)
    if code == Q2_K:
        return _sums_q2_k(x)
    if code == Q3_K:
        return _sums_q3_k(x)
    if code == Q4_K:
        return _sums_q4_k(x)
    if code == Q5_K:
        return _sums_q5_k(x)
    return _sums_q6_k(x)


@njit(cache=True)
def _dot4_rows(
    code: int, rows: tuple, x: np.ndarray, x_sums: np.ndarray
) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    if code == Q4_0:
        return _dot4_q4_0(rows, x, x_sums)
    if code == Q4_1:
        return _dot4_q4_1(rows, x, x_sums)
    if code == Q5_0:
        return _dot4_q5_0(rows, x, x_sums)
    if code == Q5_1:
        return _dot4_q5_1(rows, x, x_sums)
    if code == Q8_0:
        return _dot4_q8_0(rows, x, x_sums)
    if code == Q2_K:
        return _dot4_q2_k(rows, x, x_sums)
    if code == Q3_K:
        return _dot4_q3_k(rows, x, x_sums)
    if code == Q4_K:
        return _dot4_q4_k(rows, x, x_sums)
    if code == Q5_K:
        return _dot4_q5_k(rows, x, x_sums)
    return _dot4_q6_k(rows, x, x_sums)


# ---- the kernels --------------------------------------------------------------------------------------


@njit(cache=True)
def _tasks(num_rows: int) -> int:
    return (num_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK


@njit(cache=True)
def _quad(blocks: np.ndarray, r: int) -> tuple:
    """Rows r..r+3 of blocks; past the last row, the last row again (its results are not kept)."""
    last = blocks.shape[0] - 1
    return blocks[min(r, last)], blocks[min(r + 1, last)], blocks[min(r + 2, last)], blocks[min(r + 3, last)]


@njit(cache=True)
def _matvec_task(blocks: np.ndarray, code: int, x: np.ndarray, x_sums: np.ndarray, out: np.ndarray, task: int) -> None:
    """out[rows of ``task``] = W[rows] @ x, four rows at a time."""
    num_rows = blocks.shape[0]
    last = num_rows - 1
    for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows), 4):
        _prefetch_rows(blocks, r + PREFETCH_ROWS, 4)
        # The last quad of an R not divisible by 4 repeats row R - 1 (and writes it identically).
        y0, y1, y2, y3 = _dot4_rows(code, _quad(blocks, r), x, x_sums)
        out[r] = y0
        out[min(r + 1, last)] = y1
        out[min(r + 2, last)] = y2
        out[min(r + 3, last)] = y3


@njit(cache=True)
def _matmul_task(blocks: np.ndarray, code: int, x: np.ndarray, out: np.ndarray, task: int) -> None:
    """out[:, rows of ``task``] = x @ W[rows].T: the rows decoded once, then multiplied into the
    tokens four rows by four tokens at a time (``_tile4x4``), the last T % 4 tokens one at a time."""
    num_tokens, num_cols = x.shape
    first_row = task * ROWS_PER_TASK
    rows = min(ROWS_PER_TASK, blocks.shape[0] - first_row)
    weights = np.empty((ROWS_PER_TASK, num_cols), np.float32)  # [16, C] the task's rows, decoded
    _prefetch_rows(blocks, first_row + ROWS_PER_TASK, ROWS_PER_TASK)  # the next task's, likely this thread's
    for r in range(ROWS_PER_TASK):  # rows past the last are a copy of it, multiplied but not kept
        _decode_row(code, blocks[first_row + min(r, rows - 1)], weights[r])
    for r in range(0, rows, 4):
        for t in range(0, num_tokens - 3, 4):
            tile = _tile4x4(weights, r, x, t)
            for i in range(min(4, rows - r)):
                for k in range(4):
                    out[t + k, first_row + r + i] = tile[4 * i + k]
        for t in range(num_tokens - num_tokens % 4, num_tokens):
            for i in range(min(4, rows - r)):
                out[t, first_row + r + i] = _row_dot(weights[r + i], x[t])


@njit(cache=True, parallel=True)
def quant_matvec(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """W [R, C] (format ``code``, as blocks [R, R_bytes]) @ x [C] float32 -> [R] float32.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C)) @ x``.
    """
    out = np.empty(blocks.shape[0], np.float32)
    x_sums = _x_sums(code, x)  # [G, 2], shared by every row
    for task in prange(_tasks(blocks.shape[0])):
        _matvec_task(blocks, code, x, x_sums, out, task)
    return out


@njit(cache=True)
def quant_matvec_serial(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """``quant_matvec`` on the calling thread alone, for matrices too small to repay waking a pool."""
    out = np.empty(blocks.shape[0], np.float32)
    x_sums = _x_sums(code, x)
    for task in range(_tasks(blocks.shape[0])):
        _matvec_task(blocks, code, x, x_sums, out, task)
    return out


@njit(cache=True, parallel=True)
def quant_matmul(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ W.T -> [T, R] float32, W [R, C] as in ``quant_matvec``.

    NumPy twin: ``x @ refllm.quant.formats.dequantize(blocks, name, (R, C)).T``.
    """
    out = np.empty((x.shape[0], blocks.shape[0]), np.float32)
    for task in prange(_tasks(blocks.shape[0])):
        _matmul_task(blocks, code, x, out, task)
    return out


@njit(cache=True)
def quant_matmul_serial(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """``quant_matmul`` on the calling thread alone."""
    out = np.empty((x.shape[0], blocks.shape[0]), np.float32)
    for task in range(_tasks(blocks.shape[0])):
        _matmul_task(blocks, code, x, out, task)
    return out


@njit(cache=True, fastmath=SUM_FASTMATH)
def _row_dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """a [C] . b [C] float32."""
    total = np.float32(0.0)
    for i in range(a.shape[0]):
        total += a[i] * b[i]
    return total


@njit(cache=True, parallel=True)
def dequantize_rows(blocks: np.ndarray, code: int, num_cols: int) -> np.ndarray:
    """blocks [R, R_bytes] in format ``code`` -> W [R, C] float32.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C))``, bit for bit.
    """
    out = np.empty((blocks.shape[0], num_cols), np.float32)
    for r in prange(blocks.shape[0]):
        _decode_row(code, blocks[r], out[r])
    return out
