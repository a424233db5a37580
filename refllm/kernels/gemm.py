"""Prompt-sized float32 products, x [T, C] @ W.T with T >= GEMM_TOKENS: the Numba tile or BLAS,
whichever this machine runs faster, as measured here.

Decoding multiplies one token or a batch of a few into each weight matrix, and
DRAM bounds it: the tiles of ``dense_matmul.py`` read each weight once at the
bandwidth the machine has. A prompt chunk multiplies tens to hundreds of
tokens, and the arithmetic bounds it, so the product's speed depends on how
well it fits the CPU's registers and caches. NumPy's OpenBLAS carries a kernel
for each x86 generation and picks the one for the CPU it finds when it loads;
the Numba tile (4 rows x 4 tokens of 16-lane sums) is tuned for one. On two
Zen 4 cores they ran SmolLM2-135M's prefill alike; on Xeons with two AVX-512
multiply-add units per core the tile reached 40 % of torch's GEMM; and which
one wins a shape moved from run to run with what else the machine did.

So no constant decides. The first time a shape (rows, columns, a power-of-two
bucket of the tokens) meets this process, both run it on
its own operands, in the forward pass where it will run (so that Numba's spinning
workers and BLAS's meet as they will), ``MEASURE_ROUNDS`` times each in turns,
and the faster is kept, in memory and on disk in ``$REFLLM_HOME/kernel_choices.json``
under this machine's key (``refllm.machine.machine_key``), so later processes on the
same machine skip the measurement and round the shape the same way. The result of the
call is the chosen kernel's. Products under MEASURE_MIN_MACS multiply-adds (a test's toy
shapes, not a real model's) take the tile unmeasured: a choice made afresh in each process
would let two processes, a cluster job's workers and the single-process run, round the
same input differently.

The threads: BLAS runs on as many threads as Numba's pool has for this pass
(``refllm/kernels/threads.py``), and only inside the product; around it, one.
Splitting the rows between plain Python threads, one single-threaded sgemm
each, instead ran the SmolLM2 shapes at half the speed.

Rounding: sgemm sums in its own blocked order, the tile in its fixed one; both
are within the float32 summation bound the tests hold every product to.
Products of fewer than GEMM_TOKENS tokens always take the tile, whose order
makes a token's result independent of its batch. Quantized matrices keep their
own kernels (``quant_matmul``): decoding a panel of rows for sgemm and then
multiplying it ran at half their speed here.
"""

from __future__ import annotations

import json
import os
import time

import numba
import numpy as np

from refllm.kernels.threads import blas_threads
from refllm.machine import machine_key, refllm_home

GEMM_TOKENS = 16  # tokens from which a product is arithmetic-bound: a prompt chunk, not a decode batch
MEASURE_ROUNDS = 3
MEASURE_MIN_MACS = 1 << 22
CHOICES_FILE = "kernel_choices.json"
TILE, BLAS = "tile", "blas"

_choices: dict[str, str] | None = None  # shape key -> TILE or BLAS, this machine's, loaded on first use


def blas_matmul(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """x [T, C] float32 @ weights.T, weights [R, C] float32 -> [T, R] float32, in BLAS on this pass's threads."""
    with blas_threads(numba.get_num_threads()):
        return np.matmul(x, weights.T)


def prompt_matmul(x: np.ndarray, weights: np.ndarray, tile) -> np.ndarray:
    """x [T, C] @ weights.T for T >= GEMM_TOKENS in ``tile`` (``dense_matmul``) or BLAS, as measured here."""
    if x.shape[0] * weights.shape[0] * weights.shape[1] < MEASURE_MIN_MACS:
        return tile(x, weights)
    key = _shape_key(x, weights)
    choices = _known_choices()
    if key not in choices:
        return _measure(x, weights, tile, key)
    return blas_matmul(x, weights) if choices[key] == BLAS else tile(x, weights)


def _shape_key(x: np.ndarray, weights: np.ndarray) -> str:
    """rows x columns x tokens (16-31 -> 16, 32-63 -> 32, ...). Not the thread count, which follows the cores
    other programs leave free from pass to pass: a product's kernel, and so its rounding, does not."""
    tokens = 1 << (len(x).bit_length() - 1)
    return f"{weights.shape[0]}x{weights.shape[1]}x{tokens}"


def _measure(x: np.ndarray, weights: np.ndarray, tile, key: str) -> np.ndarray:
    """Both kernels on these operands, in turns; the faster one's result, and its choice remembered."""
    best = {TILE: float("inf"), BLAS: float("inf")}
    results = {}
    for _ in range(MEASURE_ROUNDS):
        for name, kernel in ((TILE, tile), (BLAS, blas_matmul)):
            start = time.perf_counter()
            results[name] = kernel(x, weights)
            best[name] = min(best[name], time.perf_counter() - start)
    chosen = min(best, key=best.get)
    _known_choices()[key] = chosen
    _save_choices()
    return results[chosen]


def _choices_path():
    return refllm_home() / CHOICES_FILE


def _known_choices() -> dict[str, str]:
    global _choices
    if _choices is None:
        try:
            _choices = dict(json.loads(_choices_path().read_text()).get(machine_key(), {}))
        except (OSError, ValueError, AttributeError):  # none yet, or unreadable: measure again
            _choices = {}
    return _choices


def _save_choices() -> None:
    """Merge this process's choices into the file (atomically: a reader never sees half a file)."""
    path = _choices_path()
    try:
        every = json.loads(path.read_text())
        every = every if isinstance(every, dict) else {}
    except (OSError, ValueError):
        every = {}
    every[machine_key()] = {**every.get(machine_key(), {}), **_known_choices()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(every, indent=1, sort_keys=True))
        os.replace(partial, path)
    except OSError:  # a read-only home: the choices still hold for this process
        pass
