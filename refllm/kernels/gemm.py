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

The threads: OpenBLAS's own pool spins after each product, and beside Numba's
pool (which runs every other kernel of the forward pass) two spinning pools
took turns on two cores: prefill ran slower with BLAS on two threads than with
the tile. So BLAS stays on one thread, and the rows of W are split between as
many Python threads as Numba's pool has for this pass (``refllm/kernels/threads.py``),
each calling sgemm on its share; NumPy releases the GIL inside, and idle
threads wait on a queue rather than spin.

Rounding: sgemm sums in its own blocked order, within the float32 summation
bound the tests hold every product to. Products of fewer than GEMM_TOKENS
tokens take the tile, whose order makes a token's result independent of its
batch. Quantized matrices keep their own kernels (``quant_matmul``): decoding a
panel of rows for sgemm and then multiplying it ran at half their speed here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

GEMM_TOKENS = 16  # tokens from which a product is arithmetic-bound: a prompt chunk, not a decode batch

_workers: ThreadPoolExecutor | None = None  # made on first use, one thread per core Numba may use


def blas_matmul(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ weights.T, weights [R, C] float32 -> [T, R] float32: the rows split between
    this pass's threads, each share one single-threaded sgemm."""
    global _workers
    threads = min(numba.get_num_threads(), weights.shape[0])
    if threads == 1:
        return x @ weights.T
    if _workers is None:
        _workers = ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="refllm-gemm")
    out = np.empty((x.shape[0], weights.shape[0]), np.float32)
    bounds = np.linspace(0, weights.shape[0], threads + 1).astype(int)

    def share(i: int) -> None:
        first, last = bounds[i], bounds[i + 1]
        np.matmul(x, weights[first:last].T, out=out[:, first:last])

    list(_workers.map(share, range(threads)))
    return out
