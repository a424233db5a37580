"""Numba hot loops. Each kernel names its NumPy twin in ``refllm/nn`` and is property-tested against it.

Nothing outside this package imports it until a kernel is first used (the fast
op set, ``refllm/models/ops.py``), so ``import refllm`` loads no Numba.
"""

from refllm.kernels.compile_cache import key_cache_to_every_kernel_source, one_process_at_a_time
from refllm.kernels.threads import apply_thread_policy

key_cache_to_every_kernel_source()  # before any kernel below is decorated with cache=True
one_process_at_a_time()
apply_thread_policy()  # before any parallel kernel loads the OpenMP runtime
