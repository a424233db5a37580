"""ggml's CPU arithmetic as a NumPy spec, checked bit for bit against the installed llama.cpp library.

- ``blocks``: the block layouts of ``ggml-common.h``; float16 as the x86 kernels round it; K-quant bit fields.
- ``arith``: a float32 fused multiply-add and the order an 8-lane register is summed in.
- ``quantizers``: Q8_0, Q8_1, Q8_K, the formats activations are quantized to before a dot product.
- ``dots``, ``kquant_dots``: the dot product of a weight row with a quantized activation row, per format.
- ``tiled``, ``repacked``: the kernels of a prompt's K-quant products, and of repacked weights.
- ``dispatch``, ``products``: which kernel runs a matrix product, and the product as that kernel computes it.
- ``library``: the installed library's quantizers and dot products, through ctypes.
- ``graph_trace``: a llama.cpp model run op by op through its eval callback, and its matrix products
  recomputed with these specs.
- ``agreement``: draws, bit-for-bit counts and spec variants, for the tests and the benchmark.

``python benchmarks/ggml_kernels.py`` reports the agreement per format, with the library's version and the
instruction sets it was built for (docs/oracle.md).
"""
