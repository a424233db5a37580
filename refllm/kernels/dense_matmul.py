"""x @ W.T for float32 weights, parallel over weight rows: the forward pass's dense projections.

NumPy twin: ``refllm.nn.linear.linear``, ``x @ W.T`` (tests/kernels/test_dense_matmul.py).

Decoding streams every weight matrix from memory once per step, whatever the
batch. With BLAS on one thread (refllm/kernels/threads.py), OpenBLAS's sgemm
took about three times as long for 8 tokens as its sgemv for one, although
both read the weights once. Here the threads split the weight rows into tiles
of 4, and a tile multiplies into the tokens while its rows stay in cache:

- four tokens at a time (16 running sums, 8 loads for 16 multiply-adds) while
  four remain: batched decoding, speculative verification, prompts. These
  tiles prefetch the rows two tiles ahead, so that DRAM keeps streaming while
  they compute; batch 8 then takes about as long as batch 1;
- one token at a time (4 running sums, 5 loads for 4 multiply-adds) for the
  rest, and for decoding a single sequence, which DRAM bounds.

Every tile sums a dot product the same way, spelled out with the 16-lane
vectors of ``refllm/kernels/intrinsics.py``: lane l adds the products of
columns l, l + 16, ... in order, the lanes are added in a fixed tree, then the
columns past the last multiple of 16 one by one. So a token's result depends
only on its row and its token, bit for bit: never on the batch, the prompt
chunk or its place in them. (Loops left to LLVM's fast-math reassociation
would each pick their own number of partial sums.)

Rows left over after the last whole tile go one at a time. Tokens go in chunks
of ``TOKEN_CHUNK``, so that a long prompt's chunk stays in cache across the
tiles.

``linear`` is the kernel twin of ``refllm.nn.linear.linear`` in the fast op set
(``refllm/models/ops.py``): a float32 matrix multiplies here, a
``QuantizedTensor`` in its own kernels.

The order differs from NumPy's, so a result differs from NumPy's by float32
summation-order rounding: at most 2 (C + 2) u sum_i |x_i w_i| (u = 2^-24),
which the tests check.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.compiler_memory import release as release_compiler_pages
from refllm.kernels.gemm import GEMM_TOKENS, prompt_matmul
from refllm.kernels.intrinsics import LANES, load16, multiply_add16, prefetch, sum16, zeros16

TOKEN_CHUNK = 64  # 64 tokens of a 2048-wide layer: 512 KB, within one core's L2

# How far ahead of its rows a 4x4 tile prefetches (two tiles). A batch's 4x4 tiles compute long
# enough per byte that DRAM idles while they do: the batch-8 projections of the SmolLM2-135M shape
# took 1.7x as long as batch 1 without the hint, about as long with it. A 4x1 tile gains nothing.
PREFETCH_ROWS = 8


@njit(cache=True, inline="always")
def _finish(lanes, weights: np.ndarray, x: np.ndarray, row: int, token: int, body: int) -> np.float32:
    """The dot product of weight row ``row`` and token ``token`` from the lanes of its first
    ``body`` columns: the lanes' sum, then the columns past ``body`` added one by one."""
    total = sum16(lanes)
    for i in range(body, x.shape[1]):
        total += weights[row, i] * x[token, i]
    return total


@njit(cache=True, inline="always")
def _tile_4x4(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t:t+4, r:r+4] = x[t:t+4] @ weights[r:r+4].T."""
    cols = x.shape[1]
    body = cols - cols % LANES
    ahead = max(min(r + PREFETCH_ROWS, weights.shape[0] - 4), 0) * cols
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zeros16()
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zeros16()
    for i in range(0, body, LANES):
        for k in range(4):
            prefetch(weights, ahead + k * cols + i)
        w0, w1 = load16(weights, r * cols + i), load16(weights, (r + 1) * cols + i)
        w2, w3 = load16(weights, (r + 2) * cols + i), load16(weights, (r + 3) * cols + i)
        x0, x1 = load16(x, t * cols + i), load16(x, (t + 1) * cols + i)
        x2, x3 = load16(x, (t + 2) * cols + i), load16(x, (t + 3) * cols + i)
        s00, s01 = multiply_add16(w0, x0, s00), multiply_add16(w0, x1, s01)
        s02, s03 = multiply_add16(w0, x2, s02), multiply_add16(w0, x3, s03)
        s10, s11 = multiply_add16(w1, x0, s10), multiply_add16(w1, x1, s11)
        s12, s13 = multiply_add16(w1, x2, s12), multiply_add16(w1, x3, s13)
        s20, s21 = multiply_add16(w2, x0, s20), multiply_add16(w2, x1, s21)
        s22, s23 = multiply_add16(w2, x2, s22), multiply_add16(w2, x3, s23)
        s30, s31 = multiply_add16(w3, x0, s30), multiply_add16(w3, x1, s31)
        s32, s33 = multiply_add16(w3, x2, s32), multiply_add16(w3, x3, s33)
    sums = ((s00, s01, s02, s03), (s10, s11, s12, s13), (s20, s21, s22, s23), (s30, s31, s32, s33))
    for a in range(4):
        for b in range(4):
            out[t + b, r + a] = _finish(sums[a][b], weights, x, r + a, t + b, body)


@njit(cache=True, inline="always")
def _columns_4x1(weights: np.ndarray, x: np.ndarray, r: int, t: int, i: int, s0, s1, s2, s3) -> tuple:
    """Rows r .. r+3's lane sums s0 .. s3 with columns i .. i+15 of token t added."""
    cols = x.shape[1]
    xi = load16(x, t * cols + i)
    return (
        multiply_add16(load16(weights, r * cols + i), xi, s0),
        multiply_add16(load16(weights, (r + 1) * cols + i), xi, s1),
        multiply_add16(load16(weights, (r + 2) * cols + i), xi, s2),
        multiply_add16(load16(weights, (r + 3) * cols + i), xi, s3),
    )


