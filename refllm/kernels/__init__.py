"""Numba hot loops. Each kernel names its NumPy twin in ``refllm/nn`` and is property-tested against it."""

# First: sets the OpenMP workers' wait policy before any kernel loads the OpenMP runtime.
from refllm.kernels.threads import blas_on_calling_thread

# isort: split
from refllm.kernels.attention import paged_decode_attention, paged_prefill_attention, write_kv

__all__ = ["blas_on_calling_thread", "paged_decode_attention", "paged_prefill_attention", "write_kv"]
