"""ggml's quantized dot products for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) against Q8_K activations, as
the x86 AVX2 build runs them (``ggml_vec_dot_<w>_q8_K`` in ``ggml-cpu/arch/x86/quants.c``, the ``__AVX2__``
branch; AVX-512 builds use it too).

Each format stores super-blocks of 256 weights: integer values w_q[p] (p = 0 .. 255) in sub-blocks of 16 or
32 weights with integer scales s (and, for Q2_K, Q4_K and Q5_K, integer mins m), and float16 factors d_w (and
dmin_w). A Q8_K activation block has a float32 d_a, quants a_q[p] in [-127, 127] and bsums[i], the sum of
a_q[16i .. 16i+15]. The weight is d_w * s * w_q (- dmin_w * m); block b's float32 factors are

    d[b] = d_a * d_w,   dmin[b] = -d_a * dmin_w          one float32 rounding each

Shared structure. The kernel walks a block in 8 chunks of 32 weights (chunk c = p // 32, position e = p % 32)
and keeps 8 int32 lanes; lane k takes the positions e = 4k .. 4k+3 of every chunk, times their sub-block scale:

    lane[b, k] = sum_{c=0}^{7} sum_{e=4k}^{4k+3} s[sub(32c + e)] * w_q[32c + e] * a_q[32c + e]     exact int32
    acc[k] = fma(d[b], lane[b, k], acc[k])   for b = 0 .. nb-1, one float32 rounding per step
    dot = hsum8(acc)

The integer steps are exact: ``vpmaddubsw`` adds two products of unsigned weight bits (at most 63) and a_q,
at most 16002 in magnitude, so int16 never saturates; ``vpmaddwd`` and the int32 sums do not overflow. Each
|lane| is below 2**24 (the largest, Q6_K's, 128 * 32 * 127 * 32), so ``vcvtdq2ps`` is exact, and the float
steps decide every bit. Per format (bit fields of the byte at position e of a 32- or 64-byte run):

    Q2_K: w_q = (qs[32(c//4) + e] >> 2(c%4)) & 3;  s | m << 4 = scales[p // 16]  (16 sub-blocks of 16)
          the mins share acc, fma'd before each block's lanes, in lanes of two sub-blocks:
          acc[k] = fma(dmin[b], m[2k] bsums[2k] + m[2k+1] bsums[2k+1], acc[k]);  then the lanes as above
    Q3_K: w_q = (the 2 bits as Q2_K) - 4 (1 - h),  h = bit c of hmask[e]  (two vpmaddubsw, subtracted in int16);
          s[i] = ((scales[i%8] >> 4(i//8)) & 15 | ((scales[8 + i%4] >> 2(i//4)) & 3) << 4) - 32  (16 of 16)
    Q4_K: w_q = (qs[32(c//2) + e] >> 4(c%2)) & 15;  6-bit s[c] and m[c] per chunk (``get_scale_min_k4``)
          the mins in a second, 4-lane accumulator, with the chunk sums g[c] = bsums[2c] + bsums[2c+1]:
          acc_m[k] = fma(dmin[b], m[2k] g[2k] + m[2k+1] g[2k+1], acc_m[k]);
          dot = hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
    Q5_K: w_q = (as Q4_K) + 16 h,  h = bit c of qh[e];  the mins as one scalar, block by block:
          summs = fma(dmin[b], sum_c m[c] g[c], summs)  (gcc contracts ``summs += dmin * isum``: vfmadd231ss);
          dot = hsum8(acc) + summs
    Q6_K: w_q = u - 32,  u = lo | hi << 4,  lo = (ql[64(c//4) + 32(c%2) + e] >> 4((c%4)//2)) & 15,
          hi = (qh[32(c//4) + e] >> 2(c%4)) & 3;  s = int8 scales[p // 16];  the -32 enters through bsums,
          in lanes of two sub-blocks, not in the product lanes:
          lane[b, k] = (the lane sum above, with u for w_q) - 32 (s[2k] bsums[2k] + s[2k+1] bsums[2k+1])

Shapes: weights [R, nb * type_size] uint8, activations [nb * 292] uint8 (Q8_K) -> [R] float32.
"""

from __future__ import annotations

import numpy as np

from refllm.testing.ggml.arith import fma32, hsum8
from refllm.testing.ggml.blocks import (
    QK_K, as_blocks, fields, flat, half, k4_scales_mins, pair_sums, q3_scales, runs,
)  # fmt: skip


