"""Products of quantized weights with activations quantized to 8 bits: integer dot products.

The opt-in ``activations="int8"`` path (never the default: it changes the arithmetic). Each
token's x [C] is quantized per block of 32, as llama.cpp quantizes activations for its CPU
products (its Q8_0), but with float32 scales:

    d_g = max |x_g| / 127,   q_i = rint(x_i / d_g)  in -127..127          (``quantize_activations``)

and a weight block g of the row, w = a q_w + c, meets the quantized x_i' = d_g q_i as

    sum_i w_i x_i'  =  a d_g (sum_i q_w,i q_i)  +  c d_g (sum_i q_i)

where the integer sums are exact (``int8_intrinsics.dot_u8s8``: ``vpdpbusd`` with AVX-512
VNNI or AVX-VNNI, ``vpmaddubsw`` otherwise). So the product is the dequantized weights times
the quantized activations, to float32 rounding, and only the quantization of x departs from
the float32 path: each x_i moves by at most d_g / 2, so a result moves by at most
sum_i |w_i| d_g(i) / 2 plus float32 rounding. tests/kernels/test_int8_matmul.py checks the integers
against NumPy exactly and the results against that bound. Formats: Q4_0 (q_w = nibble - 8,
the 8 taken off through the precomputed sums of q), Q4_1 (offset c = m), Q8_0 (q_w int8,
multiplied as |q_w| and sign(q_w) q). The other formats keep float32 activations.

Products of INT8_TOKENS tokens or more (prompt chunks) keep float32 activations: there the
float32 tiles of ``quant_matmul`` run faster than these (a 256-token chunk through a
1536 x 576 Q4_0 matrix: 87 against 56 GFLOP/s on one core), and closer to the truth. So the
int8 products serve decode steps, batches of them, and speculative verification.

Two 32-weight blocks go through one 64-byte step: 16 int32 lanes (8 a block), converted to
float32 and multiplied by their blocks' a d_g into 16 float lanes per row, summed once per
row (``intrinsics.sum16``), so a result does not depend on the batch or the threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.kernels.arithmetic import ceil_div
from refllm.kernels.gemm import GEMM_TOKENS
from refllm.kernels.int8_intrinsics import (
    HOST_ISA,
    abs_bytes64,
    byte_pair64,
    dot_u8s8,
    float32x16_of,
    load_bytes64,
    load_int32x16,
    nibble_pair64,
    half_pair16,
    pair16,
    signed_by64,
    zeros_int32x16,
)
from refllm.kernels.intrinsics import add16, mul16, multiply_add16, prefetch, sum16, zeros16
from refllm.kernels.quant_formats import KERNEL_FORMATS, by_code

BLOCK = 32  # weights (and activations) per block
PAD = 64  # zero bytes after a token's quantized activations: a block pair's load may run past the last block
CENTERED_NIBBLES, NIBBLES_WITH_MIN, SIGNED_BYTES = range(3)  # how a format's block holds its q_w
INT8_TOKENS = GEMM_TOKENS  # products of this many tokens or more keep float32 activations
ISA = HOST_ISA


@njit(cache=True)
def quantize_activations(x: np.ndarray) -> tuple:
    """x [T, C] float32 (C a multiple of 32) -> (q [T, C + PAD] int8, d [T, G + 1] float32,
    minus_eight_quads [T, C / 4 + 16] int32: -8 times each four q's sum, sums [T, G + 1] float32: d_g (sum q));
    the last d and sum are 0.

    NumPy twin: tests/kernels/test_int8_matmul.py (bit for bit)."""
    tokens, cols = x.shape
    blocks = cols // BLOCK
    q = np.zeros((tokens, cols + PAD), np.int8)
    d = np.zeros((tokens, blocks + 1), np.float32)
    quads = np.zeros((tokens, cols // 4 + 16), np.int32)
    sums = np.zeros((tokens, blocks + 1), np.float32)
    for t in range(tokens):
        for g in range(blocks):
            largest = np.float32(0.0)
            for i in range(g * BLOCK, (g + 1) * BLOCK):
                largest = max(largest, abs(x[t, i]))
            scale = largest / np.float32(127.0)
            inverse = np.float32(1.0) / scale if scale > 0 else np.float32(0.0)
            total = 0
            for i in range(g * BLOCK, (g + 1) * BLOCK):
                q[t, i] = np.int8(np.rint(x[t, i] * inverse))
                total += q[t, i]
            d[t, g], sums[t, g] = scale, scale * np.float32(total)
        for j in range(cols // 4):
            quads[t, j] = -8 * (np.int32(q[t, 4 * j]) + q[t, 4 * j + 1] + q[t, 4 * j + 2] + q[t, 4 * j + 3])
    return q, d, quads, sums


def _int8_walks(type_size: int, quants_at: int, kind: int):
    """-> (dot4, tile4x4) of one format: four rows [R_bytes] uint8 times one token's quantized activations
    -> four float32; or times four tokens' -> 16 float32 (row-major), each the same as dot4 gives it."""

    @njit(inline="always")
    def weights_of(row, g, second):
        """A block pair's weights as bytes (nibbles, or the int8s themselves), and their scales a (and m)."""
        at_first, at_second = type_size * g, type_size * second
        if kind == SIGNED_BYTES:
            w = byte_pair64(row, at_first + quants_at, at_second + quants_at)
        else:
            w = nibble_pair64(row, at_first + quants_at, at_second + quants_at)
        one = np.float32(1.0)  # the conversion is exact: a d below rounds once, as a product
        minimums = half_pair16(row, at_first + 2, at_second + 2, one, one) if kind == NIBBLES_WITH_MIN else zeros16()
        return w, half_pair16(row, at_first, at_second, one, one), minimums

    @njit(inline="always")
    def add_product(w, scales, minimums, token, lanes):
        """lanes + a d (sum q_w q) (+ m d (sum q)) of one row's block pair and one token's (``token_of``)."""
        s, offsets, scale_pair, sum_pair = token
        if kind == SIGNED_BYTES:
            ints = dot_u8s8(abs_bytes64(w), signed_by64(s, w), zeros_int32x16(), ISA)
        else:
            ints = dot_u8s8(w, s, offsets, ISA)  # offsets: -8 (sum q) for Q4_0's centred nibbles, else 0
        lanes = multiply_add16(float32x16_of(ints), mul16(scales, scale_pair), lanes)
        if kind == NIBBLES_WITH_MIN:  # w = d q + m: m d_g (sum q) a block, an eighth in each of its 8 lanes
            lanes = add16(lanes, mul16(minimums, sum_pair))
        return lanes

    @njit(inline="always")
    def token_of(q, d, quads, sums, g):
        """A token's block pair: its q, Q4_0's offsets, its scales d and its d (sum q) / 8 as lane pairs."""
        offsets = load_int32x16(quads, 8 * g) if kind == CENTERED_NIBBLES else zeros_int32x16()
        eighth = np.float32(0.125)
        # d[blocks] and sums[blocks] are 0: an odd last block's missing partner weighs nothing
        return load_bytes64(q, BLOCK * g), offsets, pair16(d[g], d[g + 1]), pair16(sums[g] * eighth, sums[g + 1] * eighth)

    @njit(inline="always")
    def prefetch_rows(ahead: tuple, at: int) -> None:
        ahead0, ahead1, ahead2, ahead3 = ahead  # unpacked: an indexed tuple of arrays costs reference counts
        prefetch(ahead0, at)
        prefetch(ahead1, at)
        prefetch(ahead2, at)
        prefetch(ahead3, at)

    @njit(inline="always")
    def row_times_tokens(row, g, second, tokens, acc):
        """A row's block pair times up to four tokens' (``tokens``), added to its four accumulators."""
        w, scales, minimums = weights_of(row, g, second)
        token0, token1, token2, token3 = tokens
        acc0, acc1, acc2, acc3 = acc
        return (
            add_product(w, scales, minimums, token0, acc0),
            add_product(w, scales, minimums, token1, acc1),
            add_product(w, scales, minimums, token2, acc2),
            add_product(w, scales, minimums, token3, acc3),
        )

    @njit
    def dot4(rows: tuple, ahead: tuple, q: np.ndarray, d: np.ndarray, quads: np.ndarray, sums: np.ndarray) -> tuple:
        row0, row1, row2, row3 = rows
        blocks = sums.shape[0] - 1
        lanes0 = lanes1 = lanes2 = lanes3 = zeros16()
        for g in range(0, blocks, 2):
            second = min(g + 1, blocks - 1)  # an odd last block pairs with itself, its second half scaled by 0
            prefetch_rows(ahead, g * type_size)  # a pair of blocks is about a cache line of each row
            token = token_of(q, d, quads, sums, g)
            w, scales, minimums = weights_of(row0, g, second)
            lanes0 = add_product(w, scales, minimums, token, lanes0)
            w, scales, minimums = weights_of(row1, g, second)
            lanes1 = add_product(w, scales, minimums, token, lanes1)
            w, scales, minimums = weights_of(row2, g, second)
            lanes2 = add_product(w, scales, minimums, token, lanes2)
            w, scales, minimums = weights_of(row3, g, second)
            lanes3 = add_product(w, scales, minimums, token, lanes3)
        return sum16(lanes0), sum16(lanes1), sum16(lanes2), sum16(lanes3)

    @njit
    def tile4x4(rows: tuple, ahead: tuple, q: np.ndarray, d: np.ndarray, quads: np.ndarray, sums: np.ndarray, t: int):
        """Rows . tokens t .. t + 3 -> 16 float32, row-major: each weight pair's bytes serve four tokens."""
        row0, row1, row2, row3 = rows
        blocks = sums.shape[1] - 1
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = e0 = e1 = e2 = e3 = zeros16()
        for g in range(0, blocks, 2):
            second = min(g + 1, blocks - 1)
            prefetch_rows(ahead, g * type_size)
            tokens = (
                token_of(q[t], d[t], quads[t], sums[t], g),
                token_of(q[t + 1], d[t + 1], quads[t + 1], sums[t + 1], g),
                token_of(q[t + 2], d[t + 2], quads[t + 2], sums[t + 2], g),
                token_of(q[t + 3], d[t + 3], quads[t + 3], sums[t + 3], g),
            )
            a0, a1, a2, a3 = row_times_tokens(row0, g, second, tokens, (a0, a1, a2, a3))
            b0, b1, b2, b3 = row_times_tokens(row1, g, second, tokens, (b0, b1, b2, b3))
            c0, c1, c2, c3 = row_times_tokens(row2, g, second, tokens, (c0, c1, c2, c3))
            e0, e1, e2, e3 = row_times_tokens(row3, g, second, tokens, (e0, e1, e2, e3))
        return (
            sum16(a0), sum16(a1), sum16(a2), sum16(a3), sum16(b0), sum16(b1), sum16(b2), sum16(b3),
            sum16(c0), sum16(c1), sum16(c2), sum16(c3), sum16(e0), sum16(e1), sum16(e2), sum16(e3),
        )  # fmt: skip

    return dot4, tile4x4


INT8_FORMATS = {  # format name -> its (dot4, tile4x4): block bytes, where its q_w start, how they are held
    "Q4_0": _int8_walks(18, 2, CENTERED_NIBBLES),
    "Q4_1": _int8_walks(20, 4, NIBBLES_WITH_MIN),
    "Q8_0": _int8_walks(34, 2, SIGNED_BYTES),
}


@njit
def _no_int8_product(rows: tuple, ahead: tuple, q, d, quads, sums) -> tuple:
    """The entry of a format without an int8 product: never called (``int8_reads`` is False for it)."""
    nan = np.float32(np.nan)
    return nan, nan, nan, nan


@njit
def _no_int8_tile(rows: tuple, ahead: tuple, q, d, quads, sums, t: int) -> tuple:
    """As ``_no_int8_product``, for four tokens."""
    nan = np.float32(np.nan)
    return (nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)


_NONE = (_no_int8_product, _no_int8_tile)
int8_dot4_rows = by_code(tuple(INT8_FORMATS.get(name, _NONE)[0] for name in KERNEL_FORMATS))
int8_tile_rows = by_code(tuple(INT8_FORMATS.get(name, _NONE)[1] for name in KERNEL_FORMATS))
ROWS_PER_TASK = 16  # as quant_matmul's tasks
PREFETCH_ROWS = 12


# By format code: whether the int8-activation products read that format (a constant of the kernels)
INT8_CODES = np.array([name in INT8_FORMATS for name in KERNEL_FORMATS])


def int8_reads(format: str) -> bool:
    """Whether the int8-activation products read weights stored in ``format``."""
    return format in INT8_FORMATS


@njit(cache=True)
def _quad(blocks: np.ndarray, r: int) -> tuple:
    """Rows r..r+3 of blocks; past the last row, the last row again (its results are not kept)."""
    last = blocks.shape[0] - 1
    return blocks[min(r, last)], blocks[min(r + 1, last)], blocks[min(r + 2, last)], blocks[min(r + 3, last)]


@njit(cache=True)
def _int8_task(blocks: np.ndarray, code: int, q, d, quads, sums, out: np.ndarray, task: int) -> None:
    """out[:, rows of ``task``] for every token, four rows at a time: four tokens at a time while four
    remain (the weights' bytes serve them all), then one (the task's rows stay in cache across the tokens)."""
    num_rows, num_tokens = blocks.shape[0], q.shape[0]
    last = num_rows - 1
    for t in range(0, num_tokens - 3, 4):
        for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows), 4):
            tile = int8_tile_rows(code, (_quad(blocks, r), _quad(blocks, r + PREFETCH_ROWS), q, d, quads, sums, t))
            for i in range(4):
                for k in range(4):
                    out[t + k, min(r + i, last)] = tile[4 * i + k]
    for t in range(num_tokens - num_tokens % 4, num_tokens):
        token = (q[t], d[t], quads[t], sums[t])
        for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows), 4):
            y0, y1, y2, y3 = int8_dot4_rows(code, (_quad(blocks, r), _quad(blocks, r + PREFETCH_ROWS), *token))
            out[t, r] = y0
            out[t, min(r + 1, last)] = y1
            out[t, min(r + 2, last)] = y2
            out[t, min(r + 3, last)] = y3


@njit(cache=True, parallel=True)
def int8_matmul(blocks: np.ndarray, code: int, q, d, quads, sums) -> np.ndarray:
    """W [R, C] (format ``code``, as blocks [R, R_bytes]) times T tokens' quantized activations
    (``quantize_activations``) -> [T, R] float32, parallel over tasks of rows."""
    out = np.empty((q.shape[0], blocks.shape[0]), np.float32)
    for task in prange(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _int8_task(blocks, code, q, d, quads, sums, out, task)
    return out


@njit(cache=True)
def int8_matmul_serial(blocks: np.ndarray, code: int, q, d, quads, sums) -> np.ndarray:
    """``int8_matmul`` on the calling thread alone, for matrices too small to repay waking a pool."""
    out = np.empty((q.shape[0], blocks.shape[0]), np.float32)
    for task in range(ceil_div(blocks.shape[0], ROWS_PER_TASK)):
        _int8_task(blocks, code, q, d, quads, sums, out, task)
    return out
