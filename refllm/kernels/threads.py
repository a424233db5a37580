"""How refllm shares the CPU's cores between Numba's thread pool and NumPy's BLAS.

A decode step launches a few hundred short parallel kernels (attention, the
quantized products), a few tens of microseconds each. Two things decide how
fast that goes on a small machine:

- What Numba's OpenMP workers do between kernels. Workers that go to sleep at
  once (``OMP_WAIT_POLICY=passive``) must be woken for every kernel, and also
  fall asleep inside a kernel while waiting for each other: on a 2-core VM a
  decode attention call then took 0.5-1 ms instead of 0.08 ms. Workers that spin
  forever (``active``) hold their core when the forward pass is not running.
  refllm's default is in between: spin for ``GOMP_SPINCOUNT`` = 10000 rounds
  (0.1 to 0.3 ms on the project's VM), then sleep.
- Who else wants the cores. OpenBLAS keeps a pool of its own, whose workers
  also spin after each product; two spinning pools on two cores take turns at
  the scheduler's pace (milliseconds), which made float32 decoding 1 to 20x
  slower. So while a model computes, NumPy's BLAS runs on the calling thread
  alone (``blas_on_calling_thread``) and Numba's pool is the only one.

- How many cores are free. Before each forward pass ``computing`` asks
  ``refllm/kernels/cores.py`` how many cores other processes leave, and runs
  Numba's pool with that many threads for the pass: a kernel split evenly
  between two threads waits for the one that shares its core with another
  program.

A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins over the default, and a
thread count they chose (NUMBA_NUM_THREADS, or ``numba.set_num_threads``) over
the watch. The policy is applied when the kernels are first imported, which is their first
use: importing ``refllm`` itself sets nothing. docs/performance.md has the
measurements.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from refllm.kernels.cores import CoreWatch

# The loaded BLAS libraries (threadpoolctl's controllers) and the watch on the cores, found on first use
_blas_libraries: list | None = None
_watch: CoreWatch | None = None


def apply_thread_policy() -> None:
    """Set the OpenMP workers' default spin time; read by libgomp when the first parallel kernel loads it."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "10000")


@contextlib.contextmanager
def blas_threads(count: int) -> Iterator[None]:
    """NumPy's BLAS limited to ``count`` threads inside the block (restored afterwards).

    Straight through threadpoolctl's controller of each library, a few microseconds: its
    ``limit`` context looks every library up again, some 0.14 ms for each forward pass."""
    global _blas_libraries
    if _blas_libraries is None:
        from threadpoolctl import ThreadpoolController

        _blas_libraries = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    before = [lib.num_threads for lib in _blas_libraries]
    for lib in _blas_libraries:
        lib.set_num_threads(count)
    try:
        yield
    finally:
        for lib, threads in zip(_blas_libraries, before):
            lib.set_num_threads(threads)


def blas_on_calling_thread() -> contextlib.AbstractContextManager:
    """NumPy's BLAS limited to the calling thread inside the block (restored afterwards)."""
    return blas_threads(1)


def threads_now() -> int:
    """The threads the next forward pass gets: the user's choice if they made one, else the cores free now."""
    import numba

    global _watch
    chosen = numba.get_num_threads()
    if "NUMBA_NUM_THREADS" in os.environ or chosen != numba.config.NUMBA_NUM_THREADS:
        return chosen
    if _watch is None:
        _watch = CoreWatch()
    return _watch.threads(chosen)


@contextlib.contextmanager
def computing() -> Iterator[None]:
    """Around a forward pass of the fast ops: Numba's pool on the cores free now, BLAS on the calling thread;
    before the first pass, its kernels loaded (``warm.py``); after each, the compiler's pages out of the
    resident set if it ran (``compiler_memory.py``)."""
    import numba

    from refllm.kernels import compiler_memory
    from refllm.kernels.warm import load_pass_kernels

    load_pass_kernels()
    chosen = numba.get_num_threads()
    numba.set_num_threads(threads_now())
    try:
        with blas_on_calling_thread():
            yield
    finally:
        numba.set_num_threads(chosen)
        compiler_memory.release()
