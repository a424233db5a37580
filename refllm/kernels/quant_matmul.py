"""Numba products with GGML-quantized weights: y = x @ W.T, W read from its blocks.

W arrives as a GGUF file stores it: ``blocks`` [R, R_bytes] uint8, row r the
C / B blocks of weight row r, in one of the layouts of
``refllm/quant/formats.py`` (each documented beside its NumPy dequantizer
there). x is float32 and stays float32.

Every kernel works a row at a time: it decodes weight row r into a float32
scratch row of C weights (small enough to stay in L1), then takes that row's
dot product with each row of x. So a row's bytes are read once per call,
whatever the number of tokens, and the arithmetic is two simple loops.

The row decoders ``_<format>_row`` are the kernels' NumPy twins'
(``refllm.quant.formats.dequantize_<format>``) loop for loop: the same float32
operations in the same order, without fast-math, so a decoded row equals the
spec bit for bit (only NaN payloads are not kept). The dot product is the one
place whose rounding differs from the spec's ``x @ W.T``: it sums in the order
LLVM's vectoriser picks (``_dot``). docs/quantization.md derives the
tolerance.

Vectorisation: LLVM vectorises the inner loop of every row decoder and of
``_dot``; ``tests/test_quant_kernels.py`` asserts it on the optimised LLVM IR
of each (``inspect_llvm``: float vector instructions), and on this machine's
AVX-512 ``inspect_asm`` shows vpmovzxb*/vcvt*2ps/vfmadd*ps on ymm/zmm
registers. The decoders' inner loops run over slices whose length LLVM cannot
fold to a constant: a loop of a constant 16 or 32 iterations is fully unrolled
into scalar code before the loop vectoriser ever sees it.

Dimension letters: R weight rows (outputs), C columns (inputs), T tokens,
B weights per block.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refllm.quant.formats import FORMATS

# Formats with a row decoder, by kernel code (a small int the compiled kernels branch on).
KERNEL_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FORMAT_CODES = {name: code for code, name in enumerate(KERNEL_FORMATS)}
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = range(len(KERNEL_FORMATS))
TYPE_SIZES = np.array([FORMATS[name].type_size for name in KERNEL_FORMATS], np.int64)
BLOCK_SIZES = np.array([FORMATS[name].block_size for name in KERNEL_FORMATS], np.int64)

# Rows per parallel task: each task allocates one scratch row, so tasks must not be single rows;
# 16 rows still give a 192-row projection 12 tasks to share between cores.
ROWS_PER_TASK = 16

# 2^(e - 25) for float16 exponent field e = 1..30; entry 0 serves subnormals (2^-24).
_F16_POWERS = np.array([2.0**-24] + [2.0 ** (e - 25) for e in range(1, 31)] + [np.inf], np.float32)


@njit(cache=True)
def _f16(low: int, high: int) -> np.float32:
    """Two little-endian bytes of an IEEE float16 -> float32 (Numba has no float16)."""
    bits = np.int32(low) | (np.int32(high) << 8)
    exponent = (bits >> 10) & 31
    mantissa = bits & 1023
    if exponent == 31:
        value = np.float32(np.inf) if mantissa == 0 else np.float32(np.nan)
    elif exponent == 0:
        value = np.float32(mantissa) * _F16_POWERS[0]
    else:
        value = np.float32(mantissa | 1024) * _F16_POWERS[exponent]
    return -value if bits & 0x8000 else value


# ---- row decoders: row [C / B * type_size] uint8 -> out [C] float32 --------------------------------


@njit(cache=True)
def _q4_0_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q4_0 (18 bytes): d f16 | 16 bytes, byte j = weight j (low nibble), j + 16 (high); w = d * (q - 8)."""
    for b in range(out.shape[0] // 32):
        d = _f16(row[18 * b], row[18 * b + 1])
        qs = row[18 * b + 2 : 18 * b + 18]
        low, high = out[32 * b : 32 * b + 16], out[32 * b + 16 : 32 * b + 32]
        for j in range(qs.shape[0]):
            low[j] = d * np.float32(np.int8(qs[j] & 15) - np.int8(8))
            high[j] = d * np.float32(np.int8(qs[j] >> 4) - np.int8(8))


@njit(cache=True)
def _q4_1_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q4_1 (20 bytes): d f16 | m f16 | 16 bytes as Q4_0; w = d * q + m."""
    for b in range(out.shape[0] // 32):
        d, m = _f16(row[20 * b], row[20 * b + 1]), _f16(row[20 * b + 2], row[20 * b + 3])
        qs = row[20 * b + 4 : 20 * b + 20]
        low, high = out[32 * b : 32 * b + 16], out[32 * b + 16 : 32 * b + 32]
        for j in range(qs.shape[0]):
            low[j] = d * np.float32(qs[j] & 15) + m
            high[j] = d * np.float32(qs[j] >> 4) + m


@njit(cache=True)
def _high_bits(qh: np.ndarray) -> np.uint32:
    """4 little-endian bytes -> uint32."""
    return np.uint32(qh[0]) | np.uint32(qh[1]) << 8 | np.uint32(qh[2]) << 16 | np.uint32(qh[3]) << 24


@njit(cache=True)
def _q5_0_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 (22 bytes): d f16 | qh u32, bit i = bit 4 of weight i | 16 bytes as Q4_0; w = d * (q - 16)."""
    for b in range(out.shape[0] // 32):
        o = 22 * b
        d = _f16(row[o], row[o + 1])
        qh = _high_bits(row[o + 2 : o + 6])
        qs = row[o + 6 : o + 22]
        low, high = out[32 * b : 32 * b + 16], out[32 * b + 16 : 32 * b + 32]
        for j in range(qs.shape[0]):
            q_low = (qs[j] & 15) | ((qh >> j) & 1) << 4
            q_high = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4
            low[j] = d * np.float32(np.int8(q_low) - np.int8(16))
            high[j] = d * np.float32(np.int8(q_high) - np.int8(16))


@njit(cache=True)
def _q5_1_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q5_1 (24 bytes): d f16 | m f16 | qh as Q5_0 | 16 bytes as Q4_0; w = d * q + m."""
    for b in range(out.shape[0] // 32):
        o = 24 * b
        d, m = _f16(row[o], row[o + 1]), _f16(row[o + 2], row[o + 3])
        qh = _high_bits(row[o + 4 : o + 8])
        qs = row[o + 8 : o + 24]
        low, high = out[32 * b : 32 * b + 16], out[32 * b + 16 : 32 * b + 32]
        for j in range(qs.shape[0]):
            low[j] = d * np.float32((qs[j] & 15) | ((qh >> j) & 1) << 4) + m
            high[j] = d * np.float32((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) + m


@njit(cache=True)
def _q8_0_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q8_0 (34 bytes): d f16 | 32 int8; w = d * q."""
    for b in range(out.shape[0] // 32):
        d = _f16(row[34 * b], row[34 * b + 1])
        qs = row[34 * b + 2 : 34 * b + 34]
        w = out[32 * b : 32 * b + 32]
        for j in range(qs.shape[0]):
            w[j] = d * np.float32(np.int8(qs[j]))


@njit(cache=True)
def _q2_k_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q2_K (84 bytes): 16 scale|min nibble bytes | 64 bytes of 2-bit q | d f16 | dmin f16.

    Weight 128h + 32s + l (sub-block 8h + 2s + l // 16) is bits 2s..2s+1 of q byte 32h + l;
    w = d * scale * q - dmin * min.
    """
    for b in range(out.shape[0] // 256):
        o = 84 * b
        d, dmin = _f16(row[o + 80], row[o + 81]), _f16(row[o + 82], row[o + 83])
        for half in range(2):
            for shift in range(4):
                for part in range(2):
                    sub = 8 * half + 2 * shift + part
                    scale = d * np.float32(row[o + sub] & 15)
                    offset = dmin * np.float32(row[o + sub] >> 4)
                    first = 16 + 32 * half + 16 * part
                    qs = row[o + first : o + first + 16]
                    w = out[256 * b + 16 * sub : 256 * b + 16 * sub + 16]
                    for j in range(qs.shape[0]):
                        w[j] = scale * np.float32((qs[j] >> (2 * shift)) & 3) - offset


@njit(cache=True)
def _q3_k_scale(scales: np.ndarray, j: int) -> np.float32:
    """Signed 6-bit scale j of Q3_K's 12 scale bytes (see formats._q3_k_scales)."""
    low = np.int64(scales[j]) & 15 if j < 8 else np.int64(scales[j - 8]) >> 4
    high = (np.int64(scales[8 + j % 4]) >> (2 * (j // 4))) & 3
    return np.float32(np.int8(low | high << 4) - np.int8(32))


@njit(cache=True)
def _q3_k_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q3_K (110 bytes): 32 bytes hmask | 64 bytes of 2-bit q | 12 scale bytes | d f16.

    Weight i = 128h + 32s + l: bits 0-1 as Q2_K, bit 2 is bit (i // 32) of hmask byte l,
    a clear bit subtracting 4; w = d * scale[i // 16] * q.
    """
    for b in range(out.shape[0] // 256):
        o = 110 * b
        d = _f16(row[o + 108], row[o + 109])
        for half in range(2):
            for shift in range(4):
                for part in range(2):
                    sub = 8 * half + 2 * shift + part
                    scale = d * _q3_k_scale(row[o + 96 : o + 108], sub)
                    first = 32 + 32 * half + 16 * part
                    qs = row[o + first : o + first + 16]
                    hmask = row[o + 16 * part : o + 16 * part + 16]
                    w = out[256 * b + 16 * sub : 256 * b + 16 * sub + 16]
                    plane = 4 * half + shift
                    for j in range(qs.shape[0]):
                        minus_four = (((hmask[j] >> plane) & 1) ^ 1) << 2
                        w[j] = scale * np.float32(np.int8((qs[j] >> (2 * shift)) & 3) - np.int8(minus_four))


@njit(cache=True)
def _k_scale_min(scales: np.ndarray, j: int) -> tuple[np.float32, np.float32]:
    """6-bit scale and min of sub-block j from Q4_K/Q5_K's 12 scale bytes (see formats._k_scales_and_mins)."""
    if j < 4:
        return np.float32(scales[j] & 63), np.float32(scales[j + 4] & 63)
    scale = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4
    minimum = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
    return np.float32(scale), np.float32(minimum)


@njit(cache=True)
def _q4_k_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q4_K (144 bytes): d f16 | dmin f16 | 12 scale bytes | 128 bytes, 4 groups of 32.

    Group g holds sub-block 2g in its low nibbles and 2g + 1 in its high ones;
    w = (d * scale) * q - dmin * min.
    """
    for b in range(out.shape[0] // 256):
        o = 144 * b
        d, dmin = _f16(row[o], row[o + 1]), _f16(row[o + 2], row[o + 3])
        for g in range(4):
            scale, minimum = _k_scale_min(row[o + 4 : o + 16], 2 * g)
            scale_low, offset_low = d * scale, dmin * minimum
            scale, minimum = _k_scale_min(row[o + 4 : o + 16], 2 * g + 1)
            scale_high, offset_high = d * scale, dmin * minimum
            qs = row[o + 16 + 32 * g : o + 48 + 32 * g]
            low = out[256 * b + 64 * g : 256 * b + 64 * g + 32]
            high = out[256 * b + 64 * g + 32 : 256 * b + 64 * g + 64]
            for j in range(qs.shape[0]):
                low[j] = scale_low * np.float32(qs[j] & 15) - offset_low
                high[j] = scale_high * np.float32(qs[j] >> 4) - offset_high


@njit(cache=True)
def _q5_k_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q5_K (176 bytes): d f16 | dmin f16 | 12 scale bytes | 32 bytes qh | 128 bytes as Q4_K.

    Bit 4 of weight 32k + l is bit k of qh byte l; w = (d * scale) * q - dmin * min.
    """
    for b in range(out.shape[0] // 256):
        o = 176 * b
        d, dmin = _f16(row[o], row[o + 1]), _f16(row[o + 2], row[o + 3])
        qh = row[o + 16 : o + 48]
        for g in range(4):
            scale, minimum = _k_scale_min(row[o + 4 : o + 16], 2 * g)
            scale_low, offset_low = d * scale, dmin * minimum
            scale, minimum = _k_scale_min(row[o + 4 : o + 16], 2 * g + 1)
            scale_high, offset_high = d * scale, dmin * minimum
            qs = row[o + 48 + 32 * g : o + 80 + 32 * g]
            low = out[256 * b + 64 * g : 256 * b + 64 * g + 32]
            high = out[256 * b + 64 * g + 32 : 256 * b + 64 * g + 64]
            for j in range(qs.shape[0]):
                q_low = (qs[j] & 15) | ((qh[j] >> (2 * g)) & 1) << 4
                q_high = (qs[j] >> 4) | ((qh[j] >> (2 * g + 1)) & 1) << 4
                low[j] = scale_low * np.float32(q_low) - offset_low
                high[j] = scale_high * np.float32(q_high) - offset_high


@njit(cache=True)
def _q6_k_row(row: np.ndarray, out: np.ndarray) -> None:
    """Q6_K (210 bytes): 128 bytes ql | 64 bytes qh | 16 int8 scales | d f16.

    Weight 128h + 32s + l: bits 0-3 are the low (s < 2) or high (s >= 2) nibble of
    ql byte 64h + 32(s % 2) + l, bits 4-5 are bits 2s..2s+1 of qh byte 32h + l;
    w = (d * scale[i // 16]) * (q - 32).
    """
    for b in range(out.shape[0] // 256):
        o = 210 * b
        d = _f16(row[o + 208], row[o + 209])
        for half in range(2):
            for s in range(4):
                for part in range(2):
                    sub = 8 * half + 2 * s + part
                    scale = d * np.float32(np.int8(row[o + 192 + sub]))
                    first = 64 * half + 32 * (s % 2) + 16 * part
                    ql = row[o + first : o + first + 16]
                    qh = row[o + 128 + 32 * half + 16 * part : o + 144 + 32 * half + 16 * part]
                    w = out[256 * b + 16 * sub : 256 * b + 16 * sub + 16]
                    nibble_shift = 4 * (s // 2)
                    for j in range(ql.shape[0]):
                        q = (ql[j] >> nibble_shift) & 15 | ((qh[j] >> (2 * s)) & 3) << 4
                        w[j] = scale * np.float32(np.int8(q) - np.int8(32))


@njit(cache=True)
def _dequantize_row(code: int, row: np.ndarray, out: np.ndarray) -> None:
    """Decode one weight row in format ``code`` into ``out`` [C] float32."""
    if code == Q4_0:
        _q4_0_row(row, out)
    elif code == Q4_1:
        _q4_1_row(row, out)
    elif code == Q5_0:
        _q5_0_row(row, out)
    elif code == Q5_1:
        _q5_1_row(row, out)
    elif code == Q8_0:
        _q8_0_row(row, out)
    elif code == Q2_K:
        _q2_k_row(row, out)
    elif code == Q3_K:
        _q3_k_row(row, out)
    elif code == Q4_K:
        _q4_k_row(row, out)
    elif code == Q5_K:
        _q5_k_row(row, out)
    else:
        _q6_k_row(row, out)


# ---- the products ----------------------------------------------------------------------------------


@njit(cache=True, fastmath={"reassoc", "contract"})
def _dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """a [C] . b [C] float32.

    reassoc lets LLVM keep several vector partial sums (without it a float sum
    is one serial chain and stays scalar); contract lets it fuse the multiply
    and add. No other fast-math flags: infinities and NaNs propagate as in IEEE.
    """
    total = np.float32(0.0)
    for i in range(a.shape[0]):
        total += a[i] * b[i]
    return total


@njit(cache=True, parallel=True)
def quant_matmul(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ W.T -> [T, R] float32, W [R, C] in format ``code`` as blocks [R, R_bytes].

    NumPy twin: ``x @ refllm.quant.formats.dequantize(blocks, name, (R, C)).T``.
    Parallel over tasks of ``ROWS_PER_TASK`` rows; each row is decoded once and
    used for all T tokens.
    """
    num_rows = blocks.shape[0]
    num_tokens, num_cols = x.shape
    out = np.empty((num_tokens, num_rows), np.float32)
    for task in prange((num_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        weights = np.empty(num_cols, np.float32)  # [C] the decoded row
        for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows)):
            _dequantize_row(code, blocks[r], weights)
            for t in range(num_tokens):
                out[t, r] = _dot(weights, x[t])
    return out


@njit(cache=True, parallel=True)
def quant_matvec(blocks: np.ndarray, code: int, x: np.ndarray) -> np.ndarray:
    """x [C] float32 -> W @ x [R] float32 (decode at batch 1); W as in ``quant_matmul``.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C)) @ x``.
    """
    num_rows = blocks.shape[0]
    out = np.empty(num_rows, np.float32)
    for task in prange((num_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        weights = np.empty(x.shape[0], np.float32)
        for r in range(task * ROWS_PER_TASK, min((task + 1) * ROWS_PER_TASK, num_rows)):
            _dequantize_row(code, blocks[r], weights)
            out[r] = _dot(weights, x)
    return out


@njit(cache=True, parallel=True)
def dequantize_rows(blocks: np.ndarray, code: int, num_cols: int) -> np.ndarray:
    """blocks [R, R_bytes] in format ``code`` -> W [R, C] float32.

    NumPy twin: ``refllm.quant.formats.dequantize(blocks, name, (R, C))``, bitwise.
    """
    num_rows = blocks.shape[0]
    out = np.empty((num_rows, num_cols), np.float32)
    for r in prange(num_rows):
        _dequantize_row(code, blocks[r], out[r])
    return out
