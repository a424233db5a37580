"""ggml's block layouts (``ggml-common.h``) as NumPy structured dtypes, and float16 as the x86 kernels round it.

A row of a quantized tensor is a run of blocks; ``as_blocks`` views [..., nb * type_size] bytes as [..., nb]
records whose fields read as in C (``blocks["d"]``, ``blocks["qs"]``). Q8_0, Q8_1 and Q8_K are the
activation formats the quantized dot products take: Q8_1 keeps ``s = d * sum(qs)`` for the formats with an
offset, Q8_K a float32 scale and the sums of each 16 quants (``bsums``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

QK_K = 256


@dataclass(frozen=True)
class Block:
    size: int  # weights per block
    dtype: np.dtype  # the C struct, field by field

    @property
    def type_size(self) -> int:
        return self.dtype.itemsize


def _struct(*fields) -> np.dtype:
    return np.dtype(list(fields))


_HALF = "<f2"
BLOCKS = {
    "Q4_0": Block(32, _struct(("d", _HALF), ("qs", "u1", 16))),
    "Q4_1": Block(32, _struct(("d", _HALF), ("m", _HALF), ("qs", "u1", 16))),
    "Q5_0": Block(32, _struct(("d", _HALF), ("qh", "<u4"), ("qs", "u1", 16))),
    "Q5_1": Block(32, _struct(("d", _HALF), ("m", _HALF), ("qh", "<u4"), ("qs", "u1", 16))),
    "Q8_0": Block(32, _struct(("d", _HALF), ("qs", "i1", 32))),
    "Q8_1": Block(32, _struct(("d", _HALF), ("s", _HALF), ("qs", "i1", 32))),
    "Q2_K": Block(QK_K, _struct(("scales", "u1", 16), ("qs", "u1", 64), ("d", _HALF), ("dmin", _HALF))),
    "Q3_K": Block(QK_K, _struct(("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", _HALF))),
    "Q4_K": Block(QK_K, _struct(("d", _HALF), ("dmin", _HALF), ("scales", "u1", 12), ("qs", "u1", 128))),
    "Q5_K": Block(QK_K, _struct(("d", _HALF), ("dmin", _HALF), ("scales", "u1", 12), ("qh", "u1", 32),
                                ("qs", "u1", 128))),
    "Q6_K": Block(QK_K, _struct(("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", _HALF))),
    "Q8_K": Block(QK_K, _struct(("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", QK_K // 16))),
}  # fmt: skip
TYPE_IDS = {name: int(GGMLQuantizationType[name]) for name in BLOCKS}


def type_name(type_id: int) -> str:
    return GGMLQuantizationType(type_id).name


def as_blocks(raw: np.ndarray, name: str) -> np.ndarray:
    """[..., nb * type_size] uint8 -> [..., nb] records of ``name``'s block (a view)."""
    raw = np.ascontiguousarray(raw, np.uint8)
    return raw.view(BLOCKS[name].dtype)


def as_bytes(blocks: np.ndarray) -> np.ndarray:
    """[..., nb] records -> [..., nb * type_size] uint8 (a view)."""
    return np.ascontiguousarray(blocks).view(np.uint8)


def f16_round(x) -> np.ndarray:
    """float32 -> float16 -> float32: F16C's ``vcvtps2ph`` rounds to nearest, ties to even, as NumPy does."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def half(field: np.ndarray) -> np.ndarray:
    """A float16 field as float32 (exact)."""
    return field.astype(np.float32)


# ---- bit fields of the K-quants, shared by their kernels ------------------------------------------


def fields(raw: np.ndarray, width: int, count: int) -> np.ndarray:
    """[..., n] bytes -> [..., count, n] int64: field i of each byte is its bits width*i .. width*(i+1) - 1."""
    shifts = (width * np.arange(count))[:, None]
    return (raw[..., None, :].astype(np.int64) >> shifts) & ((1 << width) - 1)


def runs(field: np.ndarray, size: int) -> np.ndarray:
    """[..., n] -> [..., n / size, size]."""
    return field.reshape(*field.shape[:-1], -1, size)


def flat(values: np.ndarray, lead: int) -> np.ndarray:
    """Keep the first ``lead`` axes, flatten the rest (one super-block's weights in order)."""
    return values.reshape(*values.shape[:lead], -1)


def pair_sums(x: np.ndarray) -> np.ndarray:
    """[..., 2n] -> [..., n]: x[2i] + x[2i+1]."""
    return runs(x, 2).sum(axis=-1)


def k4_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K ``scales`` [..., 12] -> 6-bit scales and mins [..., 8] (``get_scale_min_k4``)."""
    q = packed.astype(np.int64)
    low, mid, high = q[..., 0:4], q[..., 4:8], q[..., 8:12]
    scales = np.concatenate([low & 63, (high & 15) | (low >> 6) << 4], axis=-1)
    mins = np.concatenate([mid & 63, (high >> 4) | (mid >> 6) << 4], axis=-1)
    return scales, mins


def q3_scales(packed: np.ndarray) -> np.ndarray:
    """Q3_K ``scales`` [..., 12] -> 16 signed scales: a nibble of bytes 0..7 and two bits of bytes 8..11, - 32."""
    q = packed.astype(np.int64)
    k = np.arange(16)
    low = (q[..., k % 8] >> 4 * (k // 8)) & 15
    high = (q[..., 8 + k % 4] >> 2 * (k // 4)) & 3
    return (low | high << 4) - 32
