"""Numba hot loops. Each kernel names its NumPy twin in ``refllm/nn`` and is property-tested against it."""

import os

# Between parallel kernels, the forward pass runs NumPy's BLAS on the same cores. OpenMP workers
# that spin while idle (the default) steal those cores; sleeping workers cost a few microseconds
# to wake. Set before the first parallel kernel loads the OpenMP runtime; a user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from refllm.kernels.attention import paged_decode_attention, paged_prefill_attention, write_kv  # noqa: E402

__all__ = ["paged_decode_attention", "paged_prefill_attention", "write_kv"]
