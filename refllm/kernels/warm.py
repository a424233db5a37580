"""Every kernel of a fast forward pass loaded at its start, on tiny inputs of the types the pass uses.

A kernel is loaded (compiled, or read from Numba's cache) at its first call, and
loading runs Numba's compiler, whose code pages then return to the resident set
until ``compiler_memory.release`` drops them again. A kernel first called late in
a pass, or in the first decode step after a prompt (paged decode attention), thus
put the compiler's 50 to 100 MB on top of every weight already read, and set the
process's peak memory. Loaded together before the first pass reads its weights,
they cost the same time and leave the peak to the weights.

``load_pass_kernels`` runs once per process, from ``threads.computing``. Types
must match the pass's own calls exactly (dtype, dimensions, layout, writability):
tests/kernels/test_compiler_memory.py runs a quantized model's prompt and decode steps after
it and asserts that nothing more is loaded.
"""

from __future__ import annotations

import numpy as np

from refllm.kernels.activation import _gated_rows
from refllm.kernels.attention import paged_decode_attention, paged_prefill_attention, write_kv
from refllm.kernels.norm import _rms_norm_rows
from refllm.kernels.rope import _rope_rows

_loaded = False


def load_pass_kernels() -> None:
    """The norm, RoPE, activation, cache-write and paged-attention kernels, each called once on tiny inputs."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    rows = np.zeros((1, 16), np.float32)
    _rms_norm_rows(rows, np.ones(16, np.float32), np.float32(1e-6), np.float32(0.0))
    _gated_rows(rows[0], rows[0], False)
    heads = np.zeros((1, 1, 16), np.float32)  # [N, heads, E]
    _rope_rows(heads, rows, rows)
    arena = np.zeros((1, 16, 1, 16), np.float32)  # [blocks, Z, K, E]
    tables, lengths = np.zeros((1, 1), np.int32), np.zeros(1, np.int64)
    write_kv(arena, arena, np.zeros((1, 1), np.int64), heads[None], heads[None])
    paged_decode_attention(heads, arena, arena, tables, lengths + 1, 1.0, 0, 0.0)
    paged_prefill_attention(heads[None], arena, arena, tables, lengths, 1.0, 0, 0.0)
