"""How far the spec agrees with the installed library, kernel by kernel: draws that reach every quant value,
rounding tie and scale sign, the count of bit-identical outputs, and spec variants one rounding or one summation
order away, which the same draws must tell apart (or the comparison would have no teeth).

Used by ``tests/testing/ggml/test_kernels.py`` and ``benchmarks/ggml_kernels.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.testing.ggml.arith import fma32
from refllm.testing.ggml.blocks import BLOCKS, TYPE_IDS, as_blocks, half
from refllm.testing.ggml.dots import ACTIVATION_TYPE, WEIGHT_VALUES, spec_dot
from refllm.testing.ggml.library import GgmlLibrary
from refllm.testing.ggml.quantizers import QUANTIZERS

FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def draw_activations(rng: np.random.Generator, n: int) -> np.ndarray:
    """[n] float32: normal at a drawn scale, with outliers, sometimes zero blocks and exact rounding ties."""
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
    x[rng.integers(n, size=2)] *= 100
    if rng.random() < 0.2:
        x[: n // 2] = 0
    if rng.random() < 0.3:  # halves under a largest |x| of 127 * 2**k per block of 32: the quantizer's scale
        # is then exactly 2**-k, so every half lands on a rounding tie, where the rounding rule shows
        power = np.float32(2.0 ** int(rng.integers(-4, 5)))
        x = np.clip(np.round(rng.standard_normal(n) * 60) / 2, -126.5, 126.5).astype(np.float32)
        x[::32] = 127
        x *= power
    return x


def draw_weight_rows(
    rng: np.random.Generator, name: str, rows: int, blocks: int, scale: float = 0.01
) -> np.ndarray:
    """[rows, blocks * type_size] uint8: random bytes (every quant and sub-block scale occurs), with finite
    float16 scales and offsets of either sign, normal times ``scale``."""
    raw = rng.integers(0, 256, (rows, blocks * BLOCKS[name].type_size), dtype=np.uint8)
    records = as_blocks(raw, name)
    for field in {"d", "m", "dmin"} & set(records.dtype.names):
        records[field] = (rng.standard_normal(records.shape) * scale).astype(np.float16)
    return raw


def random_blocks(name: str, seed: int = 0, scale: float = 1e-3):
    """An ``encode`` for ``llamacpp.write_gguf``: every matrix as random ``name`` blocks (a model to run a
    format's kernels on, where gguf has no quantizer for it; scales small enough to keep activations finite)."""
    rng = np.random.default_rng(seed)

    def encode(array: np.ndarray, dtype: str) -> tuple[np.ndarray, int]:
        rows, columns = array.shape
        return draw_weight_rows(rng, name, rows, columns // BLOCKS[name].size, scale), TYPE_IDS[name]

    return encode


@dataclass(frozen=True)
class Agreement:
    kernel: str
    compared: int  # rows (a quantizer) or outputs (a dot product)
    identical: int


def quantizer_agreement(library: GgmlLibrary, name: str, rows: int = 512, seed: int = 0,
                        spec: Callable | None = None) -> Agreement:  # fmt: skip
    """``name``'s quantizer (or ``spec``, a variant) against the library's, on ``rows`` drawn rows of 1-4 blocks."""
    spec = spec or QUANTIZERS[name]
    rng, size = np.random.default_rng(seed), BLOCKS[name].size
    draws = [draw_activations(rng, size * int(rng.integers(1, 5))) for _ in range(rows)]
    same = sum(np.array_equal(spec(x), library.quantize(name, x)) for x in draws)
    return Agreement(f"quantize_row_{name.lower()}", rows, int(same))


def dot_agreement(library: GgmlLibrary, name: str, rows: int = 128, seed: int = 0,
                  spec: Callable | None = None) -> Agreement:  # fmt: skip
    """``name``'s dot product (or ``spec``, a variant) against the library's, rows of 1, 2, 3 and 9 blocks."""
    spec = spec or spec_dot
    rng, activation_type = np.random.default_rng(seed), ACTIVATION_TYPE[name]
    same = compared = 0
    for blocks in (1, 2, 3, 9):
        weights = draw_weight_rows(rng, name, rows, blocks)
        a = library.quantize(activation_type, draw_activations(rng, blocks * BLOCKS[name].size))
        got, want = library.dot(name, weights, a), spec(name, weights, a)
        same += int((got.view(np.uint32) == np.asarray(want, np.float32).view(np.uint32)).sum())
        compared += rows
    return Agreement(f"vec_dot_{name.lower()}_{activation_type.lower()}", compared, same)


# ---- variants one step away from the spec -----------------------------------------------------------


def q8_0_ties_away_from_zero(x: np.ndarray) -> np.ndarray:
    """Q8_0 with C's roundf (ties away from zero) where the kernel rounds ties to even."""
    blocks = np.frombuffer(QUANTIZERS["Q8_0"](x), BLOCKS["Q8_0"].dtype).copy()
    x = np.asarray(x, np.float32).reshape(len(blocks), 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        scaled = x * np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    blocks["qs"] = np.trunc(scaled + np.copysign(np.float32(0.5), scaled))
    return blocks.view(np.uint8)


def dot_summed_per_block(name: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """A dot product of a format without offsets (Q4_0, Q5_0, Q8_0) that adds each block's products in one
    float32 sum, where the kernel keeps 8 lanes."""
    w, a = as_blocks(weights, name), as_blocks(activations, ACTIVATION_TYPE[name])
    sums = (WEIGHT_VALUES[name](w) * a["qs"].astype(np.int32)).sum(axis=-1).astype(np.float32)  # [R, nb]
    total = np.zeros(len(w), np.float32)
    for b in range(w.shape[1]):
        total = fma32(half(w["d"][:, b]) * half(a["d"][b]), sums[:, b], total)
    return total


VARIANTS = {  # name -> (the kernel it varies, a spec with that one change)
    "Q8_0 rounding ties away from zero": ("Q8_0", q8_0_ties_away_from_zero),
    "Q4_0 dot product summed per block, not per lane": ("Q4_0", dot_summed_per_block),
}
