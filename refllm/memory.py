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