def _lanes(w_q: np.ndarray, scales: np.ndarray, a_q: np.ndarray) -> np.ndarray:
    """w_q [R, nb, 256] times their sub-block scales [R, nb, S] times a_q [nb, 256] -> [R, nb, 8] exact
    integer lanes: lane k sums the positions p with p % 32 in 4k .. 4k+3."""
    per_weight = np.repeat(scales.astype(np.int64), QK_K // scales.shape[-1], axis=-1)
    products = w_q * per_weight * a_q.astype(np.int64)
    return runs(runs(products, 32), 4).sum(axis=(-3, -1))


def _factor(a: np.ndarray, field: np.ndarray) -> np.ndarray:
    """d_a [nb] float32 times a float16 field [R, nb]: one float32 rounding."""
    return a["d"] * half(field)


def _accumulate(*terms: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """acc = 0, then for each block b and each (factor [R, nb], lanes [R, nb, L]) in turn:
    acc = fma(factor[:, b], lanes[:, b], acc) -> [R, L]."""
    rows, blocks, width = terms[0][1].shape
    acc = np.zeros((rows, width), np.float32)
    for b in range(blocks):
        for factor, lanes in terms:
            acc = fma32(factor[:, b, None], lanes[:, b].astype(np.float32), acc)
    return acc


def _q2_k(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    w_q = flat(fields(runs(w["qs"], 32), 2, 4), 2)
    scales, mins = w["scales"] & 15, (w["scales"] >> 4).astype(np.int64)
    min_lanes = pair_sums(mins * a["bsums"])
    d, dmin = _factor(a, w["d"]), -_factor(a, w["dmin"])
    return hsum8(_accumulate((dmin, min_lanes), (d, _lanes(w_q, scales, a["qs"]))))


def _q3_k(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    low = flat(fields(runs(w["qs"], 32), 2, 4), 2)
    high = flat(fields(w["hmask"], 1, 8), 2)
    lanes = _lanes(low - 4 * (1 - high), q3_scales(w["scales"]), a["qs"])
    return hsum8(_accumulate((_factor(a, w["d"]), lanes)))


def _q45_k(w: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What Q4_K and Q5_K share -> (hsum8 of the scaled lanes, dmin [R, nb], mins [R, nb, 8],
    chunk sums g [nb, 8])."""
    w_q = flat(fields(runs(w["qs"], 32), 4, 2), 2)
    if "qh" in w.dtype.names:
        w_q = w_q + 16 * flat(fields(w["qh"], 1, 8), 2)
    scales, mins = k4_scales_mins(w["scales"])
    dots = hsum8(_accumulate((_factor(a, w["d"]), _lanes(w_q, scales, a["qs"]))))
    return dots, -_factor(a, w["dmin"]), mins, pair_sums(a["bsums"].astype(np.int64))


def _q4_k(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    dots, dmin, mins, chunk_sums = _q45_k(w, a)
    acc_m = _accumulate((dmin, pair_sums(mins * chunk_sums)))
    return dots + ((acc_m[:, 0] + acc_m[:, 2]) + (acc_m[:, 1] + acc_m[:, 3]))


def _q5_k(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    dots, dmin, mins, chunk_sums = _q45_k(w, a)
    isum = (mins * chunk_sums).sum(axis=-1).astype(np.float32)  # [R, nb]
    summs = np.zeros(len(w), np.float32)
    for b in range(w.shape[1]):
        summs = fma32(dmin[:, b], isum[:, b], summs)  # ``summs += dmin * isum``, contracted to one rounding
    return dots + summs


def _q6_k(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    nibbles = flat(fields(runs(w["ql"], 64), 4, 2), 2)  # chunk order: (c // 4, (c % 4) // 2, c % 2)
    high = flat(fields(runs(w["qh"], 32), 2, 4), 2)
    scales = w["scales"].astype(np.int64)
    offsets = 32 * pair_sums(scales * a["bsums"])
    lanes = _lanes(nibbles | high << 4, scales, a["qs"]) - offsets
    return hsum8(_accumulate((_factor(a, w["d"]), lanes)))


KERNELS = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def kquant_dot(name: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """``name``'s weight rows [R, nb * type_size] uint8 dotted with one Q8_K activation row -> [R] float32."""
    return KERNELS[name](as_blocks(weights, name), as_blocks(activations, "Q8_K"))
