"""The attention blocks: a layer's attention as an object built once, at load, from its recipe and weights.

Each block is called as ``block(x, positions, cache, seq_ids)``: x [B, T, D] (normed,
unless the norms come after) at ``positions`` [B, T] -> [B, T, D]. What a family
chose (q/k norm or not, RoPE or NoPE, sinks) was decided when the block was built;
its call is the token's path and nothing else:

    grouped-query:  x -> q, k, v projections -> q/k norm -> RoPE -> write K/V into the cache
                      -> attention over the cache -> output projection
    latent:         x -> q (low-rank or plain) -> RoPE on q's last P dims
                    x -> [c | k_rope] -> norm c, RoPE k_rope -> cache [c | k_rope]
                      -> attention over the cached latents -> output projection

Every step goes through the op set (``refllm/models/ops.py``); attention runs
behind the cache (``refllm/kv/base.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from refllm.kv import OWN_ATTENTION, KVCache
from refllm.models.ops import OpSet
from refllm.models.weights import AttentionWeights, LatentAttentionWeights
from refllm.nn.attention import ImageSpans
from refllm.nn.attention import attention as spec_attention
from refllm.nn.latent_attention import LATENT_NORM_EPS
from refllm.recipe import GroupedQueryAttention, LatentAttention, QKNorm

Angles = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # positions [B, T] -> cos, sin [B, T, R]
Spans = Sequence[ImageSpans] | None  # per row, (start, end) runs of image tokens that see each other
Norm = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (x, weight) -> normed x


class Rotation:
    """RoPE on queries and keys [B, T, heads, E] at ``positions``, with one layer type's angles."""

    def __init__(self, angles: Angles, apply_rope: Callable):
        self.angles, self.apply_rope = angles, apply_rope

    def __call__(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cos, sin = self.angles(positions)
        return self.apply_rope(q, cos, sin), self.apply_rope(k, cos, sin)


def no_rotation(q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A NoPE layer's (SmolLM3): queries and keys as they are; only the causal mask orders the tokens."""
    return q, k


def qk_norm(kind: QKNorm, norm: Norm, w: AttentionWeights) -> Callable:
    """(q [B, T, H, E], k [B, T, K, E]) -> the two normed as ``kind`` says: each head over its E dims,
    or all of a token's heads together (OLMo 2), or not at all."""
    if kind is QKNorm.PER_HEAD:
        return lambda q, k: (norm(q, w.q_norm), norm(k, w.k_norm))
    if kind is QKNorm.WHOLE:
        return lambda q, k: (
            norm(q.reshape(*q.shape[:2], -1), w.q_norm).reshape(q.shape),
            norm(k.reshape(*k.shape[:2], -1), w.k_norm).reshape(k.shape),
        )
    return lambda q, k: (q, k)


class GroupedQueryAttentionBlock:
    """H query heads over K key-value heads; x [B, T, D] -> [B, T, D] (``refllm/nn/attention.py``)."""

    def __init__(self, layer: int, recipe: GroupedQueryAttention, w: AttentionWeights, ops: OpSet,
                 rotation: Callable, window: int | None, norm: Norm):  # fmt: skip
        self.layer, self.w, self.linear = layer, w, ops.linear
        self.heads = (recipe.num_heads, recipe.num_kv_heads, recipe.head_dim)
        self.qk_norm = qk_norm(recipe.qk_norm, norm, w)
        self.rotation = rotation
        self.scale, self.window, self.softcap = recipe.scale, window, recipe.softcap
        # the caches' own kernels have no sinks: with them, the spec's attention over the gathered keys
        attend = spec_attention if ops.attention is OWN_ATTENTION else ops.attention
        self.attend = ops.attention if w.sinks is None else functools.partial(attend, sinks=w.sinks)

    def __call__(
        self, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list, image_spans: Spans = None
    ) -> np.ndarray:
        """image_spans: per row, runs of image tokens that see each other (a vision-language model's)."""
        (B, T, _), (H, K, E), w = x.shape, self.heads, self.w
        q = self.linear(x, w.q_proj, w.q_proj_bias).reshape(B, T, H, E)
        k = self.linear(x, w.k_proj, w.k_proj_bias).reshape(B, T, K, E)
        v = self.linear(x, w.v_proj, w.v_proj_bias).reshape(B, T, K, E)
        q, k = self.qk_norm(q, k)
        q, k = self.rotation(q, k, positions)
        cache.write(self.layer, seq_ids, k, v)
        out = cache.attention(
            self.layer, seq_ids, q, self.scale, self.window, self.softcap, self.attend, image_spans=image_spans
        )
        return self.linear(out.reshape(B, T, -1), w.o_proj, w.o_proj_bias)  # out: [B, T, H, E]


class LatentAttentionBlock:
    """DeepSeek-V3's multi-head latent attention; x [B, T, D] -> [B, T, D], the cache receiving one
    latent [c | k_rope] per token (``refllm/nn/latent_attention.py``)."""

    def __init__(self, layer: int, recipe: LatentAttention, w: LatentAttentionWeights, ops: OpSet,
                 angles: Angles, window: int | None):  # fmt: skip
        self.layer, self.w, self.ops = layer, w, ops
        self.angles, self.window, self.scale = angles, window, recipe.scale
        self.widths = (recipe.num_heads, recipe.qk_head_dim, recipe.qk_nope_head_dim, recipe.kv_lora_rank)
        self.query = self._plain_query if w.q_proj is not None else self._low_rank_query
        self.attend = functools.partial(ops.latent_attention, kv_b_proj=w.kv_b_proj, nope_dim=recipe.qk_nope_head_dim)

    def _plain_query(self, x: np.ndarray) -> np.ndarray:
        return self.ops.linear(x, self.w.q_proj)

    def _low_rank_query(self, x: np.ndarray) -> np.ndarray:
        w, ops = self.w, self.ops
        low = ops.rms_norm(ops.linear(x, w.q_a_proj, w.q_a_proj_bias), w.q_a_layernorm, LATENT_NORM_EPS, 0.0)
        return ops.linear(low, w.q_b_proj)

    def __call__(
        self, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list, image_spans: Spans = None
    ) -> np.ndarray:
        """image_spans: accepted for the contract; latent attention serves text-only models."""
        (B, T, _), (H, width, N, C), w, ops = x.shape, self.widths, self.w, self.ops
        q = self.query(x).reshape(B, T, H, width)  # [B, T, H, N + P]
        compressed = ops.linear(x, w.kv_a_proj_with_mqa, w.kv_a_proj_with_mqa_bias)  # [B, T, C + P]
        kv = ops.rms_norm(compressed[..., :C], w.kv_a_layernorm, LATENT_NORM_EPS, 0.0)  # [B, T, C]
        cos, sin = self.angles(positions)
        q = np.concatenate([q[..., :N], ops.apply_rope(q[..., N:], cos, sin)], axis=-1)
        k_rope = ops.apply_rope(compressed[:, :, None, C:], cos, sin)  # [B, T, 1, P]: one key for all heads
        cached = np.concatenate([kv[:, :, None, :], k_rope], axis=-1)  # [B, T, 1, C + P]
        cache.write(self.layer, seq_ids, cached, cached[..., :0])  # no values: they come from the latent
        out = cache.attention(self.layer, seq_ids, q, self.scale, self.window, None, self.attend)
        return ops.linear(out.reshape(B, T, -1), w.o_proj, w.o_proj_bias)  # out: [B, T, H, U]
