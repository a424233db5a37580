"""The quantized matmul kernels against their NumPy twin: dequantize (the spec), then a float32 matmul.

Each example draws a format, a weight matrix of random blocks (rows of any
count, whole blocks per row as every GGML format requires; scales drawn from
ordinary values and the float16 extremes: the largest, the smallest normal
and subnormal, zeros of both signs) and float32 inputs, and checks

- the decoded weights (``dequantize_rows``) equal the spec's bit for bit;
- ``quant_matvec`` / ``quant_matmul`` / ``QuantizedTensor.matmul`` equal
  ``x @ dequantize(W).T`` within the float32 summation-order bound
  ``2 (C + 2) u M`` per output, u = 2^-24 and M = sum_i |x_i| (|a_i q_i| + |c_i|)
  for weights w_i = a_i q_i + c_i (docs/quantization.md derives it).

Requantization is checked byte for byte against gguf's quantizers, which
reproduce llama.cpp's.
"""

from __future__ import annotations

import re

import gguf
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels import quant_matmul
from refllm.kernels.dense_matmul import linear as linear_kernel
from refllm.kernels.quant_formats import FORMAT_CODES, FORMATS, KERNEL_FORMATS
from refllm.kernels.quant_matmul import dequantize_rows, quant_matvec
from refllm.kernels.quant_matmul import quant_matmul as matmul_kernel
from refllm.models.weights import weight_bytes_by_format
from refllm.nn.linear import linear
from refllm.quant.formats import UnsupportedFormatError, block_format, dequantize
from refllm.quant.linear import QuantizedShapeError, QuantizedTensor
from refllm.quant.requantize import requantize
from tests.helpers.rounding import UNIT_ROUNDOFF

SETTINGS = settings(max_examples=20, deadline=None)  # per format

# Byte offsets of each format's float16 fields: scales (w grows with them) and subtracted minimums.
SCALE_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80], "Q3_K": [108], "Q4_K": [0], "Q5_K": [0], "Q6_K": [208],
}  # fmt: skip
MIN_FIELDS = {"Q2_K": [82], "Q4_K": [2], "Q5_K": [2]}
EXTREME_F16 = np.array([65504.0, -65504.0, 2.0**-14, 2.0**-24, -(2.0**-24), 0.0, -0.0], np.float16)


def random_blocks(name: str, rows: int, blocks_per_row: int, rng: np.random.Generator, extreme: float) -> np.ndarray:
    """[rows, blocks_per_row * type_size] random bytes; each float16 field ordinary, or with probability
    ``extreme`` one of EXTREME_F16."""
    size = block_format(name).type_size
    blocks = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    for offset in SCALE_FIELDS[name] + MIN_FIELDS.get(name, []):
        values = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
        pick = rng.random(len(blocks)) < extreme
        values[pick] = rng.choice(EXTREME_F16, size=int(pick.sum()))
        blocks[:, offset : offset + 2] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def magnitude(blocks: np.ndarray, name: str, shape: tuple[int, int]) -> np.ndarray:
    """|a q| + |c| for every weight w = a q + c: the spec's dequantization with scales made
    positive and subtracted minimums negative (the integer parts q, min are never negative)."""
    signed = blocks.copy().reshape(-1, block_format(name).type_size)
    for offset in SCALE_FIELDS[name]:
        signed[:, offset + 1] &= 0x7F
    for offset in MIN_FIELDS.get(name, []):
        signed[:, offset + 1] |= 0x80
    return np.abs(dequantize(signed, name, shape))


def assert_within_summation_bound(actual: np.ndarray, x: np.ndarray, blocks: np.ndarray, name: str) -> None:
    """actual [T, R] against x [T, C] @ dequantize(W).T, within 2 (C + 2) u M."""
    rows, cols = blocks.shape[0], x.shape[1]
    weights = dequantize(blocks, name, (rows, cols))
    expected = x @ weights.T
    bound = 2 * (cols + 2) * UNIT_ROUNDOFF * (np.abs(x).astype(np.float64) @ magnitude(blocks, name, (rows, cols)).T)
    excess = np.abs(actual.astype(np.float64) - expected) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{name}: output {worst} = {actual[worst]!r}, spec {expected[worst]!r}, bound {bound[worst]:.3g}"
    )


