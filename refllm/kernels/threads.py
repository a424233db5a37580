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

A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins over the default. The
policy is applied when the kernels are first imported, which is their first
use: importing ``refllm`` itself sets nothing. docs/performance.md has the
measurements.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

# threadpoolctl's view of the loaded BLAS libraries, found on first use
_controller = None


def apply_thread_policy() -> None:
    """Set the OpenMP workers' default spin time; read by libgomp when the first parallel kernel loads it."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "10000")


@contextlib.contextmanager
def blas_on_calling_thread() -> Iterator[None]:
    """NumPy's BLAS limited to the calling thread inside the block (restored afterwards)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    with _controller.limit(limits=1, user_api="blas"):
        yield
