"""The int8-activation products (refllm/kernels/int8_matmul.py) against NumPy specs.

- The activations' quantization equals its NumPy twin bit for bit.
- The integer dot products of bytes are exact on every instruction set the module can emit
  (``vpdpbusd`` on zmm and ymm, ``vpmaddubsw`` on zmm and ymm, generic) that this CPU has,
  lane by lane, on the extremes the callers allow (u up to 128, s in -127..127).
- A product is the sum over blocks of (a d_g) I_g + c d_g S_g, with the integers I_g and S_g
  computed by NumPy, within float32 rounding of it: 2 (G + 4) u times the sum of the lanes'
  terms' magnitudes (u = 2^-24; G blocks, four roundings a term; a lane holds four products
  of a block). That is tighter than |a d_g|, so an integer sum off by one is caught wherever
  the block's lanes are not tiny.
- Against the default path (float32 activations) it stays within the bound of quantizing x:
  sum_i |w_i| d_g(i) / 2, plus both paths' float32 rounding; four tokens at a time (the tile)
  each token's result is the one it gets alone, bit for bit; prompt-sized products keep
  float32 activations.
"""

from __future__ import annotations

import gguf
import llvmlite.binding as llvm
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import refllm
from refllm.kernels import int8_intrinsics as isa
from refllm.kernels.int8_matmul import INT8_FORMATS, INT8_TOKENS, int8_matmul, int8_matmul_serial, quantize_activations
from refllm.kernels.intrinsics import sum16
from refllm.kernels.quant_formats import FORMAT_CODES
from refllm.models.decoder import ModelDtypeError
from refllm.models.weights import weight_leaves
from refllm.quant.formats import dequantize
from refllm.quant.linear import QuantizedTensor, UnsupportedActivationsError
from tests.helpers.paths import HF_DATA
from tests.helpers.rounding import UNIT_ROUNDOFF

INT8 = sorted(INT8_FORMATS)


def quantize_spec(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, C] -> (q [T, C] int8, d [T, G] float32), in NumPy's float32 arithmetic."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=-1) / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inverse = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inverse[..., None]).astype(np.int8)
    return q.reshape(x.shape), d.astype(np.float32)


