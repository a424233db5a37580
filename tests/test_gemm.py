"""Prompt-sized products in BLAS (refllm/kernels/gemm.py) against the spec's ``x @ W.T``.

The fast op set's ``linear`` sends GEMM_TOKENS tokens or more to sgemm: a
float32 matrix directly, a quantized one decoded a panel of rows at a time.
Token and row counts are drawn across GEMM_TOKENS and across panel boundaries
(the panel shrunk to a few rows), and every result is held to the float32
summation-order bound the kernels meet, against the float64 product.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from refllm.kernels import gemm
from refllm.kernels.dense_matmul import linear as linear_kernel
from refllm.kernels.gemm import GEMM_TOKENS
from refllm.kernels.quant_matmul import KERNEL_FORMATS
from refllm.kernels.threads import computing
from refllm.quant.formats import block_format
from refllm.quant.linear import QuantizedTensor
from tests.test_dense_matmul import assert_within_summation_bound as assert_dense_within_bound
from tests.test_quant_kernels import assert_within_summation_bound as assert_quantized_within_bound
from tests.test_quant_kernels import random_blocks

SETTINGS = settings(max_examples=25, deadline=None)
TOKENS = st.integers(GEMM_TOKENS - 1, GEMM_TOKENS + 40)


@SETTINGS
@given(
    rows=st.integers(1, 70),
    cols=st.sampled_from([1, 17, 64, 100]),
    tokens=TOKENS,
    scale=st.sampled_from([1e-30, 1.0, 1e30]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_prompt_chunk_through_a_float32_matrix_is_the_product_within_float32_rounding(rows, cols, tokens, scale, seed):
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    with computing():
        assert_dense_within_bound(linear_kernel(x, weights), x, weights)


@pytest.mark.parametrize("name", KERNEL_FORMATS)
@SETTINGS
@given(
    rows=st.integers(1, 40),
    blocks_per_row=st.integers(1, 3),
    tokens=TOKENS,
    panel_rows=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_prompt_chunk_through_a_quantized_matrix_is_the_product_within_float32_rounding(
    name, rows, blocks_per_row, tokens, panel_rows, seed, monkeypatch_module
):
    rng = np.random.default_rng(seed)
    per_row = blocks_per_row if block_format(name).block_size == 32 else 1
    blocks = random_blocks(name, rows, per_row, rng, extreme=0.2)
    cols = per_row * block_format(name).block_size
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    monkeypatch_module.setattr(gemm, "PANEL_BYTES", panel_rows * 4 * cols)  # panels of a few rows
    with computing():
        out = linear_kernel(x, QuantizedTensor(blocks, name, (rows, cols)))
    assert_quantized_within_bound(out, x, blocks, name)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def blas_threads() -> int:
    return max(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas")


def test_blas_gets_the_pools_threads_inside_a_product_and_one_thread_around_it(monkeypatch):
    seen = []
    real_matmul = np.matmul

    def watching(*args, **kwargs):
        seen.append(blas_threads())
        return real_matmul(*args, **kwargs)

    weights = np.ones((8, 32), np.float32)
    x = np.ones((GEMM_TOKENS, 32), np.float32)
    monkeypatch.setattr(gemm.np, "matmul", watching)
    with computing():
        around = blas_threads()
        gemm.quantized_blas_matmul(x, 8, lambda first, last: weights[first:last])
        after = blas_threads()
        threads = numba.get_num_threads()
    assert around == after == 1
    assert seen and all(count == threads for count in seen)
