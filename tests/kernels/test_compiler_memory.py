"""Numba's compiler out of the resident set (refllm/kernels/compiler_memory.py), and the kernels of a
pass loaded before it reads its weights (refllm/kernels/warm.py).

- ``release`` finds LLVM's read-only, clean mappings and drops their pages: the resident set
  shrinks, and compiled code still runs afterwards (its pages come back from the file).
- In a fresh process, after a quantized model's first forward pass, neither a prompt nor a
  decode step loads a kernel again: the first pass loaded all of them before reading most
  weights, so the compiler's pages never sit on top of the model's (the peak memory target in
  docs/quantization.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from refllm.kernels import compiler_memory
from tests.helpers.paths import HF_DATA


def resident() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux only")
def test_release_drops_the_compilers_clean_pages_and_code_still_runs():
    from refllm.kernels.norm import rms_norm

    mappings = compiler_memory.compiler_mappings()
    assert mappings and all(end > start for start, end in mappings)

    @njit
    def twice(x):  # compiled here: the compiler's pages are resident now, whatever ran before
        return 2 * x

    assert twice(21) == 42 and compiler_memory._CompilerUse.used
    before = resident()
    assert compiler_memory.release() == sum(end - start for start, end in mappings)
    assert resident() < before
    assert compiler_memory.release() == 0  # nothing ran the compiler since
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(rms_norm(x, np.ones(8, np.float32), 1e-6), x, rtol=1e-6)


FRESH_PROCESS = f"""
import numpy as np, refllm
import refllm.quant.linear as linear
from refllm.kernels import compiler_memory
linear.PARALLEL_MIN_WEIGHTS = 0  # the tiny model's products take the parallel kernels, as a real model's do
model = refllm.load_model({str(HF_DATA / "llama")!r}, quantize="q4_0", activations=ACTIVATIONS)
cache = model.create_kv_cache()
model.prefill(np.array([[1, 2]]), cache, range(2))
runs = compiler_memory._CompilerUse.runs
cache = model.create_kv_cache()
logits = model.prefill(np.array([[3, 17, 99, 5, 64]]), cache, range(5))
for _ in range(3):
    logits = model.decode(np.array([[int(logits[0].argmax())]]), cache)
print(compiler_memory._CompilerUse.runs - runs)
"""


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_after_the_first_pass_no_kernel_loads_again(activations):
    code = FRESH_PROCESS.replace("ACTIVATIONS", repr(activations))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]
