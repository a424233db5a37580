"""ggml's CPU quantizers of activations, as the x86 build runs them (``ggml-cpu/arch/x86/quants.c``).

A matrix product with a quantized weight first quantizes each float32 activation row to its ``vec_dot``
type, block by block:

    Q8_0, Q8_1 (blocks of 32; AVX2 path):  amax = max |x|,  d = amax / 127,  q = round(x * (127 / amax))
        d is stored as float16 (round to nearest even); q rounds the float32 product to nearest, ties to
        even (``vroundps``), and ``127 / amax`` is its own division, not 1 / d. Q8_1 also stores
        s = float16(d * sum(q)), with the float32 d.
    Q8_K (blocks of 256; the scalar ``quantize_row_q8_K_ref``):  m = the x of largest |x| (the first, on
        ties),  scale = -127 / m,  q = min(127, round(scale * x)),  d = 1 / scale (float32)
        round() adds 1.5 * 2**23 and keeps the low bits: ties to even; bsums holds each 16 q's sum.

Shapes: [..., n] float32 -> [..., n / B * type_size] uint8, B = 32 or 256.
"""

from __future__ import annotations

import numpy as np

from refllm.testing.ggml.blocks import BLOCKS, QK_K, as_bytes, f16_round


def _blocks_of(x: np.ndarray, size: int) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _q8_32(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared part of Q8_0 and Q8_1 -> (records, float32 d, int quants)."""
    x = _blocks_of(x, 32)
    amax = np.abs(x).max(axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(x * inverse[..., None]), -128, 127).astype(np.int32)
    blocks = np.zeros(x.shape[:-1], BLOCKS[name].dtype)
    blocks["d"], blocks["qs"] = d.astype(np.float16), q
    return blocks, d, q


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    return as_bytes(_q8_32(x, "Q8_0")[0])


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    blocks, d, q = _q8_32(x, "Q8_1")
    blocks["s"] = f16_round(d * q.sum(axis=-1).astype(np.float32))
    return as_bytes(blocks)


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    x = _blocks_of(x, QK_K)
    first_largest = np.abs(x).argmax(axis=-1)[..., None]
    largest = np.take_along_axis(x, first_largest, axis=-1)[..., 0]
    blocks = np.zeros(x.shape[:-1], BLOCKS["Q8_K"].dtype)
    live = largest != 0
    with np.errstate(divide="ignore"):
        scale = np.where(live, np.float32(-127) / largest, np.float32(0)).astype(np.float32)
        d = np.where(live, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint(scale[..., None] * x)).astype(np.int32)
    blocks["d"], blocks["qs"] = d, q
    blocks["bsums"] = q.reshape(*q.shape[:-1], QK_K // 16, 16).sum(axis=-1)
    return as_bytes(blocks)


QUANTIZERS = {"Q8_0": quantize_q8_0, "Q8_1": quantize_q8_1, "Q8_K": quantize_q8_k}
