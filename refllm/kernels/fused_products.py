"""Several quantized products of one input in one parallel region: a layer's q, k and v, or its
gate and up projections.

Each parallel kernel first wakes Numba's workers and ends when the last of them ends; a
decode step of a small model runs hundreds of them, and a layer's k and v projections are
small enough that the wake-up and the wait are a good part of their time. Here the row
tasks of every matrix go into one ``prange``: the same tasks as ``quant_matmul``'s
(``_matvec_task``, ``_matmul_task``, ``int8_matmul._int8_task``), so every output is the one
the matrix's own product gives, bit for bit; the input's group sums (or its int8
quantization) are computed once for all the matrices.

All matrices are blocks [R_i, R_bytes_i] uint8 with their format codes, multiplying the same
x [T, C] float32; ``int8`` as in ``decoder_layer.py`` (taken only when every matrix's format
has an int8 product).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.arithmetic import ceil_div
from refllm.kernels.int8_matmul import INT8_CODES, INT8_TOKENS, _int8_task, quantize_activations
from refllm.kernels.quant_formats import x_sums
from refllm.kernels.quant_matmul import ROWS_PER_TASK, _matmul_task, _matvec_task


@njit(cache=True)
def _task_counts(blocks: tuple) -> np.ndarray:
    counts = np.empty(len(blocks), np.int64)
    for m in range(len(blocks)):
        counts[m] = ceil_div(blocks[m].shape[0], ROWS_PER_TASK)
    return counts


@njit(cache=True)
def _locate(task: int, counts: np.ndarray) -> tuple[int, int]:
    """The matrix a task of the joint list belongs to, and its task number there."""
    m, local = 0, np.int64(task)  # a prange index may be unsigned: int64, or mixing them makes a float
    while local >= counts[m]:
        local -= counts[m]
        m += 1
    return m, local


@njit(cache=True, parallel=True)
def _joint_matvec(blocks: tuple, codes: tuple, x: np.ndarray, sums: list, outs: list, counts: np.ndarray) -> None:
    for task in prange(counts.sum()):
        m, local = _locate(task, counts)
        _matvec_task(blocks[m], codes[m], x, sums[m], outs[m][0], local)


@njit(cache=True, parallel=True)
def _joint_matmul(blocks: tuple, codes: tuple, x: np.ndarray, outs: list, counts: np.ndarray) -> None:
    for task in prange(counts.sum()):
        m, local = _locate(task, counts)
        _matmul_task(blocks[m], codes[m], x, outs[m], local)


@njit(cache=True, parallel=True)
def _joint_int8(blocks: tuple, codes: tuple, quantized: tuple, outs: list, counts: np.ndarray) -> None:
    q, d, quads, sums = quantized
    for task in prange(counts.sum()):
        m, local = _locate(task, counts)
        _int8_task(blocks[m], codes[m], q, d, quads, sums, outs[m], local)


@njit(cache=True)
def joint_products(blocks: tuple, codes: tuple, x: np.ndarray, int8: bool) -> list:
    """x [T, C] @ blocks[i].T for every matrix i (a homogeneous tuple of uint8 block arrays) -> a list
    of [T, R_i] float32, in one parallel region."""
    counts = _task_counts(blocks)
    outs = [np.empty((x.shape[0], b.shape[0]), np.float32) for b in blocks]
    every_int8 = True
    for code in codes:
        every_int8 = every_int8 and INT8_CODES[code]
    if int8 and every_int8 and x.shape[0] < INT8_TOKENS:
        _joint_int8(blocks, codes, quantize_activations(x), outs, counts)
    elif x.shape[0] == 1:
        sums = [x_sums(code, (x[0],)) for code in codes]
        _joint_matvec(blocks, codes, x[0], sums, outs, counts)
    else:
        _joint_matmul(blocks, codes, x, outs, counts)
    return outs
