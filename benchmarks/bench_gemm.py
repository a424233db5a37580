"""Prompt-sized products: GFLOP/s of refllm's fast linear against OpenBLAS and torch on the same shapes.

For each projection shape of SmolLM2-135M and Gemma 3 270M, a 256-token chunk
(``--tokens``) is multiplied into a random [R, C] weight matrix:

- ``refllm fast``: the fast op set's ``linear`` as a forward pass runs it
  (``refllm/kernels/gemm.py``: from 16 tokens, the tile or sgemm on the pass's threads,
  whichever this machine measured faster for the shape);
- ``refllm Q8_0`` / ``refllm Q4_0``: the same through a quantized matrix
  (``quant_matmul``'s tiles);
- ``refllm tile``: the Numba 4 x 4 tile kernel (``dense_matmul``), which
  products of fewer than 16 tokens use, and prompt chunks where it measured faster;
- ``OpenBLAS``: NumPy's ``x @ W.T`` on ``--threads`` threads;
- ``torch``: ``x @ W.T`` on torch's CPU GEMM, where torch is installed.

The machine's peak is read as the best of OpenBLAS and torch on a 1024-cube
sgemm, which holds its panels in cache. Figures are medians of ``--runs``
alternating passes (GFLOP/s = 2 T R C / seconds).

    python benchmarks/bench_gemm.py [--tokens 256] [--runs 9] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import numba
import numpy as np
from machine import median_seconds  # benchmarks/machine.py

from refllm.kernels.dense_matmul import dense_matmul, linear
from refllm.kernels.threads import blas_threads, computing
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.quant.linear import QuantizedTensor

SHAPES = {  # [R, C] of each projection
    "SmolLM2 q/o": (576, 576), "SmolLM2 k/v": (192, 576), "SmolLM2 gate/up": (1536, 576),
    "SmolLM2 down": (576, 1536), "Gemma3 q": (1024, 640), "Gemma3 gate/up": (2048, 640),
    "Gemma3 down": (640, 2048),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
    if torch is not None:
        torch.set_num_threads(args.threads)
    print(f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'}; cores: {os.cpu_count()}")
    print(f"threads: {args.threads}; {thread_settings()}; torch {torch.__version__ if torch else 'not installed'}")

    rng = np.random.default_rng(0)
    cube = rng.standard_normal((1024, 1024), dtype=np.float32)
    with blas_threads(args.threads):
        peaks = [2 * 1024**3 / median_seconds(lambda: cube @ cube, args.runs)]
    if torch is not None:
        t_cube = torch.from_numpy(cube)
        peaks.append(2 * 1024**3 / median_seconds(lambda: t_cube @ t_cube, args.runs))
    peak = max(peaks) / 1e9
    print(f"peak (best 1024-cube sgemm): {peak:.0f} GFLOP/s\n")

    engines = ["refllm fast", "refllm Q8_0", "refllm Q4_0", "refllm tile", "OpenBLAS"] + (["torch"] if torch else [])
    print("| shape [R, C] | " + " | ".join(engines) + " | refllm fast / torch |")
    print("|---" * (len(engines) + 2) + "|")
    for name, (rows, cols) in SHAPES.items():
        weights = rng.standard_normal((rows, cols), dtype=np.float32)
        x = rng.standard_normal((args.tokens, cols), dtype=np.float32)
        q8, q4 = QuantizedTensor.quantize(weights, "Q8_0"), QuantizedTensor.quantize(weights, "Q4_0")

        def in_a_pass(weight):
            def run():
                with computing():
                    linear(x, weight)

            return run

        def openblas():
            with blas_threads(args.threads):
                x @ weights.T

        runs = {
            "refllm fast": in_a_pass(weights), "refllm Q8_0": in_a_pass(q8), "refllm Q4_0": in_a_pass(q4),
            "refllm tile": lambda: dense_matmul(x, weights), "OpenBLAS": openblas,
        }  # fmt: skip
        if torch is not None:
            t_x, t_w = torch.from_numpy(x), torch.from_numpy(weights)
            runs["torch"] = lambda: t_x @ t_w.T
        flops = 2 * args.tokens * rows * cols
        rates = {engine: flops / median_seconds(run, args.runs) / 1e9 for engine, run in runs.items()}
        ratio = f"{rates['refllm fast'] / rates['torch']:.2f}x" if "torch" in rates else "-"
        print(f"| {name} [{rows}, {cols}] | " + " | ".join(f"{rates[e]:.0f}" for e in engines) + f" | {ratio} |")
    print(f"\nGFLOP/s, medians of {args.runs}; peak {peak:.0f}")


if __name__ == "__main__":
    main()
