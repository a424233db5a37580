"""The two op sets a forward pass can be built from: the spec and its kernel twins.

``DecoderModel``'s forward pass calls every operation through an ``OpSet``:

    spec  the functions of ``refllm/nn``, exactly: plain NumPy in the dtype of
          the weights (float32, or float64 for ground truth), no Numba, no
          thread settings. Attention is ``refllm.nn.attention.attention`` over
          the keys and values the cache holds; RoPE's angles are computed for
          the positions of each step.
    fast  their twins in ``refllm/kernels``, each property-tested against
          its spec function: float32 (and quantized) projections in the dense
          and quantized matmul kernels, RMSNorm, RoPE and the MLP activation in
          one pass each, RoPE's angles kept in a table, latent attention with
          its key-value projection absorbed, attention in the cache's own
          kernels (the paged arena's), on as many threads as the cores other
          programs leave free (refllm/kernels/cores.py), NumPy's BLAS held to
          the calling thread.

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

from refllm.kv.base import OWN_ATTENTION, OwnAttention
from refllm.nn.attention import attention
from refllm.nn.embedding import embed
from refllm.nn.latent_attention import latent_attention
from refllm.nn.linear import linear
from refllm.nn.mlp import gated
from refllm.nn.norm import layer_norm, rms_norm
from refllm.nn.rope import apply_rope, rope_cos_sin


@dataclass(frozen=True)
class OpSet:
    """The operations of one forward pass (signatures as their ``refllm/nn`` spec functions)."""

    name: str
    embed: Callable  # (token_ids [B, T], table [V, D], scale) -> [B, T, D]
    rms_norm: Callable  # (x [..., N], weight [N], eps, offset) -> [..., N]
    layer_norm: Callable  # (x [..., N], weight [N], bias [N] or None, eps) -> [..., N]
    # (rope parameters, head_dim, max_position_embeddings, dtype) -> (positions [B, T] -> cos, sin [B, T, R])
    rope_angles: Callable
    apply_rope: Callable  # (x [B, T, heads, E], cos, sin [B, T, R]) -> [B, T, heads, E]
    linear: Callable  # (x [..., in], weight [out, in], bias [out] | None) -> [..., out]
    gated: Callable  # (gate [..., F], up [..., F], activation) -> act(gate) * up
    # (q [T, H, E], k, v [S, K, E], query_positions [T], scale, window, softcap) -> [T, H, E], called by
    # the cache on each sequence's keys; or OWN_ATTENTION: the cache attends with its own kernels.
    attention: Callable | OwnAttention
    # DeepSeek-V3's attention over cached latents: attention's signature plus kv_b_proj and nope_dim
    latent_attention: Callable
    running: Callable[[], AbstractContextManager]  # entered around each forward pass


def spec_rope_angles(params, head_dim: int, max_position_embeddings: int, dtype) -> Callable:
    """positions -> cos, sin of ``refllm.nn.rope.rope_cos_sin``, computed anew at every call."""
    return functools.partial(rope_cos_sin, params, head_dim, max_position_embeddings, dtype=dtype)


SPEC_OPS = OpSet(
    name="spec",
    embed=embed,
    rms_norm=rms_norm,
    layer_norm=layer_norm,
    rope_angles=spec_rope_angles,
    apply_rope=apply_rope,
    linear=linear,
    gated=gated,
    attention=attention,
    latent_attention=latent_attention,
    running=contextlib.nullcontext,
)


@functools.cache
def fast_ops() -> OpSet:
    """The kernel twins (compiled on first use, then loaded from Numba's cache)."""
    from refllm.kernels.activation import gated as gated_kernel
    from refllm.kernels.dense_matmul import linear as linear_kernel
    from refllm.kernels.latent_attention import absorbed_latent_attention
    from refllm.kernels.norm import rms_norm as rms_norm_kernel
    from refllm.kernels.rope import RopeTable
    from refllm.kernels.rope import apply_rope as apply_rope_kernel
    from refllm.kernels.threads import computing

    def rope_table(params, head_dim: int, max_position_embeddings: int, dtype) -> Callable:
        return RopeTable(params, head_dim, max_position_embeddings, dtype).lookup

    return OpSet(
        name="fast",
        embed=embed,  # a row lookup: nothing to speed up
        rms_norm=rms_norm_kernel,
        layer_norm=layer_norm,  # the spec's: no kernel twin yet
        rope_angles=rope_table,
        apply_rope=apply_rope_kernel,
        linear=linear_kernel,
        gated=gated_kernel,
        attention=OWN_ATTENTION,
        latent_attention=absorbed_latent_attention,  # kv_b_proj folded into query and output
        running=computing,
    )
