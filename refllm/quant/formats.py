"""GGML block formats and their dequantization: the NumPy spec.

A quantized tensor is a row-major run of blocks; a block holds ``block_size``
consecutive weights of one row in ``type_size`` bytes (a row is a whole number
of blocks). Each ``dequantize_*`` function below turns ``[N, type_size]`` uint8
blocks into ``[N, block_size]`` weights (float32, or float64 for ground truth:
the same operations, rounded to 53 bits instead of 24), vectorised over the N blocks,
and documents its block beside the code. The byte layouts are ggml's
(``ggml-common.h``); the float arithmetic is done in the same order as
``gguf.quants`` does it, so the results agree bit for bit.

All multi-byte fields are little-endian. ``d`` is a block's scale and ``dmin``
(or ``m``) its offset, stored as float16. The K-quants pack 256 weights into
sub-blocks of 16 or 32, each with its own small integer scale (and min) that
multiplies ``d`` (and ``dmin``).

Dimension letters: N blocks, B weights per block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

QK_K = 256  # weights in a K-quant super-block


class UnsupportedFormatError(ValueError):
    """A GGML tensor type this module cannot dequantize."""


# How a quantized matrix meets its inputs in the kernels: in float32 (the default: the spec's product
# to float32 rounding), or quantized to 8 bits per block of 32 for integer dot products
# (refllm/kernels/int8_matmul.py; Q4_0, Q4_1 and Q8_0 matrices, the others stay float32).
ACTIVATIONS = ("float32", "int8")


@dataclass(frozen=True)
class BlockFormat:
    name: str  # ggml's name, as in gguf.GGMLQuantizationType
    block_size: int  # B: weights per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[..., np.ndarray]  # ([N, type_size] uint8, dtype) -> [N, B] in dtype


# ---- bit-unpacking helpers shared by several formats -------------------------------------------


def _f16(field: np.ndarray, dtype) -> np.ndarray:
    """[N, 2] uint8 bytes of a float16 -> [N, 1] in ``dtype`` (exact: a float16 is a float32 and a float64)."""
    return field.view(np.float16).astype(dtype)


def _nibbles(packed: np.ndarray, group: int) -> np.ndarray:
    """[N, n] bytes -> [N, 2n] 4-bit values.

    Bytes come in groups of ``group``: a group's low nibbles are the next
    ``group`` values, then its high nibbles the ``group`` after them.
    """
    N, n = packed.shape
    grouped = packed.reshape(N, n // group, 1, group)
    return ((grouped >> np.array([0, 4], np.uint8)[:, None]) & 0x0F).reshape(N, 2 * n)


def _crumbs(packed: np.ndarray) -> np.ndarray:
    """[N, 64] bytes -> [N, 256] 2-bit values.

    Two halves of 32 bytes; in half h, value 128h + 32s + l is bits 2s..2s+1 of byte 32h + l.
    """
    N = packed.shape[0]
    halves = packed.reshape(N, 2, 1, 32)
    return ((halves >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 0x03).reshape(N, 256)


def _bit_planes(packed: np.ndarray) -> np.ndarray:
    """[N, 32] bytes -> [N, 256] bits: value 32k + l is bit k of byte l."""
    N = packed.shape[0]
    return ((packed.reshape(N, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(N, 256)


def _little_endian_bits(packed: np.ndarray) -> np.ndarray:
    """[N, 4] bytes of a uint32 -> [N, 32] bits: value i is bit i."""
    return np.unpackbits(packed, axis=-1, bitorder="little")


# ---- unquantized ------------------------------------------------------------------------------


def dequantize_f32(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """F32: one float32 per 4-byte block."""
    return blocks.view(np.float32).astype(dtype)


def dequantize_f16(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """F16: one IEEE float16 per 2-byte block."""
    return _f16(blocks, dtype)


def dequantize_bf16(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """BF16: one bfloat16 (the top 16 bits of a float32) per 2-byte block."""
    return (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(dtype, copy=False)


# ---- 32-weight blocks ---------------------------------------------------------------------------


def dequantize_q4_0(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q4_0, 18 bytes: w = d * (q - 8), q in 0..15.

    bytes 0-1   d    float16
    bytes 2-17  qs   byte j: weight j in the low nibble, weight j + 16 in the high one
    """
    d = _f16(blocks[:, 0:2], dtype)
    q = _nibbles(blocks[:, 2:18], 16).astype(np.int8) - np.int8(8)
    return d * q.astype(dtype)


