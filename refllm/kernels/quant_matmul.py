"""Numba products with GGML-quantized weights: y = x @ W.T, W read from its blocks.

W [R, C] arrives as a GGUF file stores it: ``blocks`` [R, R_bytes] uint8, row
r the C / B blocks of weight row r, in one of the layouts that
``refllm/quant/formats.py`` draws and dequantizes (the NumPy spec). x stays
float32. docs/quantization.md tells the whole story; in short:

- ``quant_matvec`` (decode, one token): four rows at a time; each group of
  weights is decoded in registers and multiplied into x at once, and the rows
  12 ahead are prefetched from DRAM meanwhile, a cache line at a time.
- ``quant_matmul`` (prefill, batched decode, T >= 2 tokens): each row is
  decoded once into a float32 scratch, then multiplied into the tokens four
  rows by four tokens at a time (``_tile4x4``).
- ``dequantize_rows``: the decoder alone.

The first two are parallel over tasks of ``ROWS_PER_TASK`` rows, and each has a
``_serial`` twin for products too small to repay waking a thread pool.

The kernels take a format's code and call its walks through ``quant_formats.py``,
the table of formats. The formats' blocks are read by ``quant_block32.py`` (Q4_0
Q4_1 Q5_0 Q5_1 Q8_0) and ``quant_kquants.py`` (Q2_K to Q6_K) with the field readers
of ``quant_fields.py``; ``quant_walks.py`` compiles each format's decoder and
products from them, and says how a row is walked.

Exactness. ``dequantize_rows`` equals the spec bit for bit (``quant_walks.py``
says why). Only the products (``SUM_FASTMATH``) round differently from NumPy's
``x @ W.T``; docs/quantization.md derives the bound the tests hold them to. Every
kernel inlines every lane from those modules: ``compile_cache.py`` keys Numba's
cache to all of this package's sources, so a change to any of them recompiles.

Vectorisation is asserted on the optimised LLVM IR by tests/kernels/test_quant_kernels.py.
On this project's AVX-512 machine ``inspect_asm`` shows ``_tile4x4``'s loop as
sixteen zmm vfmadd231ps accumulators; the decode products are vectors by construction.

Dimension letters: R weight rows (outputs), C columns (inputs), T tokens,
g group, j lane.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.arithmetic import ceil_div
from refllm.kernels.intrinsics import CACHE_LINE, SUM_FASTMATH, prefetch
from refllm.kernels.quant_formats import decode_row, dot4_rows, x_sums

# How far ahead of the rows being multiplied ``quant_matvec`` prefetches. Decoding streams every
# weight from DRAM once per token; without the hint a thread waits out each cache miss (4.8 GB/s
# on one core of the project's machine, 6.5 on two). With the hints spread over the group loop
# (``quant_walks._vector_dot4``), Q8_0 streamed 17.7, 15.6, 19.0 and 19.0 GB/s on two cores with
# rows 4, 8, 12 and 20 ahead.
PREFETCH_ROWS = 12

# Rows per parallel task: a multiple of the 4 rows a format's ``dot4`` takes, and enough rows that
# ``quant_matmul``'s one scratch row per task is no cost; 16 still gives a 192-row projection 12 tasks.
ROWS_PER_TASK = 16


@njit(cache=True)
def _prefetch_rows(blocks: np.ndarray, first: int, count: int) -> None:
    """Prefetch every cache line of rows first .. first + count - 1 that exist."""
    for r in range(first, min(first + count, blocks.shape[0])):
        row = blocks[r]
        for offset in range(0, row.shape[0], CACHE_LINE):
            prefetch(row, offset)


@njit(cache=True, fastmath=SUM_FASTMATH)
def _tile4x4(w: np.ndarray, r: int, x: np.ndarray, t: int) -> tuple:
    """w [>= r + 4, C] . x [>= t + 4, C] -> the 16 dot products of rows r..r+3 with tokens t..t+3,
    row-major. Each weight and each x loaded feeds four multiply-adds (one per partner), where a
    lone dot product loads two numbers per multiply-add: loads, not arithmetic, bound it."""
    w0, w1, w2, w3 = w[r], w[r + 1], w[r + 2], w[r + 3]
    x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
    for i in range(w0.shape[0]):
        v0, v1, v2, v3 = x0[i], x1[i], x2[i], x3[i]
        u = w0[i]
        a00 += u * v0
        a01 += u * v1
        a02 += u * v2
        a03 += u * v3
        u = w1[i]
        a10 += u * v0
        a11 += u * v1
        a12 += u * v2
        a13 += u * v3
        u = w2[i]
        a20 += u * v0
        a21 += u * v1
        a22 += u * v2
        a23 += u * v3
        u = w3[i]
        a30 += u * v0
        a31 += u * v1
        a32 += u * v2
        a33 += u * v3
    return (a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)


# ---- the kernels --------------------------------------------------------------------------------------


@njit(cache=True)
def _quad(blocks: np.ndarray, r: int) -> tuple:
    """Rows r..r+3 of blocks; past the last row, the last row again (its results are not kept)."""
    last = blocks.shape[0] - 1
    return blocks[min(r, last)], blocks[min(r + 1, last)], blocks[min(r + 2, last)], blocks[min(r + 3, last)]


@njit(cache=True)
def _matvec_task(blocks: np.ndarray, code: int, x: np.ndarray, sums: np.ndarray, out: np.ndarray, task: int) -> None:
    """out[rows of ``task``] = W[rows] @ x, four rows at a time."""
    num_rows = blocks.shape[0]
    last = num_rows - 1
    for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows), 4):
        # The last quad of an R not divisible by 4 repeats row R - 1 (and writes it identically).
        y0, y1, y2, y3 = dot4_rows(code, (_quad(blocks, r), _quad(blocks, r + PREFETCH_ROWS), x, sums))
        out[r] = y0
        out[min(r + 1, last)] = y1
        out[min(r + 2, last)] = y2
        out[min(r + 3, last)] = y3


@njit(cache=True)
def _matmul_task(blocks: np.ndarray, code: int, x: np.ndarray, out: np.ndarray, task: int) -> None:
    """out[:, rows of ``task``] = x @ W[rows].T: the rows decoded once, then multiplied into the
    tokens four rows by four tokens at a time (``_tile4x4``), the last T % 4 tokens one at a time."""
    num_tokens, num_cols = x.shape
    first_row = task * ROWS_PER_TASK
    rows = min(ROWS_PER_TASK, blocks.shape[0] - first_row)
    weights = np.empty((ROWS_PER_TASK, num_cols), np.float32)  # [16, C] the task's rows, decoded
    _prefetch_rows(blocks, first_row + ROWS_PER_TASK, ROWS_PER_TASK)  # the next task's, likely this thread's
    for r in range(ROWS_PER_TASK):  # rows past the last are a copy of it, multiplied but not kept
        decode_row(code, (blocks[first_row + min(r, rows - 1)], weights[r]))
    for r in range(0, rows, 4):
        for t in range(0, num_tokens - 3, 4):
            tile = _tile4x4(weights, r, x, t)
            for i in range(min(4, rows - r)):
                for k in range(4):
                    out[t + k, first_row + r + i] = tile[4 * i + k]
        for t in range(num_tokens - num_tokens % 4, num_tokens):
            for i in range(min(4, rows - r)):
                out[t, first_row + r + i] = _row_dot(weights[r + i], x[t])


@njit(cache=True, parallel=True)
def quant_matvec(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """W [R, C] (format ``code``, as blocks [R, R_bytes]) @ x [C] float32 -> [R] float32.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C)) @ x``.
    """
    out = np.empty(blocks.shape[0], np.float32)
    sums = x_sums(code, (x,))  # [G, 2], shared by every row
    for task in prange(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _matvec_task(blocks, code, x, sums, out, task)
    return out


@njit(cache=True)
def quant_matvec_serial(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """``quant_matvec`` on the calling thread alone, for matrices too small to repay waking a pool."""
    out = np.empty(blocks.shape[0], np.float32)
    sums = x_sums(code, (x,))
    for task in range(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _matvec_task(blocks, code, x, sums, out, task)
    return out


@njit(cache=True, parallel=True)
def quant_matmul(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ W.T -> [T, R] float32, W [R, C] as in ``quant_matvec``.

    NumPy twin: ``x @ refllm.quant.formats.dequantize(blocks, name, (R, C)).T``.
    """
    out = np.empty((x.shape[0], blocks.shape[0]), np.float32)
    for task in prange(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _matmul_task(blocks, code, x, out, task)
    return out


@njit(cache=True)
def quant_matmul_serial(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """``quant_matmul`` on the calling thread alone."""
    out = np.empty((x.shape[0], blocks.shape[0]), np.float32)
    for task in range(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _matmul_task(blocks, code, x, out, task)
    return out


@njit(cache=True, fastmath=SUM_FASTMATH)
def _row_dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """a [C] . b [C] float32."""
    total = np.float32(0.0)
    for i in range(a.shape[0]):
        total += a[i] * b[i]
    return total


@njit(cache=True, parallel=True)
def dequantize_rows(blocks: np.ndarray, code: int, num_cols: int) -> np.ndarray:
    """blocks [R, R_bytes] in format ``code`` -> W [R, C] float32.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C))``, bit for bit.
    """
    out = np.empty((blocks.shape[0], num_cols), np.float32)
    for r in prange(blocks.shape[0]):
        decode_row(code, (blocks[r], out[r]))
    return out
