"""ggml's quantized dot products for the blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), as the x86 AVX2 build
runs them (``ggml_vec_dot_<w>_<a>`` in ``ggml-cpu/arch/x86/quants.c``; AVX-512 builds use these paths too).

A weight row of nb blocks meets an activation row quantized to Q8_0 (Q8_1 for the formats with an offset m):

    lane[b, k] = sum_{j = 4k}^{4k+3} w_q[b, j] * a_q[b, j]          exact int32, 8 lanes of 4 products each
    acc[k] = fma(d_w[b] * d_a[b], lane[b, k], acc[k])   for b = 0 .. nb-1, one float32 rounding per step
    dot = hsum8(acc)  (+ sum_b m_w[b] * s_a[b], a scalar float32 sum, for Q4_1 and Q5_1)

The integer products are exact however the build forms them (``vpdpbusd`` with VNNI, ``vpmaddubsw`` and
``vpmaddwd`` without), so the float steps above decide every bit. Weight values w_q, element j of a block:

    Q4_0: nibble_j - 8     Q4_1: nibble_j     Q5_0: nibble_j + 16 h_j - 16     Q5_1: nibble_j + 16 h_j
    Q8_0: qs_j             (nibble_j: the low nibble of qs[j] for j < 16, the high one of qs[j - 16] after;
                            h_j: bit j of qh)

Shapes: weights [R, nb * type_size] uint8, activations [nb * type_size'] uint8 -> [R] float32.
"""

from __future__ import annotations

import numpy as np

from refllm.testing.ggml.arith import fma32, hsum8
from refllm.testing.ggml.blocks import as_blocks, half
from refllm.testing.ggml.kquant_dots import KERNELS as KQUANT_KERNELS
from refllm.testing.ggml.kquant_dots import kquant_dot


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int32)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[...] uint32 -> [..., 32]: bit j of each."""
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


WEIGHT_VALUES = {
    "Q4_0": lambda b: _nibbles(b["qs"]) - 8,
    "Q4_1": lambda b: _nibbles(b["qs"]),
    "Q5_0": lambda b: _nibbles(b["qs"]) + 16 * _high_bits(b["qh"]) - 16,
    "Q5_1": lambda b: _nibbles(b["qs"]) + 16 * _high_bits(b["qh"]),
    "Q8_0": lambda b: b["qs"].astype(np.int32),
}
ACTIVATION_TYPE = {"Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q8_0": "Q8_0"} | {
    name: "Q8_K" for name in KQUANT_KERNELS
}


def block32_dot(name: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    w = as_blocks(weights, name)  # [R, nb]
    a = as_blocks(activations, ACTIVATION_TYPE[name])  # [nb]
    products = WEIGHT_VALUES[name](w) * a["qs"].astype(np.int32)  # [R, nb, 32]
    lanes = products.reshape(*products.shape[:-1], 8, 4).sum(axis=-1).astype(np.float32)  # [R, nb, 8]
    scales = half(w["d"]) * half(a["d"])  # [R, nb]
    acc = np.zeros((len(w), 8), np.float32)
    for b in range(w.shape[1]):
        acc = fma32(scales[:, b, None], lanes[:, b], acc)
    total = hsum8(acc)
    if "m" in w.dtype.names:  # the offsets' share, summed block by block in a scalar register
        offsets = np.zeros(len(w), np.float32)
        for b in range(w.shape[1]):
            offsets = fma32(half(w["m"][:, b]), half(a["s"][b]), offsets)
        total = total + offsets
    return total


def spec_dot(name: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """The dot products of ``name`` weight rows [R, nb * type_size] with one row of its activation type."""
    if name in KQUANT_KERNELS:
        return kquant_dot(name, weights, activations)
    return block32_dot(name, weights, activations)