def dequantize_q4_1(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q4_1, 20 bytes: w = d * q + m, q in 0..15.

    bytes 0-1   d    float16
    bytes 2-3   m    float16
    bytes 4-19  qs   as Q4_0
    """
    d, m = _f16(blocks[:, 0:2], dtype), _f16(blocks[:, 2:4], dtype)
    q = _nibbles(blocks[:, 4:20], 16).astype(dtype)
    return d * q + m


def dequantize_q5_0(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q5_0, 22 bytes: w = d * (q - 16), q in 0..31.

    bytes 0-1   d    float16
    bytes 2-5   qh   uint32: bit i is bit 4 of weight i
    bytes 6-21  qs   bits 0-3, laid out as Q4_0
    """
    d = _f16(blocks[:, 0:2], dtype)
    q = _nibbles(blocks[:, 6:22], 16) | (_little_endian_bits(blocks[:, 2:6]) << 4)
    return d * (q.astype(np.int8) - np.int8(16)).astype(dtype)


def dequantize_q5_1(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q5_1, 24 bytes: w = d * q + m, q in 0..31.

    bytes 0-1   d    float16
    bytes 2-3   m    float16
    bytes 4-7   qh   as Q5_0
    bytes 8-23  qs   as Q5_0
    """
    d, m = _f16(blocks[:, 0:2], dtype), _f16(blocks[:, 2:4], dtype)
    q = _nibbles(blocks[:, 8:24], 16) | (_little_endian_bits(blocks[:, 4:8]) << 4)
    return d * q.astype(dtype) + m


def dequantize_q8_0(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q8_0, 34 bytes: w = d * q.

    bytes 0-1   d    float16
    bytes 2-33  qs   int8 weight j at byte 2 + j
    """
    d = _f16(blocks[:, 0:2], dtype)
    return d * blocks[:, 2:34].view(np.int8).astype(dtype)


# ---- K-quants: 256-weight super-blocks -----------------------------------------------------------


def dequantize_q2_k(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q2_K, 84 bytes: 16 sub-blocks of 16; w = d * scale * q - dmin * min, q in 0..3.

    bytes 0-15   scales  byte s: scale of sub-block s (low nibble), its min (high nibble)
    bytes 16-79  qs      2-bit q, laid out as in ``_crumbs``
    bytes 80-81  d       float16
    bytes 82-83  dmin    float16
    """
    N = blocks.shape[0]
    scales = blocks[:, 0:16]
    d, dmin = _f16(blocks[:, 80:82], dtype), _f16(blocks[:, 82:84], dtype)
    scale = (d * (scales & 0x0F).astype(dtype))[:, :, None]  # [N, 16, 1]
    offset = (dmin * (scales >> 4).astype(dtype))[:, :, None]
    q = _crumbs(blocks[:, 16:80]).reshape(N, 16, 16).astype(dtype)
    return (scale * q - offset).reshape(N, QK_K)


def _q3_k_scales(packed: np.ndarray, dtype) -> np.ndarray:
    """[N, 12] bytes -> [N, 16] signed 6-bit scales (stored + 32).

    Bits 0-3 of scale j: bytes 0-7, low nibbles for j < 8, high nibbles (of byte j - 8) after.
    Bits 4-5 of scale j: bits 2(j // 4) .. 2(j // 4) + 1 of byte 8 + j % 4.
    """
    N = packed.shape[0]
    low = _nibbles(packed[:, 0:8], 8)  # [N, 16]
    high = (packed[:, 8:12].reshape(N, 1, 4) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 0x03
    return ((low | (high.reshape(N, 16) << 4)).astype(np.int8) - np.int8(32)).astype(dtype)


def dequantize_q3_k(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q3_K, 110 bytes: 16 sub-blocks of 16; w = d * scale * q, q in -4..3.

    bytes 0-31    hmask   bit 2 of q, as in ``_bit_planes``; a clear bit means q -= 4
    bytes 32-95   qs      bits 0-1 of q, as in ``_crumbs``
    bytes 96-107  scales  16 signed 6-bit scales, see ``_q3_k_scales``
    bytes 108-109 d       float16
    """
    N = blocks.shape[0]
    d = _f16(blocks[:, 108:110], dtype)
    scale = (d * _q3_k_scales(blocks[:, 96:108], dtype))[:, :, None]  # [N, 16, 1]
    low = _crumbs(blocks[:, 32:96]).astype(np.int8)
    minus_four = ((_bit_planes(blocks[:, 0:32]) ^ 1) << 2).astype(np.int8)
    q = (low - minus_four).reshape(N, 16, 16).astype(dtype)
    return (scale * q).reshape(N, QK_K)


def _k_scales_and_mins(packed: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """[N, 12] bytes -> ([N, 8], [N, 8]) 6-bit scales and mins of Q4_K/Q5_K.

    j < 4:  scale = byte j & 63,  min = byte j + 4 & 63
    j >= 4: scale = (byte j + 4 & 15) | (byte j - 4 >> 6) << 4
            min   = (byte j + 4 >> 4) | (byte j >> 6) << 4
    """
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([first & 63, (third & 0x0F) | ((first >> 6) << 4)], axis=-1)
    mins = np.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales.astype(dtype), mins.astype(dtype)


def dequantize_q4_k(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q4_K, 144 bytes: 8 sub-blocks of 32; w = d * scale * q - dmin * min, q in 0..15.

    bytes 0-1    d       float16
    bytes 2-3    dmin    float16
    bytes 4-15   scales  8 scales and 8 mins of 6 bits, see ``_k_scales_and_mins``
    bytes 16-143 qs      4 groups of 32 bytes: group g holds sub-block 2g (low nibbles), 2g + 1 (high)
    """
    N = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2], dtype), _f16(blocks[:, 2:4], dtype)
    scales, mins = _k_scales_and_mins(blocks[:, 4:16], dtype)
    q = _nibbles(blocks[:, 16:144], 32).reshape(N, 8, 32).astype(dtype)
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(N, QK_K)


def dequantize_q5_k(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q5_K, 176 bytes: 8 sub-blocks of 32; w = d * scale * q - dmin * min, q in 0..31.

    bytes 0-1     d       float16
    bytes 2-3     dmin    float16
    bytes 4-15    scales  as Q4_K
    bytes 16-47   qh      bit 4 of q, as in ``_bit_planes``
    bytes 48-175  qs      bits 0-3 of q, laid out as Q4_K
    """
    N = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2], dtype), _f16(blocks[:, 2:4], dtype)
    scales, mins = _k_scales_and_mins(blocks[:, 4:16], dtype)
    q = _nibbles(blocks[:, 48:176], 32) | (_bit_planes(blocks[:, 16:48]) << 4)
    q = q.reshape(N, 8, 32).astype(dtype)
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(N, QK_K)


def dequantize_q6_k(blocks: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Q6_K, 210 bytes: 16 sub-blocks of 16; w = d * scale * (q - 32), q in 0..63.

    bytes 0-127   ql      bits 0-3 of q: 2 groups of 64 bytes, low nibbles then high nibbles
    bytes 128-191 qh      bits 4-5 of q, as in ``_crumbs``
    bytes 192-207 scales  int8 scale per sub-block
    bytes 208-209 d       float16
    """
    N = blocks.shape[0]
    d = _f16(blocks[:, 208:210], dtype)
    scale = (d * blocks[:, 192:208].view(np.int8).astype(dtype))[:, :, None]  # [N, 16, 1]
    q = _nibbles(blocks[:, 0:128], 64) | (_crumbs(blocks[:, 128:192]) << 4)
    q = (q.astype(np.int8) - np.int8(32)).reshape(N, 16, 16).astype(dtype)
    return (scale * q).reshape(N, QK_K)


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("F32", 1, 4, dequantize_f32),
        BlockFormat("F16", 1, 2, dequantize_f16),
        BlockFormat("BF16", 1, 2, dequantize_bf16),
        BlockFormat("Q4_0", 32, 18, dequantize_q4_0),
        BlockFormat("Q4_1", 32, 20, dequantize_q4_1),
        BlockFormat("Q5_0", 32, 22, dequantize_q5_0),
        BlockFormat("Q5_1", 32, 24, dequantize_q5_1),
        BlockFormat("Q8_0", 32, 34, dequantize_q8_0),
        BlockFormat("Q2_K", QK_K, 84, dequantize_q2_k),
        BlockFormat("Q3_K", QK_K, 110, dequantize_q3_k),
        BlockFormat("Q4_K", QK_K, 144, dequantize_q4_k),
        BlockFormat("Q5_K", QK_K, 176, dequantize_q5_k),
        BlockFormat("Q6_K", QK_K, 210, dequantize_q6_k),
    )
}

# Weights dequantized per call: bounds the temporaries of a large tensor (a 262144 x 640 embedding).
_CHUNK_WEIGHTS = 1 << 18


def block_format(name: str) -> BlockFormat:
    """The BlockFormat called ``name`` (ggml's spelling, e.g. "Q4_K")."""
    if name not in FORMATS:
        raise UnsupportedFormatError(f"tensor type {name} is not supported; supported: {', '.join(FORMATS)}")
    return FORMATS[name]


def stored_size(name: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of ``shape`` (numpy order, rows last-but-one) takes in format ``name``."""
    fmt = block_format(name)
    if not shape or shape[-1] % fmt.block_size:
        raise UnsupportedFormatError(
            f"a {name} tensor's rows must be a whole number of {fmt.block_size}-weight blocks; got shape {shape}"
        )
    return prod(shape) // fmt.block_size * fmt.type_size


def dequantize(raw: np.ndarray, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """The stored bytes of a tensor in format ``name`` -> weights of ``shape`` in ``dtype`` (float32 or float64).

    ``raw`` is any contiguous array over exactly the tensor's bytes (as gguf's
    reader hands them out). The blocks are independent, so they are decoded a
    chunk at a time into the output.
    """
    fmt = block_format(name)
    expected = stored_size(name, shape)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if data.size != expected:
        raise ValueError(f"a {name} tensor of shape {shape} takes {expected} bytes; got {data.size}")
    blocks = data.reshape(-1, fmt.type_size)  # [N, type_size]
    out = np.empty((blocks.shape[0], fmt.block_size), dtype=dtype)  # [N, B]

    chunk = max(1, _CHUNK_WEIGHTS // fmt.block_size)
    for start in range(0, blocks.shape[0], chunk):
        out[start : start + chunk] = fmt.dequantize_blocks(blocks[start : start + chunk], dtype)
    return out.reshape(shape)
