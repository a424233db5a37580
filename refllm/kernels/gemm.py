"""Prompt-sized float32 products, x [T, C] @ W.T with T >= GEMM_TOKENS, in BLAS: one call per thread.

Decoding multiplies one token or a batch of a few into each weight matrix, and
DRAM bounds it: the tiles of ``dense_matmul.py`` read each weight once at the
bandwidth the machine has. A prompt chunk multiplies tens to hundreds of
tokens, and the arithmetic bounds it, so the product's speed depends on how
well it fits the CPU's registers and caches. NumPy's OpenBLAS carries a kernel
for each x86 generation and picks the one for the CPU it finds when it loads;
the Numba tile (4 rows x 4 tokens of 16-lane sums) is tuned for one. On two
Zen 4 cores they ran SmolLM2-135M's prefill alike; on Xeons with two AVX-512
multiply-add units per core the tile reached 40 % of torch's GEMM.

The threads: BLAS runs on as many threads as Numba's pool has for this pass
(``refllm/kernels/threads.py``), and only inside the product; around it, one.
Splitting the rows between plain Python threads, one single-threaded sgemm
each, instead ran the SmolLM2 shapes at half the speed.

Rounding: sgemm sums in its own blocked order, within the float32 summation
bound the tests hold every product to. Products of fewer than GEMM_TOKENS
tokens take the tile, whose order makes a token's result independent of its
batch. Quantized matrices keep their own kernels (``quant_matmul``): decoding a
panel of rows for sgemm and then multiplying it ran at half their speed here.
"""

from __future__ import annotations

import numba
import numpy as np

from refllm.kernels.threads import blas_threads

GEMM_TOKENS = 16  # tokens from which a product is arithmetic-bound: a prompt chunk, not a decode batch


def blas_matmul(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ weights.T, weights [R, C] float32 -> [T, R] float32, in BLAS on this pass's threads."""
    with blas_threads(numba.get_num_threads()):
        return np.matmul(x, weights.T)
