"""Memory bandwidth of the decode matvec, per GGML format, against NumPy's float32 GEMV.

For each format, a set of [R, C] weight matrices whose bytes together are at
least ``--working-set`` MB (several times the last-level cache, so weights
stream from DRAM as they do when a model decodes) is multiplied by a vector
one matrix after another, the way a forward pass walks its layers. Reported:
weight bytes read per second (GB/s), weights per second (G/s), and time per
weight relative to ``W @ x`` on the same matrices in float32 (NumPy's BLAS
GEMV over 4 bytes per weight).

``--crossover`` instead times ``QuantizedTensor``'s two products on
SmolLM2-135M's projection shapes for T = 1..16 tokens: T calls of
``quant_matvec`` against one ``quant_matmul`` (which ``QuantizedTensor.matmul`` picks from two tokens on).

    python benchmarks/bench_quant_kernels.py [--rows 2048 --cols 2048 --working-set 128 --runs 7]
    python benchmarks/bench_quant_kernels.py --crossover
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from refllm.kernels.quant_formats import FORMAT_CODES, KERNEL_FORMATS
from refllm.kernels.quant_matmul import quant_matmul, quant_matvec
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.quant.formats import block_format

F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip


def random_blocks(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, row bytes] random blocks with small finite float16 scales (speed does not depend on values)."""
    fmt = block_format(name)
    blocks = rng.integers(0, 256, size=(rows * cols // fmt.block_size, fmt.type_size), dtype=np.uint8)
    for offset in F16_FIELDS[name]:
        scales = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def seconds_per_sweep(multiply, matrices: list, x: np.ndarray, runs: int) -> float:
    """Median over ``runs`` of the time to multiply x by every matrix once."""
    for matrix in matrices:  # warm up (and compile)
        multiply(matrix, x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for matrix in matrices:
            multiply(matrix, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bandwidth(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.cols).astype(np.float32)
    budget = args.working_set * 1e6

    def count(bytes_each: int) -> int:
        return max(1, int(np.ceil(budget / bytes_each)))

    weights = args.rows * args.cols
    floats = [rng.standard_normal((args.rows, args.cols), dtype=np.float32) for _ in range(count(4 * weights))]
    f32 = seconds_per_sweep(lambda w, v: w @ v, floats, x, args.runs) / len(floats)
    table = {"F32 (NumPy GEMV)": (4 * weights / f32 / 1e9, weights / f32 / 1e9, 1.0)}
    del floats
    for name in KERNEL_FORMATS:
        first = random_blocks(name, args.rows, args.cols, rng)
        matrices = [first] + [first.copy() for _ in range(count(first.nbytes) - 1)]
        code = FORMAT_CODES[name]
        seconds = seconds_per_sweep(lambda w, v: quant_matvec(w, code, v), matrices, x, args.runs) / len(matrices)
        table[name] = (first.nbytes / seconds / 1e9, weights / seconds / 1e9, seconds / f32)
    print("| format | GB/s of weights | G weights/s | time per weight vs float32 GEMV |\n|---|---:|---:|---:|")
    for name, (gb, g, ratio) in table.items():
        print(f"| {name} | {gb:.1f} | {g:.1f} | {ratio:.2f} |")


def crossover(args: argparse.Namespace) -> None:
    """Microseconds of T matvec calls vs one matmul call, on SmolLM2-135M's Q4_1 projection shapes."""
    rng = np.random.default_rng(0)
    code = FORMAT_CODES["Q4_1"]
    print("| matrix | tokens | T x quant_matvec, us | quant_matmul, us |\n|---|---:|---:|---:|")
    for rows, cols in ((576, 576), (1536, 576), (576, 1536)):
        blocks = random_blocks("Q4_1", rows, cols, rng)
        for tokens in (1, 2, 3, 4, 6, 8, 16):
            x = rng.standard_normal((tokens, cols)).astype(np.float32)

            def per_token(_, v):
                for row in v:
                    quant_matvec(blocks, code, row)

            matvec = seconds_per_sweep(per_token, [None] * 20, x, args.runs) / 20
            matmul = seconds_per_sweep(lambda _, v: quant_matmul(blocks, code, v), [None] * 20, x, args.runs) / 20
            print(f"| {rows} x {cols} | {tokens} | {matvec * 1e6:.0f} | {matmul * 1e6:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=2048, help="a multiple of 256, so every format can hold it")
    parser.add_argument("--working-set", type=float, default=128, help="MB of weights per format, cycled through")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--crossover", action="store_true")
    args = parser.parse_args()
    print(
        f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'};"
        f" cores: {os.cpu_count()}; {thread_settings()}"
    )
    crossover(args) if args.crossover else bandwidth(args)


if __name__ == "__main__":
    main()
