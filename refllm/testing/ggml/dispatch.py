"""Which ggml CPU kernel computes a matrix product, on x86 (``ggml_compute_forward_mul_mat``, llama.cpp as
llama-cpp-python 0.3.36 vendors it).

A MUL_MAT of a quantized weight W [N rows, K] with float32 activations X [T tokens, K] runs the first of:

- **repacked**: the weight was loaded into the CPU "repack" buffer (llama.cpp's default, the model
  parameter ``use_extra_bufts``) and interleaved 8 rows at a time; its own gemv/gemm kernels
  (``repack.cpp``) sum in another order. x86 repacks Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, and Q2_K
  with AVX-512, when N is a multiple of 8.
- **tiled**: for T >= 8 (any T with ``GGML_CPU_TILED_MM_FORCE=1``), the K-quants and i-quants go through
  the tiled kernels of ``tiled/tiled.cpp`` (off with ``GGML_CPU_TILED_MM=0``).
- **llamafile**: for T >= 2, the tinyBLAS kernels of ``llamafile/sgemm.cpp`` take Q8_0, Q4_0, Q5_0 and
  IQ4_NL weights (and float ones), after X is quantized to Q8_0. They tile the outputs 4 x N, but compute
  each with vec_dot's arithmetic: the same 8 lanes of 4 products, the same float32 multiply-add per block,
  the same horizontal sum; so the vec_dot spec is theirs too.
- **vec_dot**: otherwise X is quantized row by row to the format's vec_dot type and every output is one
  ``vec_dot`` of a weight row with a token's row: the kernels ``dots.py`` and ``kquant_dots.py``
  specify. Each output is one call over the whole row, so the thread count does not change it.

So a decode step (T = 1) of an unrepacked weight always runs vec_dot. ``products.py`` gives each kernel's
products as far as they are specified here; a product on another is reported as such.
"""

from __future__ import annotations

import os

REPACKED_WITH_AVX2 = ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4")
REPACKED_WITH_AVX512 = ("Q2_K",)
TILED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
         "IQ1_S", "IQ1_M")  # fmt: skip
LLAMAFILE = ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL")


def _tiled_from(environment) -> tuple[bool, bool]:
    """(enabled, forced) as ggml reads its two variables."""
    def flag(name: str, default: int) -> int:
        try:
            return int(environment.get(name, default))
        except ValueError:  # C's atoi reads a word as 0
            return 0

    return flag("GGML_CPU_TILED_MM", 1) != 0, flag("GGML_CPU_TILED_MM_FORCE", 0) == 1


def x86_kernel(weight_type: str, rows: int, tokens: int, isa: dict[str, bool], repack: bool = True,
               environment=os.environ) -> str:  # fmt: skip
    """"repacked", "tiled", "llamafile" or "vec_dot": the kernel of a ``weight_type`` product with ``rows``
    outputs per token over ``tokens`` tokens, on a build with the instruction sets ``isa``
    (``GgmlLibrary.isa``), with repacking on or off, in a process with ``environment``."""
    repackable = (isa.get("avx2") and weight_type in REPACKED_WITH_AVX2) or (
        isa.get("avx512") and weight_type in REPACKED_WITH_AVX512
    )
    if repack and repackable and rows % 8 == 0:
        return "repacked"
    tiled, forced = _tiled_from(environment)
    if tiled and weight_type in TILED and (tokens >= 8 or forced) and (isa.get("avx") or isa.get("avx2")):
        return "tiled"
    if tokens >= 2 and isa.get("llamafile") and weight_type in LLAMAFILE:
        return "llamafile"
    return "vec_dot"
