"""The process a first run starts (``warm_start``): load the model as the run did, compile its kernels into
Numba's cache, exit (which releases the compile lock the run handed it).

    python -m refllm.commands.background_compile MODEL quantized|dequantized
"""

from __future__ import annotations

import os
import sys

from refllm.commands import common


def compile_kernels(name: str, way: str) -> None:
    os.nice(10)  # the run answering in the foreground comes first
    model = common.load(name, quantized=way == "quantized", text=False)
    common.warm_llm(model)


if __name__ == "__main__":
    compile_kernels(sys.argv[1], sys.argv[2])