@st.composite
def products(draw: st.DrawFn) -> dict:
    return {
        "rows": draw(st.integers(1, 37)),  # any count: the kernels take rows four and sixteen at a time
        "blocks_per_row": draw(st.integers(1, 4)),
        "tokens": draw(st.integers(1, 6)),  # 1: QuantizedTensor multiplies by quant_matvec, more: quant_matmul
        "extreme": draw(st.sampled_from([0.0, 0.2, 1.0])),
        "x_scale": draw(st.sampled_from([1e-3, 1.0, 1e3])),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def draw_case(name: str, case: dict) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(case["seed"])
    per_row = case["blocks_per_row"] if block_format(name).block_size == 32 else (case["blocks_per_row"] + 1) // 2
    blocks = random_blocks(name, case["rows"], per_row, rng, case["extreme"])
    cols = per_row * block_format(name).block_size
    x = (rng.standard_normal((case["tokens"], cols)) * case["x_scale"]).astype(np.float32)
    return blocks, x


@pytest.mark.parametrize("name", KERNEL_FORMATS)
@SETTINGS
@given(products())
def test_decoded_rows_are_the_spec_bit_for_bit(name, case):
    blocks, x = draw_case(name, case)
    cols = x.shape[1]
    ours = dequantize_rows(blocks, FORMAT_CODES[name], cols)
    np.testing.assert_array_equal(ours.view(np.uint32), dequantize(blocks, name, (len(blocks), cols)).view(np.uint32))


@pytest.mark.parametrize("name", KERNEL_FORMATS)
@SETTINGS
@given(products())
def test_matvec_and_matmul_equal_dequantize_then_matmul(name, case):
    blocks, x = draw_case(name, case)
    code = FORMAT_CODES[name]
    assert_within_summation_bound(quant_matvec(blocks, code, x[0])[None], x[:1], blocks, name)
    assert_within_summation_bound(matmul_kernel(blocks, code, x), x, blocks, name)


@pytest.mark.parametrize("name", KERNEL_FORMATS)
@SETTINGS
@given(products())
def test_quantized_tensor_in_the_fast_linear(name, case):
    blocks, x = draw_case(name, case)
    tensor = QuantizedTensor(blocks, name, (len(blocks), x.shape[1]))
    assert_within_summation_bound(linear_kernel(x, tensor), x, blocks, name)
    assert linear_kernel(x[0], tensor).shape == (len(blocks),)


def test_the_spec_linear_refuses_a_quantized_tensor_rather_than_dequantizing_it(q4_1):
    with pytest.raises(AttributeError):
        linear(np.zeros((1, q4_1.shape[1]), np.float32), q4_1)


@pytest.mark.parametrize("name", KERNEL_FORMATS)
def test_inner_loops_are_vectorised(name):
    """The optimised LLVM IR of this format's decode product (its ``dot4``) and of the prefill
    micro-kernel (``_tile4x4``) does float arithmetic on vectors: their loops were vectorised, not
    left scalar or unrolled into scalars."""
    entry = FORMATS[FORMAT_CODES[name]]
    dot4 = entry.dot4
    row = np.zeros(2 * block_format(name).type_size, np.uint8)
    x = np.zeros(2 * block_format(name).block_size, np.float32)
    dot4((row, row, row, row), (row, row, row, row), x, entry.sums(x))
    tile = numba.njit(fastmath=quant_matmul.SUM_FASTMATH)(quant_matmul._tile4x4.py_func)  # uncached: cached code hides its IR
    tile(np.zeros((4, 64), np.float32), 0, np.zeros((4, 64), np.float32), 0)
    for kernel in (dot4, tile):
        ir = kernel.inspect_llvm(kernel.signatures[0])
        assert re.search(r"= (fmul|fadd|fsub|call [^(]*@llvm\.fmuladd)[^\n]*<(8|16) x float>", ir), (
            f"{name}: no vector float arithmetic in {kernel.py_func.__name__}"
        )


# ---- requantization -----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["Q8_0", "Q4_0"]),
    st.integers(1, 9),
    st.integers(1, 4),
    st.sampled_from([1e-6, 1.0, 1e4]),
    st.integers(0, 2**32 - 1),
)
def test_requantization_matches_llama_cpp_byte_for_byte(name, rows, blocks_per_row, scale, seed):
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, 32 * blocks_per_row)) * scale).astype(np.float32)
    weights[0, :32] = 0.0  # an all-zero block: d = 0
    weights[-1, -32:] = np.float32(scale) * np.arange(-16, 16) / 2  # exact halves: roundf's ties
    expected = gguf.quants.quantize(weights, gguf.GGMLQuantizationType[name]).reshape(rows, -1)
    np.testing.assert_array_equal(requantize(weights, name), expected)


