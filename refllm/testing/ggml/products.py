"""A whole matrix product as one of ggml's CPU kernels computes it: W [N, K] (the file's blocks) times the
float32 activations X [T, K] -> [T, N] float32, for the kernels ``dispatch.py`` names.

vec_dot (and llamafile's tinyBLAS, which computes each output the same way): each row of X quantized to
the format's activation type (``quantizers.py``), then one dot product per output (``dots.py``).
tiled: ``tiled.py``; repacked: ``repacked.py``.
"""

from __future__ import annotations

import numpy as np

from refllm.testing.ggml.dots import ACTIVATION_TYPE, spec_dot
from refllm.testing.ggml.quantizers import QUANTIZERS
from refllm.testing.ggml.repacked import REPACKED_TYPES, repacked_product
from refllm.testing.ggml.tiled import TILED_TYPES, tiled_product


def vec_dot_product(weight_type: str, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    quantize = QUANTIZERS[ACTIVATION_TYPE[weight_type]]
    return np.stack([spec_dot(weight_type, weights, quantize(row)) for row in x])


# kernel -> (the weight types specified, the product)
KERNELS = {
    "vec_dot": (tuple(ACTIVATION_TYPE), vec_dot_product),
    "llamafile": (("Q8_0", "Q4_0", "Q5_0"), vec_dot_product),
    "tiled": (TILED_TYPES, tiled_product),
    "repacked": (REPACKED_TYPES, repacked_product),
}


def spec_product(kernel: str, weight_type: str, weights: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """[T, N] as ``kernel`` computes it, or None where this package does not specify that kernel and type."""
    types, product = KERNELS.get(kernel, ((), None))
    return product(weight_type, weights, x) if weight_type in types else None
