"""Prompt-sized float32 products (refllm/kernels/gemm.py) against the spec's ``x @ W.T``.

The fast op set's ``linear`` sends GEMM_TOKENS tokens or more through a float32
matrix to the Numba tile or to sgemm, whichever this machine ran the shape faster
when it first met it, on the forward pass's threads. Token and row counts are drawn
across GEMM_TOKENS, thread counts from one to all, and every result
is held to the float32 summation-order bound the kernels meet, against the
float64 product. The choice is measured once per shape and kept on disk.
"""

from __future__ import annotations

import json
import time

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refllm.kernels import gemm
from refllm.kernels.dense_matmul import dense_matmul
from refllm.kernels.dense_matmul import linear as linear_kernel
from refllm.kernels.gemm import GEMM_TOKENS
from refllm.kernels.threads import computing
from refllm.machine import machine_key
from tests.helpers.rounding import assert_within_summation_bound

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def fresh_choices(tmp_path, monkeypatch):
    """No kernel choice known yet, and a home of its own to keep them in."""
    monkeypatch.setenv("REFLLM_HOME", str(tmp_path))
    monkeypatch.setattr(gemm, "_choices", None)
    monkeypatch.setattr(gemm, "MEASURE_MIN_MACS", 0)  # the tests' small shapes are measured too
    return tmp_path


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
    fresh_choices, rows, cols, tokens, threads, scale, seed
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


def counting(kernel, calls: list, delay: float = 0.0):
    def counted(x, weights):
        calls.append(kernel.__name__)
        time.sleep(delay)
        return kernel(x, weights)

    counted.__name__ = kernel.__name__
    return counted


@pytest.mark.parametrize("slow", ["blas_matmul", "dense_matmul"])
def test_the_faster_kernel_is_measured_once_and_kept_on_disk(fresh_choices, monkeypatch, slow):
    calls = []
    tile = counting(dense_matmul, calls, 0.01 if slow == "dense_matmul" else 0.0)
    monkeypatch.setattr(gemm, "blas_matmul", counting(gemm.blas_matmul, calls, 0.01 if slow == "blas_matmul" else 0.0))
    weights, x = np.ones((12, 32), np.float32), np.ones((GEMM_TOKENS + 3, 32), np.float32)
    np.testing.assert_array_equal(gemm.prompt_matmul(x, weights, tile), np.full((len(x), 12), 32.0, np.float32))
    assert sorted(calls) == sorted(["blas_matmul", "dense_matmul"] * gemm.MEASURE_ROUNDS)
    faster = "dense_matmul" if slow == "blas_matmul" else "blas_matmul"
    stored = json.loads((fresh_choices / gemm.CHOICES_FILE).read_text())[machine_key()]
    key = f"12x32x{GEMM_TOKENS}"
    assert stored == {key: gemm.TILE if faster == "dense_matmul" else gemm.BLAS}
    monkeypatch.setattr(gemm, "_choices", None)  # another process on this machine: reads the file
    calls.clear()
    gemm.prompt_matmul(x[:GEMM_TOKENS], weights, tile)  # the same bucket of tokens
    assert calls == [faster]


def test_a_small_product_takes_the_tile_unmeasured(fresh_choices, monkeypatch):
    monkeypatch.setattr(gemm, "MEASURE_MIN_MACS", 10**9)
    calls = []
    monkeypatch.setattr(gemm, "blas_matmul", counting(gemm.blas_matmul, calls))
    weights, x = np.ones((3, 32), np.float32), np.ones((GEMM_TOKENS, 32), np.float32)
    out = gemm.prompt_matmul(x, weights, counting(dense_matmul, calls))
    np.testing.assert_array_equal(out, np.full((len(x), 3), 32.0, np.float32))
    assert calls == ["dense_matmul"] and gemm._known_choices() == {}
    assert not (fresh_choices / gemm.CHOICES_FILE).exists()


def test_an_unreadable_choices_file_means_measuring_again(fresh_choices):
    (fresh_choices / gemm.CHOICES_FILE).write_text("{not json")
    weights, x = np.ones((3, 32), np.float32), np.ones((GEMM_TOKENS, 32), np.float32)
    np.testing.assert_array_equal(gemm.prompt_matmul(x, weights, dense_matmul), np.full((len(x), 3), 32.0, np.float32))
    assert machine_key() in json.loads((fresh_choices / gemm.CHOICES_FILE).read_text())


def test_blas_gets_the_passes_threads_inside_a_product_and_one_thread_around_it(monkeypatch, fresh_choices):
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
        gemm._known_choices()[gemm._shape_key(x, weights)] = gemm.BLAS
        around = blas_threads()
        out = linear_kernel(x, weights)
        after = blas_threads()
    np.testing.assert_array_equal(out, np.full((GEMM_TOKENS, 10), 32.0, np.float32))
    assert set(around) == set(after) == {1}
    assert inside and all(set(counts) == {threads} for counts in inside)
