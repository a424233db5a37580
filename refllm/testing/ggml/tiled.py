"""ggml's tiled K-quant matrix products (``ggml-cpu/tiled/``), as the x86 AVX-512 VNNI build runs them.

A MUL_MAT of an unrepacked Q2_K, Q3_K, Q4_K, Q5_K or Q6_K weight W [N, K] with float32 activations X [T, K]
takes this path when T >= 8 (``dispatch.py``). Each row of X is first quantized to Q8_K, block by block of
256, with ``quantize_row_q8_K_ref`` (``quantizers.quantize_q8_k``); a thread quantizes a run of whole
blocks, so the split between threads changes nothing.

The driver cuts the output into windows of up to 256 x 256 and those into 16 x 16 micro-tiles; on this
build (``__AVX512VNNI__``, ``__AVX512VL__``, ``__AVX512DQ__``) a micro-tile is two 8-row bands of
``vpdpbusd`` (the AVX2 micro-kernel, with its +128 activation bias, is compiled but not used). All of that
only chooses which outputs are computed together: every output (n, t) is computed by one thread, from
K-block 0 to the last, in this order (the narrow path, for windows of at most 16 tokens, unpacks several
K-blocks at once but runs them in the same order with the same arithmetic). So the result depends neither
on T, N and their ragged edges nor on the thread count.

Per output and K-block b, with the weight's codes c[e] (unsigned, as stored), its S sub-blocks of 16 or 32
(their integer scales s[i], mins m[i], a bias B that makes c - B the signed weight), and the Q8_K block's
quants a[e], its d_a (float32) and the sums g[i] of its quants over sub-block i:

    raw[i] = sum_{e in i} c[e] * a[e]                               exact int32 (vpdpbusd)
    s1 = sum_i s[i] * (raw[i] - B * g[i]),   s2 = sum_i m[i] * g[i]  exact int32
    r = float32(s1) * d_w                         vcvtdq2ps, vmulps: two roundings (|s1| may pass 2**24)
    r = fma(-dmin_w, float32(s2), r)              vfnmadd, one rounding (formats with mins only)
    acc = fma(r, d_a, acc)                        one rounding: gcc contracts ``buf + r * d_a`` (vfmadd213ps)

starting from acc = 0; the output is acc after the last block. d_w and dmin_w are the weight block's
float16 factors, exact in float32; unlike vec_dot, d_w is not multiplied by d_a first.

Codes, scales and mins per format (element order as in ``kquant_dots``, whose unpacking this reuses):

    Q2_K: c = 2 bits (0..3), B = 0, 16 sub-blocks of 16, s = low nibble, m = high nibble of scales[i]
    Q3_K: c = 2 bits | hmask bit << 2 (0..7), B = 4, 16 of 16, s = the 6-bit scale - 32, no mins
    Q4_K: c = nibble, B = 0, 8 of 32, the 6-bit scales and mins (``get_scale_min_k4``)
    Q5_K: c = nibble | qh bit << 4, B = 0, 8 of 32, as Q4_K
    Q6_K: c = ql nibble | 2 qh bits << 4 (0..63), B = 32, 16 of 16, s = the int8 scales, no mins

Shapes: weights [N, nb * type_size] uint8 (the file's blocks), x [T, nb * 256] float32 -> [T, N] float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.testing.ggml.arith import fma32
from refllm.testing.ggml.blocks import (
    as_blocks, fields, flat, half, k4_scales_mins, pair_sums, q3_scales, runs,
)  # fmt: skip
from refllm.testing.ggml.quantizers import quantize_q8_k


@dataclass(frozen=True)
class Format:
    subblock: int  # weights per scale: 16 or 32
    bias: int  # B: the signed weight is code - B
    unpack: Callable  # blocks [N, nb] -> (codes [N, nb, 256], scales [N, nb, S], mins [N, nb, S] or None)


def _two_bits(w: np.ndarray) -> np.ndarray:
    return flat(fields(runs(w["qs"], 32), 2, 4), 2)


def _nibbles(w: np.ndarray) -> np.ndarray:
    return flat(fields(runs(w["qs"], 32), 4, 2), 2)


def _high_bit(w: np.ndarray, field: str) -> np.ndarray:
    return flat(fields(w[field], 1, 8), 2)


def _q2_k(w):
    return _two_bits(w), w["scales"] & 15, w["scales"] >> 4


def _q3_k(w):
    return _two_bits(w) | _high_bit(w, "hmask") << 2, q3_scales(w["scales"]), None


def _q4_k(w):
    return (_nibbles(w), *k4_scales_mins(w["scales"]))


def _q5_k(w):
    return (_nibbles(w) | _high_bit(w, "qh") << 4, *k4_scales_mins(w["scales"]))


def _q6_k(w):
    low = flat(fields(runs(w["ql"], 64), 4, 2), 2)
    high = flat(fields(runs(w["qh"], 32), 2, 4), 2)
    return low | high << 4, w["scales"], None


FORMATS = {
    "Q2_K": Format(16, 0, _q2_k),
    "Q3_K": Format(16, 4, _q3_k),
    "Q4_K": Format(32, 0, _q4_k),
    "Q5_K": Format(32, 0, _q5_k),
    "Q6_K": Format(16, 32, _q6_k),
}
TILED_TYPES = tuple(FORMATS)


def _sub_block_dots(codes: np.ndarray, quants: np.ndarray, subblock: int) -> np.ndarray:
    """codes [N, 256] and quants [T, 256] of one K-block -> raw [N, T, S], the exact integer dot product of
    each sub-block (through float64, exact: every sum is far below 2**53)."""
    c = runs(codes, subblock).astype(np.float64).transpose(1, 0, 2)  # [S, N, sub]
    q = runs(quants, subblock).astype(np.float64).transpose(1, 2, 0)  # [S, sub, T]
    return np.matmul(c, q).transpose(1, 2, 0).astype(np.int64)


def _block_term(fmt: Format, w: np.ndarray, unpacked: tuple, a: np.ndarray, b: int) -> np.ndarray:
    """r [N, T]: K-block b's share of every output before the activation's d_a (float32)."""
    codes, scales, mins = unpacked
    sums = a["bsums"][:, b].astype(np.int64)  # [T, 16]: per 16 quants
    if fmt.subblock == 32:
        sums = pair_sums(sums)
    raw = _sub_block_dots(codes[:, b], a["qs"][:, b], fmt.subblock)  # [N, T, S]
    s1 = np.einsum("ns,nts->nt", scales[:, b].astype(np.int64), raw - fmt.bias * sums[None])
    r = s1.astype(np.float32) * half(w["d"][:, b, None])
    if mins is None:
        return r
    s2 = mins[:, b].astype(np.int64) @ sums.T  # [N, T]
    return fma32(-half(w["dmin"][:, b, None]), s2.astype(np.float32), r)


def tiled_product(weight_type: str, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W [N, row bytes] (``weight_type``'s blocks) times X [T, K] float32 -> [T, N] float32, as the tiled
    kernels compute it (any thread count)."""
    fmt = FORMATS[weight_type]
    w = as_blocks(weights, weight_type)  # [N, nb]
    a = as_blocks(quantize_q8_k(x), "Q8_K")  # [T, nb]
    unpacked = fmt.unpack(w)
    acc = np.zeros((len(w), len(a)), np.float32)
    for b in range(w.shape[1]):
        acc = fma32(_block_term(fmt, w, unpacked, a, b), a["d"][None, :, b], acc)
    return acc.T.copy()