def block_parts(blocks: np.ndarray, name: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (a [R, G], c [R, G] float64, q_w [R, G, 32] int64): w = a q_w + c, as the spec decodes the blocks."""
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[name]
    b = blocks.reshape(rows, cols // 32, size)
    a = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if name == "Q8_0":
        return a, np.zeros_like(a), b[..., 2:34].copy().view(np.int8).astype(np.int64)
    packed = b[..., size - 16 :]
    nibbles = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.int64)
    if name == "Q4_0":
        return a, np.zeros_like(a), nibbles - 8
    return a, b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64), nibbles


@st.composite
def cases(draw: st.DrawFn) -> dict:
    return {
        "name": draw(st.sampled_from(INT8)),
        "rows": draw(st.integers(1, 37)),
        "blocks": draw(st.integers(1, 7)),  # odd counts: the last block pairs with nothing
        "tokens": draw(st.integers(1, 9)),  # four at a time while four remain, then one by one
        "x_scale": draw(st.sampled_from([1e-3, 1.0, 1e3])),
        "zero_block": draw(st.booleans()),  # a block of x all zeros: d = 0
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def draw_case(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(case["seed"])
    cols = 32 * case["blocks"]
    weights = rng.standard_normal((case["rows"], cols)).astype(np.float32)
    blocks = gguf.quants.quantize(weights, gguf.GGMLQuantizationType[case["name"]])
    x = (rng.standard_normal((case["tokens"], cols)) * case["x_scale"]).astype(np.float32)
    if case["zero_block"]:
        x[0, :32] = 0.0
    return blocks, x, dequantize(blocks, case["name"], weights.shape).astype(np.float64)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_activations_quantize_as_their_numpy_twin_bit_for_bit(case):
    _, x, _ = draw_case(case)
    q, d, quads, sums = quantize_activations(x)
    q_spec, d_spec = quantize_spec(x)
    cols, groups = x.shape[1], x.shape[1] // 32
    np.testing.assert_array_equal(q[:, :cols], q_spec)
    np.testing.assert_array_equal(d[:, :groups].view(np.uint32), d_spec.view(np.uint32))
    assert not q[:, cols:].any() and not d[:, groups:].any() and not sums[:, groups:].any()
    np.testing.assert_array_equal(quads[:, : cols // 4], -8 * q_spec.reshape(len(x), -1, 4).astype(np.int32).sum(-1))
    block_sums = q_spec.reshape(len(x), groups, 32).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(sums[:, :groups], d_spec * block_sums)


def _lane_total(chosen: int):
    """-> f(u, s, acc): the sum of ``dot_u8s8``'s 16 lanes, with the instructions of ``chosen``."""

    @njit
    def total(u: np.ndarray, s: np.ndarray, acc: np.ndarray) -> np.float32:
        lanes = isa.dot_u8s8(isa.load_bytes64(u, 0), isa.load_bytes64(s, 0), isa.load_int32x16(acc, 0), chosen)
        return sum16(isa.float32x16_of(lanes))  # exact: every partial sum here stays below 2^24

    return total


@pytest.mark.parametrize("chosen", [isa.VNNI512, isa.VNNI256, isa.MADD512, isa.MADD256, isa.GENERIC])
def test_byte_dot_products_are_exact_on_every_instruction_set(chosen):
    needs = {isa.VNNI512: ("avx512vnni", "avx512bw"), isa.VNNI256: ("avx512vnni", "avx512vl"),
             isa.MADD512: ("avx512bw",), isa.MADD256: ("avx2",), isa.GENERIC: ()}[chosen]  # fmt: skip
    features = llvm.get_host_cpu_features()
    if not all(features.get(name) for name in needs) and not (chosen == isa.VNNI256 and features.get("avxvnni")):
        pytest.skip(f"this CPU has no {isa.ISA_NAMES[chosen]}")
    total = _lane_total(chosen)
    rng = np.random.default_rng(chosen)
    for u, s in [
        (rng.integers(0, 129, 64), rng.integers(-127, 128, 64)),
        (np.full(64, 128), np.full(64, 127)),  # the largest products: 2 x 128 x 127 in one int16 pair
        (np.full(64, 128), np.full(64, -127)),
        (rng.integers(0, 16, 64), rng.integers(-127, 128, 64)),
    ]:
        for lane in range(16):  # one lane at a time: a lane's sum must be its own four bytes'
            acc = rng.integers(-1000, 1000, 16).astype(np.int32)
            mask = np.zeros(64, np.int64)
            mask[4 * lane : 4 * lane + 4] = 1
            expected = int(acc.astype(np.int64).sum() + (u * s * mask).sum())
            assert total((u * mask).astype(np.uint8), s.astype(np.int8), acc) == expected


@pytest.mark.parametrize("name", INT8)
@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_a_product_is_its_integer_sums_scaled_within_float32_rounding(name, case):
    case = case | {"name": name}
    blocks, x, _ = draw_case(case)
    rows, cols = case["rows"], x.shape[1]
    q, d, quads, sums = quantize_activations(x)
    actual = (int8_matmul if case["seed"] % 2 else int8_matmul_serial)(blocks, FORMAT_CODES[name], q, d, quads, sums)
    for t in range(len(x)):  # four tokens at a time, or one: the same numbers
        alone = int8_matmul_serial(blocks, FORMAT_CODES[name], *(part[t : t + 1] for part in (q, d, quads, sums)))
        np.testing.assert_array_equal(alone[0], actual[t])
    a, c, q_w = block_parts(blocks, name, rows, cols)
    q_x = q[:, :cols].reshape(len(x), -1, 32).astype(np.int64)  # [T, G, 32]
    # exact, in int64: each lane's four products [T, R, G, 8], and a block's sum of them
    quads = (q_w[None] * q_x[:, None]).reshape(len(x), rows, -1, 8, 4).sum(-1)
    d_x = d[:, : cols // 32].astype(np.float64)
    scale, offsets = a[None] * d_x[:, None], c[None] * (d_x * q_x.sum(-1))[:, None]  # [T, R, G]
    expected = (scale * quads.sum(-1) + offsets).sum(-1)
    magnitude = (np.abs(scale) * np.abs(quads).sum(-1) + np.abs(offsets)).sum(-1)  # the lanes' terms, unsummed
    bound = 2 * (cols // 32 + 4) * UNIT_ROUNDOFF * magnitude
    assert np.all(np.abs(actual - expected) <= bound)


@pytest.mark.parametrize("name", INT8)
@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_against_float32_activations_within_the_quantization_of_x(name, case):
    case = case | {"name": name}
    blocks, x, weights = draw_case(case)
    tensor = QuantizedTensor(blocks, name, weights.shape)
    default = tensor.matmul(x)
    int8 = tensor.with_activations("int8").matmul(x)
    _, d = quantize_spec(x)
    d_of_column = np.repeat(d.astype(np.float64), 32, axis=1)  # [T, C]
    quantization = (np.abs(weights)[None] * d_of_column[:, None] / 2).sum(-1)  # [T, R]
    rounding = 4 * (x.shape[1] + 4) * UNIT_ROUNDOFF * (np.abs(x).astype(np.float64) @ np.abs(weights).T)
    assert np.all(np.abs(int8.astype(np.float64) - default) <= quantization + 2 * rounding)


def test_prompt_sized_products_keep_float32_activations():
    rng = np.random.default_rng(3)
    blocks = gguf.quants.quantize(rng.standard_normal((20, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    tensor = QuantizedTensor(blocks, "Q4_0", (20, 64))
    x = rng.standard_normal((INT8_TOKENS, 64)).astype(np.float32)
    np.testing.assert_array_equal(tensor.with_activations("int8").matmul(x), tensor.matmul(x))
    assert not np.array_equal(tensor.with_activations("int8").matmul(x[:-1]), tensor.matmul(x[:-1]))


# ---- the option -----------------------------------------------------------------------------------------


def test_the_option_reaches_every_quantized_matrix_of_the_layers_and_the_lm_head_keeps_float32():
    model = refllm.load_model(HF_DATA / "llama", quantize="q4_0", activations="int8")
    quantized = [leaf for leaf in weight_leaves(model.weights.layers) if isinstance(leaf, QuantizedTensor)]
    assert quantized and all(leaf.activations == "int8" for leaf in quantized)
    assert model.weights.lm_head.activations == "float32"
    default = refllm.load_model(HF_DATA / "llama", quantize="q4_0")
    ids = np.array([[3, 17, 99, 5]])
    int8_logits = model.prefill(ids, model.create_kv_cache(), range(4))
    assert not np.array_equal(int8_logits, default.prefill(ids, default.create_kv_cache(), range(4)))


def test_formats_without_an_int8_product_keep_float32_activations():
    blocks = np.zeros((2, 144), np.uint8)  # one Q4_K super-block a row
    assert QuantizedTensor(blocks, "Q4_K", (2, 256), "int8").activations == "float32"


@pytest.mark.parametrize(
    "keywords",
    [{"quantize": "q8_0", "activations": "int4"}, {"activations": "int8"}, {"activations": "int8", "reference": True}],
)
def test_settings_that_cannot_run_are_refused_before_loading(keywords):
    with pytest.raises(ModelDtypeError, match="activations"):
        refllm.load_model(HF_DATA / "no such model", **keywords)


def test_a_quantized_tensor_refuses_unknown_activations():
    with pytest.raises(UnsupportedActivationsError, match="int4"):
        QuantizedTensor(np.zeros((1, 18), np.uint8), "Q4_0", (1, 32), "int4")
