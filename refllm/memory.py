"""How much memory a model needs, before it is loaded, and how much the machine has free."""

from __future__ import annotations

import numpy as np

from refllm.io.gguf import GGUFSource
from refllm.models.contract import ModelSource
from refllm.quant.linear import kernel_reads


def weight_bytes(source: ModelSource, quantized: bool, dtype: str = "float32") -> int:
    """Bytes of the loaded weights: 4 a parameter (8 in float64), except the matrices a quantized GGUF
    load keeps in blocks."""
    if not (quantized and isinstance(source, GGUFSource)):
        return np.dtype(dtype).itemsize * source.config.num_parameters
    total = 0
    for tensor in source.header.tensors:
        total += tensor.nbytes if kernel_reads(tensor.type.name, tensor.shape) else 4 * tensor.num_elements
    return total


# What a running model holds besides its weights and its KV cache: Numba's runtime and the loaded
# kernels, the tokenizer, the passes' scratch (docs/quantization.md#memory: 77 MiB above the
# footprint after `import refllm` for the 1B benchmark model, weights and arena aside).
RUNTIME_BYTES = 100 * 10**6


def peak_memory(source: ModelSource, quantized: bool, kv_bytes: int, dtype: str = "float32") -> int:
    """The most memory running the model should take above ``import refllm``: its weights as loaded
    (``weight_bytes``; for a quantized GGUF, the file's blocks), the KV cache's ``kv_bytes``, and
    RUNTIME_BYTES. The first run on a machine also compiles the kernels, which takes more."""
    return weight_bytes(source, quantized, dtype) + kv_bytes + RUNTIME_BYTES


def available_memory() -> int | None:
    """Bytes of memory available to a new process (MemAvailable), or None where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