@njit(cache=True, inline="always")
def _tile_4x1(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t, r:r+4] = weights[r:r+4] @ x[t]."""
    cols = x.shape[1]
    body = cols - cols % LANES
    s0 = s1 = s2 = s3 = zeros16()
    # A whole cache line of each row per round (4 vectors, still added in order): DRAM streamed
    # the rows about 8 % faster this way than one vector of each row per round.
    lines = cols - cols % (4 * LANES)
    for start in range(0, lines, 4 * LANES):
        for i in range(start, start + 4 * LANES, LANES):
            s0, s1, s2, s3 = _columns_4x1(weights, x, r, t, i, s0, s1, s2, s3)
    for i in range(lines, body, LANES):
        s0, s1, s2, s3 = _columns_4x1(weights, x, r, t, i, s0, s1, s2, s3)
    out[t, r] = _finish(s0, weights, x, r, t, body)
    out[t, r + 1] = _finish(s1, weights, x, r + 1, t, body)
    out[t, r + 2] = _finish(s2, weights, x, r + 2, t, body)
    out[t, r + 3] = _finish(s3, weights, x, r + 3, t, body)


@njit(cache=True, inline="always")
def _tile_1x1(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t, r] = weights[r] . x[t]."""
    cols = x.shape[1]
    body = cols - cols % LANES
    total = zeros16()
    for i in range(0, body, LANES):
        total = multiply_add16(load16(weights, r * cols + i), load16(x, t * cols + i), total)
    out[t, r] = _finish(total, weights, x, r, t, body)


@njit(cache=True, parallel=True)
def dense_matmul(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ weights.T, weights [R, C] float32 (both C-contiguous) -> [T, R] float32."""
    num_tokens = x.shape[0]
    num_rows = weights.shape[0]
    out = np.empty((num_tokens, num_rows), np.float32)
    for first in range(0, num_tokens, TOKEN_CHUNK):
        last = min(first + TOKEN_CHUNK, num_tokens)
        for tile in prange((num_rows + 3) // 4):
            r = 4 * tile
            if r + 4 <= num_rows:
                t = first
                while t + 4 <= last:
                    _tile_4x4(weights, x, r, t, out)
                    t += 4
                while t < last:
                    _tile_4x1(weights, x, r, t, out)
                    t += 1
            else:
                for row in range(r, num_rows):
                    for t in range(first, last):
                        _tile_1x1(weights, x, row, t, out)
    return out


def linear(x: np.ndarray, weight, bias: np.ndarray | None = None) -> np.ndarray:
    """x: [..., C] float32, weight: [R, C], bias: [R] -> [..., R], as ``refllm.nn.linear.linear``.

    A float32 matrix multiplies in ``dense_matmul``, or from GEMM_TOKENS tokens on in it or in BLAS,
    whichever this machine runs the shape faster (``refllm/kernels/gemm.py``); any other weight (a ``QuantizedTensor``) multiplies itself in
    the quantized kernels, from its blocks.
    """
    if isinstance(weight, np.ndarray):
        tokens = np.ascontiguousarray(x.reshape(-1, weight.shape[1]), dtype=np.float32)
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        prompt = len(tokens) >= GEMM_TOKENS
        y = prompt_matmul(tokens, weight, dense_matmul) if prompt else dense_matmul(tokens, weight)
        y = y.reshape(*x.shape[:-1], weight.shape[0])
    else:
        y = weight.matmul(x)
    release_compiler_pages()  # once the first products have loaded their kernels: before most weights are read
    return y if bias is None else y + bias
