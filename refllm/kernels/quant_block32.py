"""The 32-weight block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, as the quantized products read them.

Group g is block g: L = 16 lanes, lane j yields weights j and j + 16 (``block32_layout``). Per
format, ``<format>_params``, ``<format>_lane`` and ``<format>_lanes16`` as ``quant_walks.py``
describes them; each ``_lane`` gives its block's byte layout.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from refllm.kernels.intrinsics import add16, bits16, broadcast16, byte_bits16, int8s16, multiply_add16
from refllm.kernels.quant_fields import NO_OFFSET, bit, byte_at, f16, nibbles, u32


@njit(cache=True)
def block32_layout(g: int) -> tuple[int, int, int]:
    return 32 * g, 16, 16


@njit(cache=True, inline="always")
def _scale_params(row: np.ndarray, offset: int) -> tuple:
    """The params of a block whose weights are d * q, with the float16 d at byte ``offset``."""
    d = f16(row, offset)
    return d, NO_OFFSET, d, NO_OFFSET, 0


@njit(cache=True, inline="always")
def q4_0_params(row: np.ndarray, g: int) -> tuple:
    return _scale_params(row, 18 * g)


@njit(cache=True)
def q4_0_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-17 qs: byte j holds q_j (low nibble), q_{j+16} (high); w = d * (q - 8)."""
    low, high = nibbles(byte_at(row, 18 * g + 2 + j))
    return low - np.float32(8.0), high - np.float32(8.0)


@njit(cache=True)
def q4_0_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    """Lanes lane .. lane + 15 of ``q4_0_lane`` at once, as vectors (and so for each format)."""
    at, minus_eight = 18 * g + 2 + lane, broadcast16(np.float32(-8.0))
    return add16(byte_bits16(row, at, 0, 15), minus_eight), add16(byte_bits16(row, at, 4, 15), minus_eight)


@njit(cache=True, inline="always")
def q4_1_params(row: np.ndarray, g: int) -> tuple:
    d, m = f16(row, 20 * g), f16(row, 20 * g + 2)
    return d, m, d, m, 0


@njit(cache=True)
def q4_1_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 m | 4-19 qs as Q4_0; w = d * q + m."""
    return nibbles(byte_at(row, 20 * g + 4 + j))


@njit(cache=True)
def q4_1_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    at = 20 * g + 4 + lane
    return byte_bits16(row, at, 0, 15), byte_bits16(row, at, 4, 15)


@njit(cache=True, inline="always")
def q5_0_params(row: np.ndarray, g: int) -> tuple:
    d = f16(row, 22 * g)
    return d, NO_OFFSET, d, NO_OFFSET, u32(row, 22 * g + 2)


@njit(cache=True)
def q5_0_lane(row: np.ndarray, g: int, j: int, qh: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-5 qh: bit i is bit 4 of q_i | 6-21 qs as Q4_0; w = d * (q - 16)."""
    low, high = nibbles(byte_at(row, 22 * g + 6 + j))
    sixteen = np.float32(16.0)
    return low + sixteen * bit(qh, j) - sixteen, high + sixteen * bit(qh, j + 16) - sixteen


@njit(cache=True)
def q5_0_lanes16(row: np.ndarray, g: int, lane: int, qh: int) -> tuple:
    at, sixteen, minus_sixteen = 22 * g + 6 + lane, broadcast16(np.float32(16.0)), broadcast16(np.float32(-16.0))
    low = add16(multiply_add16(sixteen, bits16(qh, lane), byte_bits16(row, at, 0, 15)), minus_sixteen)
    return low, add16(multiply_add16(sixteen, bits16(qh, lane + 16), byte_bits16(row, at, 4, 15)), minus_sixteen)


@njit(cache=True, inline="always")
def q5_1_params(row: np.ndarray, g: int) -> tuple:
    d, m = f16(row, 24 * g), f16(row, 24 * g + 2)
    return d, m, d, m, u32(row, 24 * g + 4)


@njit(cache=True)
def q5_1_lane(row: np.ndarray, g: int, j: int, qh: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-3 m | 4-7 qh as Q5_0 | 8-23 qs as Q4_0; w = d * q + m."""
    low, high = nibbles(byte_at(row, 24 * g + 8 + j))
    return low + np.float32(16.0) * bit(qh, j), high + np.float32(16.0) * bit(qh, j + 16)


@njit(cache=True)
def q5_1_lanes16(row: np.ndarray, g: int, lane: int, qh: int) -> tuple:
    at, sixteen = 24 * g + 8 + lane, broadcast16(np.float32(16.0))
    return (
        multiply_add16(sixteen, bits16(qh, lane), byte_bits16(row, at, 0, 15)),
        multiply_add16(sixteen, bits16(qh, lane + 16), byte_bits16(row, at, 4, 15)),
    )


@njit(cache=True, inline="always")
def q8_0_params(row: np.ndarray, g: int) -> tuple:
    return _scale_params(row, 34 * g)


@njit(cache=True)
def q8_0_lane(row: np.ndarray, g: int, j: int, bits: int) -> tuple[np.float32, np.float32]:
    """bytes 0-1 d | 2-33 int8 q_j at byte 2 + j; w = d * q."""
    return np.float32(np.int8(byte_at(row, 34 * g + 2 + j))), np.float32(np.int8(byte_at(row, 34 * g + 18 + j)))


@njit(cache=True)
def q8_0_lanes16(row: np.ndarray, g: int, lane: int, bits: int) -> tuple:
    return int8s16(row, 34 * g + 2 + lane), int8s16(row, 34 * g + 18 + lane)
