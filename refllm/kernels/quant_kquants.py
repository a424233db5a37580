"""The K-quant formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (256-weight super-blocks of sub-blocks),
as the quantized products read them: per format, ``<format>_params``, ``<format>_lane`` and
``<format>_lanes16`` as ``quant_walks.py`` describes them, in two families by how a
super-block's sub-blocks pair up into groups. Each ``_lane`` gives its block's byte layout.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from refllm.kernels.intrinsics import add16, broadcast16, byte_bits16, multiply_add16
from refllm.kernels.quant_fields import NO_OFFSET, bit, byte_at, f16, nibbles

# ---- Q4_K, Q5_K: super-block b = g // 4; group i = g % 4 is sub-blocks 2i (low nibbles), 2i + 1 ----


@njit(cache=True)
def k_pairs_layout(g: int) -> tuple[int, int, int]:
    return 256 * (g // 4) + 64 * (g % 4), 32, 32


@njit(cache=True)
def _k_scale_min(row: np.ndarray, offset: int, s: int) -> tuple[np.float32, np.float32]:
    """6-bit scale and min of sub-block s from the 12 scale bytes at ``offset`` (formats._k_scales_and_mins)."""
    if s < 4:
        return np.float32(row[offset + s] & 63), np.float32(row[offset + s + 4] & 63)
    scale = (np.int64(row[offset + s + 4]) & 15) | (np.int64(row[offset + s - 4]) >> 6) << 4
    minimum = (np.int64(row[offset + s + 4]) >> 4) | (np.int64(row[offset + s]) >> 6) << 4
    return np.float32(scale), np.float32(minimum)


@njit(cache=True, inline="always")
def _k_pair_params(row: np.ndarray, g: int, type_size: int) -> tuple:
    """Sub-blocks 2i and 2i + 1 of a Q4_K/Q5_K super-block: w = (d * scale) q - dmin * min."""
    o = type_size * (g // 4)
    d, dmin = f16(row, o), f16(row, o + 2)
    scale_low, min_low = _k_scale_min(row, o + 4, 2 * (g % 4))
    scale_high, min_high = _k_scale_min(row, o + 4, 2 * (g % 4) + 1)
    return d * scale_low, -(dmin * min_low), d * scale_high, -(dmin * min_high), 0


@njit(cache=True, inline="always")
def q4_k_params(row: np.ndarray, g: int) -> tuple:
    return _k_pair_params(row, g, 144)


@njit(cache=True)
def q4_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 dmin | 4-15 scales | 16-143 qs: byte 32i + j holds q_j of sub-block 2i (low nibble)
    and of sub-block 2i + 1 (high nibble)."""
    return nibbles(byte_at(row, 144 * (g // 4) + 16 + 32 * (g % 4) + j))


@njit(cache=True)
def q4_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    at = 144 * (g // 4) + 16 + 32 * (g % 4) + lane
    return byte_bits16(row, at, 0, 15), byte_bits16(row, at, 4, 15)


@njit(cache=True, inline="always")
def q5_k_params(row: np.ndarray, g: int) -> tuple:
    return _k_pair_params(row, g, 176)


@njit(cache=True)
def q5_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-15 as Q4_K | 16-47 qh: bit k of byte j is bit 4 of weight 32k + j | 48-175 qs as Q4_K."""
    o, i = 176 * (g // 4), g % 4
    low, high = nibbles(byte_at(row, o + 48 + 32 * i + j))
    qh = byte_at(row, o + 16 + j)
    return low + np.float32(16.0) * bit(qh, 2 * i), high + np.float32(16.0) * bit(qh, 2 * i + 1)


@njit(cache=True)
def q5_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    o, i, sixteen = 176 * (g // 4), g % 4, broadcast16(np.float32(16.0))
    at, qh = o + 48 + 32 * i + lane, o + 16 + lane
    return (
        multiply_add16(sixteen, byte_bits16(row, qh, 2 * i, 1), byte_bits16(row, at, 0, 15)),
        multiply_add16(sixteen, byte_bits16(row, qh, 2 * i + 1, 1), byte_bits16(row, at, 4, 15)),
    )


# ---- Q2_K, Q3_K, Q6_K: 16 sub-blocks of 16. Weight 128h + 32s + l (sub-block 8h + 2s + l // 16) takes
# bits from byte l of half h, so sub-blocks s and s + 2 share bytes: group g is super-block g // 8,
# half h, s in {0, 1} and part p = l // 16; lane j = l % 16 yields s's weight and s + 2's. -------------


@njit(cache=True)
def k_quads_layout(g: int) -> tuple[int, int, int]:
    h, s, p = _k_quad(g)
    return 256 * (g // 8) + 128 * h + 32 * s + 16 * p, 64, 16


@njit(cache=True)
def _k_quad(g: int) -> tuple[int, int, int]:
    """Group g -> (half h, sub-block pair s, part p) within its super-block."""
    return g % 8 // 4, g % 4 // 2, g % 2


@njit(cache=True, inline="always")
def q2_k_params(row: np.ndarray, g: int) -> tuple:
    o = 84 * (g // 8)
    h, s, p = _k_quad(g)
    d, dmin = f16(row, o + 80), f16(row, o + 82)
    first, second = row[o + 8 * h + 2 * s + p], row[o + 8 * h + 2 * s + 4 + p]  # scale | min << 4
    return (
        d * np.float32(first & 15), -(dmin * np.float32(first >> 4)),
        d * np.float32(second & 15), -(dmin * np.float32(second >> 4)), 0,
    )  # fmt: skip


@njit(cache=True)
def q2_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-15 scale | min << 4 per sub-block | 16-79 qs: weight 128h + 32s + l is bits 2s..2s+1 of
    byte 16 + 32h + l | 80-81 d | 82-83 dmin; w = d * scale * q - dmin * min."""
    h, s, p = _k_quad(g)
    q = byte_at(row, 84 * (g // 8) + 16 + 32 * h + 16 * p + j)
    return np.float32((q >> (2 * s)) & 3), np.float32((q >> (2 * s + 4)) & 3)


@njit(cache=True)
def q2_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    at = 84 * (g // 8) + 16 + 32 * h + 16 * p + lane
    return byte_bits16(row, at, 2 * s, 3), byte_bits16(row, at, 2 * s + 4, 3)


@njit(cache=True)
def _q3_k_scale(row: np.ndarray, offset: int, sub: int) -> np.float32:
    """Signed 6-bit scale of sub-block ``sub`` from the 12 bytes at ``offset`` (formats._q3_k_scales)."""
    low = np.int64(row[offset + sub]) & 15 if sub < 8 else np.int64(row[offset + sub - 8]) >> 4
    high = (np.int64(row[offset + 8 + sub % 4]) >> (2 * (sub // 4))) & 3
    return np.float32(np.int8(low | high << 4) - np.int8(32))


@njit(cache=True, inline="always")
def q3_k_params(row: np.ndarray, g: int) -> tuple:
    o = 110 * (g // 8)
    h, s, p = _k_quad(g)
    d = f16(row, o + 108)
    first, second = _q3_k_scale(row, o + 96, 8 * h + 2 * s + p), _q3_k_scale(row, o + 96, 8 * h + 2 * s + 4 + p)
    return d * first, NO_OFFSET, d * second, NO_OFFSET, 0


@njit(cache=True)
def q3_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-31 hmask: bit k of byte l is bit 2 of weight 32k + l, a clear bit meaning q -= 4 |
    32-95 qs: bits 0-1 as Q2_K | 96-107 scales | 108-109 d; w = d * scale * q."""
    h, s, p = _k_quad(g)
    o = 110 * (g // 8)
    q, mask = byte_at(row, o + 32 + 32 * h + 16 * p + j), byte_at(row, o + 16 * p + j)
    first = np.float32((q >> (2 * s)) & 3) - np.float32(4.0) * (np.float32(1.0) - bit(mask, 4 * h + s))
    second = np.float32((q >> (2 * s + 4)) & 3) - np.float32(4.0) * (np.float32(1.0) - bit(mask, 4 * h + s + 2))
    return first, second


@njit(cache=True)
def q3_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    o, four, minus_four = 110 * (g // 8), broadcast16(np.float32(4.0)), broadcast16(np.float32(-4.0))
    q, mask = o + 32 + 32 * h + 16 * p + lane, o + 16 * p + lane
    first = multiply_add16(four, byte_bits16(row, mask, 4 * h + s, 1), byte_bits16(row, q, 2 * s, 3))
    second = multiply_add16(four, byte_bits16(row, mask, 4 * h + s + 2, 1), byte_bits16(row, q, 2 * s + 4, 3))
    return add16(first, minus_four), add16(second, minus_four)


@njit(cache=True, inline="always")
def q6_k_params(row: np.ndarray, g: int) -> tuple:
    o = 210 * (g // 8)
    h, s, p = _k_quad(g)
    d = f16(row, o + 208)
    first, second = np.int8(row[o + 192 + 8 * h + 2 * s + p]), np.int8(row[o + 192 + 8 * h + 2 * s + 4 + p])
    return d * np.float32(first), NO_OFFSET, d * np.float32(second), NO_OFFSET, 0


@njit(cache=True)
def q6_k_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-127 ql: bits 0-3 of weight 128h + 32s + l are the low (s < 2) or high nibble of
    byte 64h + 32(s % 2) + l | 128-191 qh: bits 4-5 are bits 2s..2s+1 of byte 128 + 32h + l |
    192-207 int8 scales | 208-209 d; w = (d * scale) * (q - 32)."""
    h, s, p = _k_quad(g)
    o = 210 * (g // 8)
    low, high = nibbles(byte_at(row, o + 64 * h + 32 * s + 16 * p + j))
    qh = byte_at(row, o + 128 + 32 * h + 16 * p + j)
    first = low + np.float32(16.0) * np.float32((qh >> (2 * s)) & 3) - np.float32(32.0)
    second = high + np.float32(16.0) * np.float32((qh >> (2 * s + 4)) & 3) - np.float32(32.0)
    return first, second


@njit(cache=True)
def q6_k_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    h, s, p = _k_quad(g)
    o, sixteen, minus_32 = 210 * (g // 8), broadcast16(np.float32(16.0)), broadcast16(np.float32(-32.0))
    ql, qh = o + 64 * h + 32 * s + 16 * p + lane, o + 128 + 32 * h + 16 * p + lane
    first = multiply_add16(sixteen, byte_bits16(row, qh, 2 * s, 3), byte_bits16(row, ql, 0, 15))
    second = multiply_add16(sixteen, byte_bits16(row, qh, 2 * s + 4, 3), byte_bits16(row, ql, 4, 15))
    return add16(first, minus_32), add16(second, minus_32)
