"""Prompt-sized float32 products in BLAS (refllm/kernels/gemm.py) against the spec's ``x @ W.T``.

The fast op set's ``linear`` sends GEMM_TOKENS tokens or more through a float32
matrix to sgemm, on the forward pass's threads. Token and row counts are drawn
across GEMM_TOKENS, thread counts from one to all, and every result
is held to the float32 summation-order bound the kernels meet, against the
float64 product.
"""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels import gemm
from refllm.kernels.dense_matmul import linear as linear_kernel
from refllm.kernels.gemm import GEMM_TOKENS
from refllm.kernels.threads import computing
from tests.test_dense_matmul import assert_within_summation_bound

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(
    rows=st.integers(1, 70),
    cols=st.sampled_from([1, 17, 64, 100]),
    tokens=st.integers(GEMM_TOKENS - 1, GEMM_TOKENS + 40),
    threads=st.integers(1, numba.config.NUMBA_NUM_THREADS),
    scale=st.sampled_from([1e-30, 1.0, 1e30]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_prompt_chunk_is_the_product_within_float32_rounding_on_any_thread_count(
    rows, cols, tokens, threads, scale, seed
):
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    saved = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        with computing():
            out = linear_kernel(x, weights)
    finally:
        numba.set_num_threads(saved)
    assert_within_summation_bound(out, x, weights)


def test_blas_gets_the_passes_threads_inside_a_product_and_one_thread_around_it(monkeypatch):
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]

    inside = []
    real_matmul = np.matmul
    monkeypatch.setattr(gemm.np, "matmul", lambda *a, **k: inside.append(blas_threads()) or real_matmul(*a, **k))
    weights = np.ones((10, 32), np.float32)
    x = np.ones((GEMM_TOKENS, 32), np.float32)
    with computing():
        threads = numba.get_num_threads()
        around = blas_threads()
        out = linear_kernel(x, weights)
        after = blas_threads()
    np.testing.assert_array_equal(out, np.full((GEMM_TOKENS, 10), 32.0, np.float32))
    assert set(around) == set(after) == {1}
    assert inside and all(set(counts) == {threads} for counts in inside)
