"""Prompt-sized products, x [T, C] @ W.T with T >= GEMM_TOKENS: the machine's BLAS sgemm.

Decoding multiplies one token or a batch of a few into each weight matrix, and
DRAM bounds it: the tiles of ``dense_matmul.py`` and the quantized kernels read
each weight once at the bandwidth the machine has. A prompt chunk multiplies
tens to hundreds of tokens, and the arithmetic bounds it. There the BLAS that
NumPy ships (OpenBLAS, with a kernel for each x86 generation, chosen when it
loads) holds its packed panels in the caches of the CPU it finds: on one Zen 4
core it ran the SmolLM2-135M shapes at 87-88 GFLOP/s, the core's peak, where
the Numba tile ran at 70-99; on the Xeons with two AVX-512 multiply-add units
per core the tile reached 40 % of torch's GEMM. So from GEMM_TOKENS tokens on,
a float32 matrix goes to sgemm, and a quantized one is decoded, a panel of rows
at a time, into float32 (``dequantize_rows``, bit for bit the spec's weights)
that sgemm multiplies while the panel is in cache.

BLAS runs on as many threads as Numba's pool has for this forward pass
(``refllm/kernels/threads.py``), and only inside the product: both pools are
never busy at once.

Rounding: sgemm sums in its own blocked order, so a token of a prompt chunk can
differ from the same token decoded alone in the last bits (the same bound as
any float32 product, checked by the tests). Products of fewer tokens keep the
kernels' fixed order, in which a token's result never depends on its batch.
"""

from __future__ import annotations

import numba
import numpy as np

from refllm.kernels.threads import blas_threads

GEMM_TOKENS = 16  # tokens from which a product is arithmetic-bound: a prompt chunk, not a decode batch
PANEL_BYTES = 1 << 20  # a decoded panel of quantized rows: within one core's L2 while sgemm reads it


def blas_matmul(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ weights.T, weights [R, C] float32 -> [T, R] float32, in BLAS on this pass's threads."""
    with blas_threads(numba.get_num_threads()):
        return x @ weights.T


def quantized_blas_matmul(x: np.ndarray, rows: int, dequantize_panel) -> np.ndarray:
    """x [T, C] float32 @ W.T -> [T, R] float32, W decoded a panel at a time by
    ``dequantize_panel(first, last)`` -> W[first:last] float32."""
    out = np.empty((x.shape[0], rows), np.float32)
    panel_rows = max(PANEL_BYTES // (4 * x.shape[1]), 16)
    threads = numba.get_num_threads()
    for first in range(0, rows, panel_rows):
        last = min(first + panel_rows, rows)
        panel = dequantize_panel(first, last)
        with blas_threads(threads):
            np.matmul(x, panel.T, out=out[:, first:last])
    return out
