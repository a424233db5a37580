"""ggml's quantizers and dot products, spec against the installed llama.cpp library, bit for bit (skips
without llama-cpp-python); and spec variants one rounding or one order away, which the check tells apart."""

from __future__ import annotations

import numpy as np
import pytest

from refllm.testing.ggml.agreement import FORMATS, VARIANTS, dot_agreement, quantizer_agreement
from refllm.testing.ggml.dots import ACTIVATION_TYPE
from refllm.testing.ggml.quantizers import QUANTIZERS

pytest.importorskip("llama_cpp")

from refllm.testing.ggml.library import installed_library  # noqa: E402

LIBRARY = installed_library()


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_the_quantizers_agree_with_the_library_bit_for_bit(name):
    agreement = quantizer_agreement(LIBRARY, name, rows=200)
    assert agreement.identical == agreement.compared == 200


@pytest.mark.parametrize("name", FORMATS)
def test_the_dot_products_agree_with_the_library_bit_for_bit(name):
    assert LIBRARY.vec_dot_type(name) == ACTIVATION_TYPE[name]
    agreement = dot_agreement(LIBRARY, name, rows=64)
    assert agreement.identical == agreement.compared == 4 * 64


def test_the_wrong_variants_are_told_apart():
    kernel, ties_away = VARIANTS["Q8_0 rounding ties away from zero"]
    assert quantizer_agreement(LIBRARY, kernel, rows=200, spec=ties_away).identical < 200
    kernel, per_block = VARIANTS["Q4_0 dot product summed per block, not per lane"]
    assert dot_agreement(LIBRARY, kernel, rows=64, spec=per_block).identical < 4 * 64


def test_rounding_ties_are_where_the_variant_parts():
    x = np.tile(np.float32([127, 2.5, -2.5, 0.5, -0.5, 1.5, 3.5, -4.5]), 4)  # amax 127: x * 127 / amax = x
    _, ties_away = VARIANTS["Q8_0 rounding ties away from zero"]
    assert np.array_equal(QUANTIZERS["Q8_0"](x), LIBRARY.quantize("Q8_0", x))
    assert not np.array_equal(ties_away(x), LIBRARY.quantize("Q8_0", x))


def test_the_report_names_the_build():
    assert LIBRARY.build().startswith(f"llama-cpp-python {LIBRARY.version}, ")
    assert LIBRARY.isa()["avx2"] == ("avx2" in LIBRARY.build().split())
