"""Which ggml CPU kernel computes a matrix product, on x86 (``ggml_compute_forward_mul_mat``, llama.cpp as
llama-cpp-python 0.3.36 vendors it).

A MUL_MAT of a quantized weight W [N rows, K] with float32 activations X [T tokens, K] runs one of:

- **repacked**: the weight was loaded into the CPU "repack" buffer (llama.cpp's default, the model
  parameter ``use_extra_bufts``) and interleaved 8 rows at a time; its own gemv/gemm kernels
  (``repack.cpp``) sum in another order. x86 repacks Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, and Q2_K
  with AVX-512, when N is a multiple of 8.
- **llamafile**: for T >= 2 (prompt processing), the tinyBLAS kernels of ``llamafile/sgemm.cpp`` take
  Q8_0, Q4_0, Q5_0 and IQ4_NL weights (and float ones), after X is quantized to Q8_0.
- **vec_dot**: otherwise X is quantized row by row to the format's vec_dot type and every output is one
  ``vec_dot`` of a weight row with a token's row: the kernels ``dots.py`` and ``kquant_dots.py``
  specify. Each output is one call over the whole row, so the thread count does not change it.

Only the vec_dot path is specified bit for bit here; a product on the other two is reported as such.
"""

from __future__ import annotations

REPACKED_WITH_AVX2 = ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4")
REPACKED_WITH_AVX512 = ("Q2_K",)
LLAMAFILE = ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL")


def x86_kernel(weight_type: str, rows: int, tokens: int, isa: dict[str, bool], repack: bool = True) -> str:
    """"repacked", "llamafile" or "vec_dot": the kernel of a ``weight_type`` product with ``rows`` outputs
    per token over ``tokens`` tokens, on a build with the instruction sets ``isa`` (``GgmlLibrary.isa``)."""
    repackable = (isa.get("avx2") and weight_type in REPACKED_WITH_AVX2) or (
        isa.get("avx512") and weight_type in REPACKED_WITH_AVX512
    )
    if repack and repackable and rows % 8 == 0:
        return "repacked"
    if tokens >= 2 and isa.get("llamafile") and weight_type in LLAMAFILE:
        return "llamafile"
    return "vec_dot"
