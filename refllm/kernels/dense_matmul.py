"""x @ W.T for float32 weights, parallel over weight rows: the forward pass's dense projections.

NumPy twin: ``refllm.nn.linear.linear``, ``x @ W.T`` (tests/test_dense_matmul.py).

Decoding streams every weight matrix from memory once per step, whatever the
batch. With BLAS on one thread (refllm/kernels/threads.py), OpenBLAS's sgemm
took about three times as long for 8 tokens as its sgemv for one, although
both read the weights once. Here the threads split the weight rows into tiles
of 4, and a tile multiplies into the tokens while its rows stay in cache:

- one token at a time (4 running sums, one load of the token's 16 lanes for
  every 4 multiply-adds) in a product of fewer than ``TOKEN_CHUNK`` tokens:
  decoding, batched decoding, speculative verification. A token's result then
  depends only on its row and its token, never on the batch around it;
- four tokens at a time (16 running sums, 8 loads for 16 multiply-adds) in a
  product of ``TOKEN_CHUNK`` tokens or more (prompts), 1.4x faster there; the
  tokens left over after the last group of 4 go one at a time, so a token's
  rounding can differ by its place in the prompt chunk.

Rows left over after the last whole tile go one at a time. Tokens go in chunks
of ``TOKEN_CHUNK``, so that a long prompt's chunk stays in cache across the
tiles.

On this project's AVX-512 machine ``inspect_asm`` shows both tiles' column
loops as 16-lane vfmadd231ps on zmm registers (tests/test_dense_matmul.py
checks the LLVM IR for vector arithmetic).

``DenseMatrix`` hands a float32 matrix to ``refllm.nn.linear.linear`` so that
its ``x @ weight.T`` runs here, the way a ``QuantizedTensor`` runs its own.

Sums run in float32 in whatever order the vector lanes give, so a result
differs from NumPy's by float32 summation-order rounding: at most
2 (C + 2) u sum_i |x_i w_i| (u = 2^-24), which the tests check.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.intrinsics import SUM_FASTMATH

TOKEN_CHUNK = 64  # 64 tokens of a 2048-wide layer: 512 KB, within one core's L2

_SUM = SUM_FASTMATH


@njit(cache=True, fastmath=_SUM, inline="always")
def _tile_4x4(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t:t+4, r:r+4] = x[t:t+4] @ weights[r:r+4].T."""
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0.0)
    for i in range(x.shape[1]):
        w0, w1, w2, w3 = weights[r, i], weights[r + 1, i], weights[r + 2, i], weights[r + 3, i]
        x0, x1, x2, x3 = x[t, i], x[t + 1, i], x[t + 2, i], x[t + 3, i]
        s00 += w0 * x0
        s01 += w0 * x1
        s02 += w0 * x2
        s03 += w0 * x3
        s10 += w1 * x0
        s11 += w1 * x1
        s12 += w1 * x2
        s13 += w1 * x3
        s20 += w2 * x0
        s21 += w2 * x1
        s22 += w2 * x2
        s23 += w2 * x3
        s30 += w3 * x0
        s31 += w3 * x1
        s32 += w3 * x2
        s33 += w3 * x3
    out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = s00, s01, s02, s03
    out[t, r + 1], out[t + 1, r + 1], out[t + 2, r + 1], out[t + 3, r + 1] = s10, s11, s12, s13
    out[t, r + 2], out[t + 1, r + 2], out[t + 2, r + 2], out[t + 3, r + 2] = s20, s21, s22, s23
    out[t, r + 3], out[t + 1, r + 3], out[t + 2, r + 3], out[t + 3, r + 3] = s30, s31, s32, s33


@njit(cache=True, fastmath=_SUM, inline="always")
def _tile_4x1(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t, r:r+4] = weights[r:r+4] @ x[t]."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for i in range(x.shape[1]):
        xi = x[t, i]
        s0 += weights[r, i] * xi
        s1 += weights[r + 1, i] * xi
        s2 += weights[r + 2, i] * xi
        s3 += weights[r + 3, i] * xi
    out[t, r], out[t, r + 1], out[t, r + 2], out[t, r + 3] = s0, s1, s2, s3


@njit(cache=True, fastmath=_SUM, inline="always")
def _tile_1x1(weights: np.ndarray, x: np.ndarray, r: int, t: int, out: np.ndarray) -> None:
    """out[t, r] = weights[r] . x[t]."""
    total = np.float32(0.0)
    for i in range(x.shape[1]):
        total += weights[r, i] * x[t, i]
    out[t, r] = total


# The tiles are inlined into this loop, and take its fast-math flags: hence _SUM here too.
@njit(cache=True, parallel=True, fastmath=_SUM)
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
                if num_tokens >= TOKEN_CHUNK:
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


class DenseMatrix:
    """A float32 matrix W [R, C] whose products ``x @ W.T`` run in ``dense_matmul``."""

    def __init__(self, weights: np.ndarray):
        self.weights = weights
        self.shape = weights.shape

    @property
    def T(self) -> Transposed:
        return Transposed(self)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [..., C] float32 -> x @ W.T [..., R] float32."""
        tokens = np.ascontiguousarray(x.reshape(-1, self.shape[1]), dtype=np.float32)
        return dense_matmul(tokens, self.weights).reshape(*x.shape[:-1], self.shape[0])


class Transposed:
    """W.T for ``x @ W.T``, where W (a DenseMatrix, a QuantizedTensor) does its own products.

    ``refllm.nn.linear.linear`` computes ``x @ weight.T``. This object opts out of
    NumPy's operators (``__array_ufunc__ = None``), so NumPy defers the product to
    its ``__rmatmul__``, which hands it to W: the spec's code runs unchanged.
    """

    __array_ufunc__ = None

    def __init__(self, matrix):
        self.matrix = matrix
        self.shape = matrix.shape[::-1]

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        return self.matrix.matmul(x)


def for_kernels(weights):
    """A float32 projection matrix as a DenseMatrix; anything else (a QuantizedTensor, None) as it is."""
    if isinstance(weights, np.ndarray) and weights.ndim == 2 and weights.dtype == np.float32:
        return DenseMatrix(np.ascontiguousarray(weights))
    return weights
