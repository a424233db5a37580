"""ggml's repacked matrix products on x86 (``ggml-cpu/repack.cpp`` and ``arch/x86/repack.cpp``, llama.cpp as
llama-cpp-python 0.3.36 vendors it, built with AVX2 and AVX-512): Q4_0 (``q4_0_8x8_q8_0``), Q4_K
(``q4_K_8x8_q8_K``) and Q2_K (``q2_K_8x8_q8_K``, repacked only with AVX-512).

Repacking interleaves 8 weight rows 8 bytes at a time and rearranges their scales; it loses nothing, and
each output still sums one weight row with one activation row, so this spec works on the file's blocks.
What the repacked kernels change is where float32 rounds.

Rows. A product of T activation rows (``forward_mul_mat``) quantizes the first G = T - T % 4 rows four at a
time (``ggml_quantize_mat_q8_0_4x8`` / ``..._q8_K_4x8``) and computes them with the gemm kernel; the last
T % 4 rows are quantized one by one (the format's ``from_float``, ``quantizers.py``) and computed with the
gemv kernel (for activations of one plane, as a 2-D product has them; a 3-D one is grouped plane by plane).
How the threads split the outputs into chunks of 8 rows of W does not change any output.

Activations (per block of B = 32 or 256 values x, amax = max |x|):

    Q8_0, both ways:  d = float16(amax / 127),  q = round(x * (127 / amax))   (ties to even)
    Q8_K, one row:    ``quantize_row_q8_K_ref``: m = the first x of largest |x|, s = -127 / m
    Q8_K, 4x8:        s = -127 / amax if some x == +amax, else 127 / amax  (a positive maximum wins a tie
                      that the row quantizer gives to the first), q = clamp(round(s * x), -128, 127)
                      (``vpacksswb``), d = 1 / s; all float32

Integer sums (exact). Split a block into units j of L weights with one integer scale s_j (and min m_j):

    D[j] = s_j * sum_{l < L} w_q[jL + l] * a_q[jL + l]        M[j] = m_j * sum_{l < L} a_q[jL + l]

    Q4_0: one unit of 32, s = 1, w_q = nibble - 8, no mins
    Q4_K: 8 units of 32, 6-bit s_j, m_j (``get_scale_min_k4``), w_q = (qs[32(j//2) + l] >> 4(j%2)) & 15
    Q2_K: 16 units of 16, s_j | m_j << 4 = scales[j], w_q = (qs[32(j//8) + (16j + l) % 32] >> 2((j//2)%4)) & 3

No int16 sum saturates: ``vpmaddubsw`` and the int16 adds of the K-quant kernels hold at most 16 products of
weight bits (<= 15) and quants (|a_q| <= 127), at most 30480.

Float steps. The kernel walks the blocks b = 0 .. nb-1 in order, each in steps (runs of consecutive units, in
order), and keeps two float32 accumulators per output, in one vector lane each (no horizontal sum):

    acc  = fma(float32(sum_{j in step} D[j]), d_w[b] * d_a[b],    acc)     (the product: one rounding)
    accm = fma(float32(sum_{j in step} M[j]), dmin_w[b] * d_a[b], accm)
    y = acc - accm

float32(n) rounds to nearest even (``vcvtdq2ps``): Q4_K's gemv sum of a whole super-block, up to
8 * 32 * 15 * 127 * 63, can pass 2**24. Every float step is a vector intrinsic, so gcc has no scalar
expression to contract.
The steps: gemv takes a whole block in one step (Q4_0, Q4_K, Q2_K); gemm takes Q4_0's block, Q4_K's units
two at a time (64 weights) and Q2_K's eight at a time (128 weights). So gemm and gemv agree for Q4_0 and
differ for the K-quants.

Shapes: weights [N, nb * type_size] uint8 (the file's blocks), x [T, K] float32 -> [T, N] float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.testing.ggml.arith import fma32
from refllm.testing.ggml.blocks import as_blocks, fields, half, runs
from refllm.testing.ggml.quantizers import QUANTIZERS

REPACKED_TYPES = ("Q4_0", "Q4_K", "Q2_K")


@dataclass(frozen=True)
class Weights:
    w_q: np.ndarray  # [N, nb, J, L] integer weights
    scales: np.ndarray  # [N, nb, J] integer scales of the units
    mins: np.ndarray | None  # [N, nb, J] integer mins, None without an offset
    d: np.ndarray  # [N, nb] float32
    dmin: np.ndarray | None  # [N, nb] float32


def _q4_0(w: np.ndarray) -> Weights:
    nibbles = np.concatenate([w["qs"] & 15, w["qs"] >> 4], axis=-1).astype(np.int64) - 8
    return Weights(runs(nibbles, 32), np.ones(w.shape + (1,), np.int64), None, half(w["d"]), None)


def _q4_k(w: np.ndarray) -> Weights:
    nibbles = fields(runs(w["qs"], 32), 4, 2)  # [N, nb, 4, 2, 32]: unit j = (j // 2, j % 2)
    q = w["scales"].astype(np.int64)
    low, mid, high = q[..., 0:4], q[..., 4:8], q[..., 8:12]
    scales = np.concatenate([low & 63, (high & 15) | (low >> 6) << 4], axis=-1)
    mins = np.concatenate([mid & 63, (high >> 4) | (mid >> 6) << 4], axis=-1)
    return Weights(runs(nibbles.reshape(*w.shape, 256), 32), scales, mins, half(w["d"]), half(w["dmin"]))


def _q2_k(w: np.ndarray) -> Weights:
    crumbs = fields(runs(w["qs"], 32), 2, 4)  # [N, nb, 2, 4, 32]: 32 weights per (half, shift)
    scales, mins = (w["scales"] & 15).astype(np.int64), (w["scales"] >> 4).astype(np.int64)
    return Weights(runs(crumbs.reshape(*w.shape, 256), 16), scales, mins, half(w["d"]), half(w["dmin"]))


def _rows_q8(x: np.ndarray, activation: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row by the format's ``from_float`` -> (d [T, nb] float32, a_q [T, nb, B] int64)."""
    a = as_blocks(np.stack([QUANTIZERS[activation](row) for row in x]).reshape(len(x), -1), activation)
    return a["d"].astype(np.float32), a["qs"].astype(np.int64)


