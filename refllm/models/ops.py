"""The two op sets a forward pass can be built from: the spec and its kernel twins.

``LlamaFamilyModel``'s forward pass calls every operation through an ``OpSet``:

    spec  the functions of ``refllm/nn``, exactly: plain NumPy in the dtype of
          the weights (float32, or float64 for ground truth), no Numba, no
          thread settings. Attention is ``refllm.nn.attention.attention`` over
          the keys and values the cache holds.
    fast  their Numba twins in ``refllm/kernels``, each property-tested against
          its spec function: float32 (and quantized) projections in the dense
          and quantized matmul kernels, RMSNorm, RoPE and the MLP activation in
          one pass each, attention in the cache's own kernels (the paged
          arena's), on as many threads as the cores other programs leave free
          (refllm/kernels/cores.py), NumPy's BLAS held to the calling thread.

Contiguous cache + spec ops is the reference; paged arena + fast ops is the
laptop path; every combination runs. Nothing here imports Numba until the fast
set is first asked for.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from refllm.nn.attention import attention
from refllm.nn.embedding import embed
from refllm.nn.latent_attention import absorbed_latent_attention, latent_attention
from refllm.nn.linear import linear
from refllm.nn.mlp import gated
from refllm.nn.norm import rms_norm
from refllm.nn.rope import apply_rope

@dataclass(frozen=True)
class OpSet:
    """The operations of one forward pass (signatures as their ``refllm/nn`` spec functions)."""

    name: str
    embed: Callable  # (token_ids [B, T], table [V, D], scale) -> [B, T, D]
    rms_norm: Callable  # (x [..., N], weight [N], eps, offset) -> [..., N]
    apply_rope: Callable  # (x [B, T, heads, E], cos, sin [B, T, R]) -> [B, T, heads, E]
    linear: Callable  # (x [..., in], weight [out, in], bias [out] | None) -> [..., out]
    gated: Callable  # (gate [..., F], up [..., F], activation) -> act(gate) * up
    # (q [T, H, E], k, v [S, K, E], query_positions [T], scale, window, softcap) -> [T, H, E],
    # called by the cache on each sequence's keys; None: the cache attends with its own kernels.
    attention: Callable | None
    running: Callable[[], AbstractContextManager]  # entered around each forward pass
    # DeepSeek-V3's attention over cached latents: attention's signature plus kv_b_proj and nope_dim
    latent_attention: Callable = latent_attention


SPEC_OPS = OpSet(
    name="spec",
    embed=embed,
    rms_norm=rms_norm,
    apply_rope=apply_rope,
    linear=linear,
    gated=gated,
    attention=attention,
    running=contextlib.nullcontext,
)


@functools.cache
def fast_ops() -> OpSet:
    """The kernel twins (compiled on first use, then loaded from Numba's cache)."""
    from refllm.kernels.activation import gated as gated_kernel
    from refllm.kernels.dense_matmul import linear as linear_kernel
    from refllm.kernels.norm import rms_norm as rms_norm_kernel
    from refllm.kernels.rope import apply_rope as apply_rope_kernel
    from refllm.kernels.threads import computing

    return OpSet(
        name="fast",
        embed=embed,  # a row lookup: nothing to speed up
        rms_norm=rms_norm_kernel,
        apply_rope=apply_rope_kernel,
        linear=linear_kernel,
        gated=gated_kernel,
        attention=None,
        running=computing,
        latent_attention=absorbed_latent_attention,  # kv_b_proj folded into query and output
    )
