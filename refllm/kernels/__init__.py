"""Numba hot loops. Each kernel names its NumPy twin in ``refllm/nn`` and is property-tested against it."""

from refllm.kernels.attention import paged_decode_attention, paged_prefill_attention, write_kv

__all__ = ["paged_decode_attention", "paged_prefill_attention", "write_kv"]