def _q8_0_4x8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ggml_quantize_mat_q8_0_4x8``: the row quantizer's arithmetic, interleaved."""
    return _rows_q8(x, "Q8_0")


def _q8_k_4x8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ggml_quantize_mat_q8_K_4x8``: the sign of the scale from whether +amax occurs in the block."""
    x = x.reshape(len(x), -1, 256)
    amax = np.abs(x).max(axis=-1)
    sign = np.where((x == amax[..., None]).any(axis=-1), np.float32(-127), np.float32(127))
    live = amax != 0
    with np.errstate(divide="ignore"):
        scale = np.where(live, sign / amax, np.float32(0)).astype(np.float32)
        d = np.where(live, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(x * scale[..., None]), -128, 127).astype(np.int64)
    return d, q


@dataclass(frozen=True)
class Format:
    decode: Callable[[np.ndarray], Weights]
    activation: str  # the activations' block format
    quantize_4x8: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    gemm_step: int  # units per float step in gemm (gemv: the whole block)


FORMATS = {
    "Q4_0": Format(_q4_0, "Q8_0", _q8_0_4x8, 1),
    "Q4_K": Format(_q4_k, "Q8_K", _q8_k_4x8, 2),
    "Q2_K": Format(_q2_k, "Q8_K", _q8_k_4x8, 8),
}


def _accumulate(sums: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """sums [T, N, nb, S] exact integers, factor [T, N, nb] float32 -> [T, N]:
    acc = fma(float32(sums[..., b, s]), factor[..., b], acc) for each block b, then each step s."""
    acc = np.zeros(sums.shape[:2], np.float32)
    for b in range(sums.shape[2]):
        for s in range(sums.shape[3]):
            acc = fma32(sums[:, :, b, s].astype(np.float32), factor[:, :, b], acc)  # int64 -> nearest float32
    return acc


def _kernel(w: Weights, d_a: np.ndarray, a_q: np.ndarray, step: int) -> np.ndarray:
    """One kernel's outputs [T, N] for activations d_a [T, nb], a_q [T, nb, B], ``step`` units per float step."""
    a_units = runs(a_q, w.w_q.shape[-1])  # [T, nb, J, L]
    dots = np.einsum("tbjl,nbjl->tnbj", a_units, w.w_q) * w.scales  # [T, N, nb, J]

    def steps(units: np.ndarray) -> np.ndarray:
        return runs(units, step).sum(axis=-1)

    y = _accumulate(steps(dots), w.d * d_a[:, None])
    if w.mins is not None:
        offsets = a_units.sum(axis=-1)[:, None] * w.mins  # [T, N, nb, J]
        y = y - _accumulate(steps(offsets), w.dmin * d_a[:, None])
    return y


def repacked_product(weight_type: str, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[T, N] as the repacked kernels compute W [N, K] (the file's ``weight_type`` blocks) times x [T, K]."""
    form = FORMATS[weight_type]
    w = form.decode(as_blocks(weights, weight_type))
    x = np.asarray(x, np.float32)
    grouped = len(x) - len(x) % 4
    parts = []
    if grouped:  # gemm, on the rows quantized four at a time
        parts.append(_kernel(w, *form.quantize_4x8(x[:grouped]), form.gemm_step))
    if grouped < len(x):  # gemv, row by row, a whole block per float step
        parts.append(_kernel(w, *_rows_q8(x[grouped:], form.activation), w.w_q.shape[2]))
    return np.concatenate(parts)