def test_requantized_tensor_multiplies_like_its_dequantized_self():
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((70, 96)).astype(np.float32)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    for name in ("Q8_0", "Q4_0"):
        tensor = QuantizedTensor.quantize(weights, name)
        assert_within_summation_bound(tensor.matmul(x), x, tensor.blocks, name)
        assert np.abs(tensor.dequantize() - weights).max() <= np.abs(weights).max() / (8 if name == "Q4_0" else 100)


# ---- QuantizedTensor as a weight --------------------------------------------------------------------


@pytest.fixture
def q4_1():
    rng = np.random.default_rng(1)
    return QuantizedTensor(random_blocks("Q4_1", 10, 2, rng, 0.0), "Q4_1", (10, 64))


def test_row_lookup_dequantizes_only_those_rows_as_the_spec_does(q4_1):
    ids = np.array([[3, 0], [9, 3]])
    np.testing.assert_array_equal(q4_1[ids], q4_1.dequantize()[ids])
    assert q4_1[4].shape == (64,)


def test_row_slices_stay_quantized_views(q4_1):
    part = q4_1[2:7]
    assert isinstance(part, QuantizedTensor) and part.shape == (5, 64)
    assert np.shares_memory(part.blocks, q4_1.blocks)
    np.testing.assert_array_equal(part.dequantize(), q4_1.dequantize()[2:7])


def test_blocks_are_read_only_views_so_every_tensor_shares_one_compiled_kernel():
    """Numba compiles per array type, writability included: writable blocks (a copy, a
    requantized tensor) beside read-only file views would load every kernel twice."""
    stored = random_blocks("Q4_1", 8, 2, np.random.default_rng(2), 0.0)
    tensor = QuantizedTensor(stored, "Q4_1", (8, 64))
    assert not tensor.blocks.flags.writeable and stored.flags.writeable
    assert np.shares_memory(tensor.blocks, stored)
    assert numba.typeof(tensor.blocks) == numba.typeof(tensor[2:6].blocks)


def test_weight_bytes_by_format_counts_a_shared_array_once(q4_1):
    from refllm.models.weights import ModelWeights

    norm = np.ones(64, np.float32)
    weights = ModelWeights(embed_tokens=q4_1, norm=norm, lm_head=q4_1, layers=[])
    assert weight_bytes_by_format(weights) == {"Q4_1": 10 * 2 * 20, "F32": 256}


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.matmul(np.zeros((2, 63), np.float32)),  # wrong C
        lambda t: t.matmul(np.zeros((2, 64), np.float64)),  # not float32
        lambda t: t[::2],  # a strided slice
        lambda t: t[1.5],
        lambda t: t[np.array([3, 10])],  # row 10 of 10
        lambda t: QuantizedTensor(t.blocks, "F16", t.shape),  # no kernel reads F16
        lambda t: QuantizedTensor(t.blocks, "Q4_1", (10, 65)),  # C not whole blocks
        lambda t: QuantizedTensor(t.blocks[:, :20], "Q4_1", t.shape),  # blocks of the wrong size
        lambda t: QuantizedTensor.quantize(np.zeros((2, 64), np.float32), "Q4_K"),  # cannot quantize to
        lambda t: QuantizedTensor.quantize(np.zeros((2, 48), np.float32), "Q8_0"),
    ],
)
def test_refusals_are_value_errors_naming_the_value(q4_1, call):
    with pytest.raises(ValueError) as refusal:
        call(q4_1)
    assert isinstance(refusal.value, (QuantizedShapeError, UnsupportedFormatError))
    assert re.search(r"\d|F16|Q4_K|step", str(refusal.value))
