"""The rules for which ggml CPU kernel runs a matrix product on x86 (what llama.cpp does is checked against
them in test_graph_trace.py and benchmarks/ggml_kernels.py)."""

from __future__ import annotations

import pytest

from refllm.testing.ggml.dispatch import x86_kernel

AVX512 = {"avx": True, "avx2": True, "avx512": True, "llamafile": True}
AVX2_ONLY = {"avx": True, "avx2": True, "avx512": False, "llamafile": True}


@pytest.mark.parametrize(
    ("weight_type", "rows", "tokens", "isa", "repack", "kernel"),
    [
        ("Q4_0", 64, 1, AVX512, True, "repacked"),  # rows of 8: repacked, even for a decode step
        ("Q4_0", 60, 1, AVX512, True, "vec_dot"),  # not a multiple of 8: stays as the file has it
        ("Q4_0", 64, 5, AVX512, False, "llamafile"),
        ("Q2_K", 64, 1, AVX512, True, "repacked"),
        ("Q2_K", 64, 1, AVX2_ONLY, True, "vec_dot"),  # Q2_K repacks with AVX-512 only
        ("Q6_K", 64, 8, AVX512, True, "tiled"),
        ("Q6_K", 64, 7, AVX512, True, "vec_dot"),
        ("Q4_K", 64, 8, AVX512, True, "repacked"),  # repacked weights never reach the tiled kernels
        ("Q4_K", 64, 8, AVX512, False, "tiled"),
        ("Q8_0", 64, 2, AVX512, True, "llamafile"),
        ("Q8_0", 64, 1, AVX512, True, "vec_dot"),
        ("Q4_1", 64, 100, AVX512, True, "vec_dot"),  # no other kernel takes Q4_1 or Q5_1
        ("Q5_0", 64, 3, {**AVX512, "llamafile": False}, True, "vec_dot"),
    ],
)
def test_the_kernel_for_each_case(weight_type, rows, tokens, isa, repack, kernel):
    assert x86_kernel(weight_type, rows, tokens, isa, repack, environment={}) == kernel


def test_the_tiled_kernels_follow_their_environment_variables():
    assert x86_kernel("Q6_K", 64, 8, AVX512, environment={"GGML_CPU_TILED_MM": "0"}) == "vec_dot"
    assert x86_kernel("Q6_K", 64, 1, AVX512, environment={"GGML_CPU_TILED_MM_FORCE": "1"}) == "tiled"
    assert x86_kernel("Q6_K", 64, 8, AVX512, environment={"GGML_CPU_TILED_MM": "off"}) == "vec_dot"  # atoi: 0
