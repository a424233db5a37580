"""Readers of the fields of GGML's quantized blocks, from a row of bytes: what the formats'
``params`` and ``lane`` functions (``quant_block32.py``, ``quant_kquants.py``) share."""

from __future__ import annotations

import numpy as np
from numba import njit

# The offset c of a format whose weights have none (w = a q): -0.0, because x + -0.0 == x for every
# x, signed zeros included, so a q + c is then exactly the spec's a q.
NO_OFFSET = np.float32(-0.0)


# float16 bits -> float32, as NumPy converts them (NaN payloads included). One
# table load per scale is cheaper than decoding exponent and mantissa in scalar
# code, and the scales of a real tensor touch only a few of its cache lines.
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True)
def f16(row: np.ndarray, offset: int) -> np.float32:
    """The little-endian float16 at byte ``offset`` of ``row``, as float32."""
    return _F16_TO_F32[np.int64(row[offset]) | np.int64(row[offset + 1]) << 8]


@njit(cache=True)
def byte_at(row: np.ndarray, index: int) -> int:
    """row[index] for index >= 0. The unsigned index spares Numba's negative-index wraparound, a per-lane
    select that keeps LLVM from seeing that consecutive lanes read consecutive bytes (it then
    loads them one by one)."""
    return row[np.uint64(index)]


@njit(cache=True)
def nibbles(byte: int) -> tuple[np.float32, np.float32]:
    """A byte's low and high nibble, as float32.

    Split in float arithmetic (exact for these small integers): LLVM then keeps
    16 lanes of 32 bits per AVX-512 register. The integer split (& 15, >> 4)
    is typed int64 by Numba and vectorises 8 lanes at a time.
    """
    value = np.float32(byte)
    high = np.floor(value * np.float32(0.0625))
    return value - np.float32(16.0) * high, high


@njit(cache=True)
def bit(value: int, k: int) -> np.float32:
    """Bit k of ``value``, as float32 (0.0 or 1.0)."""
    return np.float32((value >> k) & 1)


@njit(cache=True)
def u32(row: np.ndarray, offset: int) -> int:
    """The little-endian uint32 at byte ``offset`` of ``row``."""
    value = 0
    for i in range(4):
        value |= np.int64(row[offset + i]) << (8 * i)
    return value
