"""ggml's quantizers and dot products, spec against the installed llama.cpp library, bit for bit (skips
without llama-cpp-python); and spec variants one rounding or one order away, which the check tells apart."""

from __future__ import annotations

import numpy as np
import pytest

from refllm.testing.ggml import dots
from refllm.testing.ggml.blocks import BLOCKS, as_blocks
from refllm.testing.ggml.quantizers import QUANTIZERS

pytest.importorskip("llama_cpp")

from refllm.testing.ggml.library import installed_library  # noqa: E402

LIBRARY = installed_library()
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def activations(rng, n: int) -> np.ndarray:
    """Normal values at a drawn scale, with outliers, zero blocks and exact ties among them."""
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    x[rng.integers(n, size=2)] *= 100
    if rng.random() < 0.2:
        x[: n // 2] = 0
    if rng.random() < 0.3:
        x = np.round(x * 4) / 4  # many products land on .5 after scaling: the rounding rule shows
    return x


def weight_rows(rng, name: str, rows: int, blocks: int) -> np.ndarray:
    """Random bytes (every quant value occurs), with finite float16 scales and offsets of either sign."""
    raw = rng.integers(0, 256, (rows, blocks * BLOCKS[name].type_size), dtype=np.uint8)
    records = as_blocks(raw, name)
    for field in {"d", "m", "dmin"} & set(records.dtype.names):
        records[field] = (rng.standard_normal(records.shape) * 0.01).astype(np.float16)
    return raw


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_the_quantizers_agree_with_the_library_bit_for_bit(name):
    rng = np.random.default_rng(0)
    size = BLOCKS[name].size
    for _ in range(200):
        x = activations(rng, size * int(rng.integers(1, 5)))
        assert np.array_equal(QUANTIZERS[name](x), LIBRARY.quantize(name, x))


@pytest.mark.parametrize("name", FORMATS)
def test_the_dot_products_agree_with_the_library_bit_for_bit(name):
    rng = np.random.default_rng(1)
    activation_type = dots.ACTIVATION_TYPE[name]
    assert LIBRARY.vec_dot_type(name) == activation_type
    for blocks in (1, 2, 3, 9):
        weights = weight_rows(rng, name, 128, blocks)
        a = LIBRARY.quantize(activation_type, activations(rng, blocks * BLOCKS[name].size))
        got, want = LIBRARY.dot(name, weights, a), dots.spec_dot(name, weights, a)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (blocks, np.abs(got - want).max())


def test_a_quantizer_rounding_ties_away_from_zero_is_told_apart():
    x = np.tile(np.float32([127, 2.5, -2.5, 0.5, -0.5, 1.5, 3.5, -4.5]), 4)  # amax 127: x * 127 / amax = x
    away = np.sign(x) * np.floor(np.abs(x) + 0.5)
    assert not np.array_equal(np.rint(x), away)
    library = as_blocks(LIBRARY.quantize("Q8_0", x), "Q8_0")["qs"][0]
    assert np.array_equal(library, np.rint(x)) and not np.array_equal(library, away)
    assert np.array_equal(QUANTIZERS["Q8_0"](x), LIBRARY.quantize("Q8_0", x))


def test_a_dot_product_summed_per_block_instead_of_per_lane_is_told_apart(monkeypatch):
    rng = np.random.default_rng(2)
    weights = weight_rows(rng, "Q4_0", 256, 8)
    a = LIBRARY.quantize("Q8_0", activations(rng, 8 * 32))
    library = LIBRARY.dot("Q4_0", weights, a)

    fma32 = dots.fma32

    def per_block(scale, lanes, acc):  # each block's 8 lanes summed first, then one accumulator
        total = fma32(scale, lanes.sum(axis=-1, keepdims=True, dtype=np.float32), acc[..., :1])
        return np.concatenate([total, np.zeros_like(acc[..., 1:])], axis=-1)

    monkeypatch.setattr(dots, "fma32", per_block)
    assert not np.array_equal(dots.spec_dot("Q4_0", weights, a), library)


def test_the_report_names_the_build():
    assert LIBRARY.build().startswith(f"llama-cpp-python {LIBRARY.version}, ")
    assert LIBRARY.isa()["avx2"] == ("avx2" in LIBRARY.build().split())
