"""DeepSeek-V3's two blocks in the forward pass: latent attention and the grouped mixture of experts.

``LlamaFamilyModel`` calls these in place of its q/k/v attention and its MLP when
the config has ``latent_attention`` / a layer has experts. Each step goes through
the model's op set; attention over the cached latents is the op set's
(``latent_attention``, or the fast set's absorbed twin). The experts run as every
mixture's do (``refllm/models/moe_layer.py``: the loop of ``refllm/nn/moe.py``,
each expert's projections through the op set), with DeepSeek's router
(``refllm/nn/moe_grouped.py``) in place of the softmax routings.

    latent attention:  x -> q (low-rank or plain) -> RoPE on q's last P dims
                       x -> [c | k_rope] -> norm c, RoPE k_rope -> cache [c | k_rope]
                       -> expand every cached latent into keys and values -> attention -> o_proj
    experts:           x -> router logits -> grouped top-k -> chosen experts, weighted -> + shared experts
"""

from __future__ import annotations

import functools

import numpy as np

from refllm.kv import KVCache
from refllm.models.deepseek_weights import LatentAttentionWeights
from refllm.models.moe_layer import expert_mlp_through, mixture_of_experts
from refllm.models.weights import LayerWeights
from refllm.nn.latent_attention import LATENT_NORM_EPS


def latent_self_attention(
    model, layer_index: int, w: LatentAttentionWeights, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids
) -> np.ndarray:
    """x: [B, T, D] (normed) -> [B, T, D]; the cache receives one latent [c | k_rope] per token."""
    c, ops = model.config, model.ops
    latent = c.latent_attention
    B, T, _ = x.shape
    N, C = latent.qk_nope_head_dim, latent.kv_lora_rank
    if w.q_proj is not None:
        q = ops.linear(x, w.q_proj)
    else:
        q_low = ops.rms_norm(ops.linear(x, w.q_a_proj, w.q_a_proj_bias), w.q_a_layernorm, LATENT_NORM_EPS, 0.0)
        q = ops.linear(q_low, w.q_b_proj)
    q = q.reshape(B, T, c.num_attention_heads, latent.qk_head_dim)
    compressed = ops.linear(x, w.kv_a_proj_with_mqa, w.kv_a_proj_with_mqa_bias)  # [B, T, C + P]
    kv = ops.rms_norm(compressed[..., :C], w.kv_a_layernorm, LATENT_NORM_EPS, 0.0)  # [B, T, C]
    cos, sin = model.rope_angles[c.layer_types[layer_index]](positions)
    q = np.concatenate([q[..., :N], ops.apply_rope(q[..., N:], cos, sin)], axis=-1)
    k_rope = ops.apply_rope(compressed[:, :, None, C:], cos, sin)  # [B, T, 1, P]: one key for all heads
    cached = np.concatenate([kv[:, :, None, :], k_rope], axis=-1)  # [B, T, 1, C + P]
    cache.write(layer_index, seq_ids, cached, cached[..., :0])  # no values: they come from the latent
    attend = functools.partial(ops.latent_attention, kv_b_proj=w.kv_b_proj, nope_dim=N)
    window = c.window_for_layer(layer_index)
    out = cache.attention(layer_index, seq_ids, q, c.attention_scale, window, c.attn_logit_softcapping, attend)
    return ops.linear(out.reshape(B, T, -1), w.o_proj, w.o_proj_bias)  # out: [B, T, H, U]


def grouped_experts_mlp(model, w: LayerWeights, x: np.ndarray) -> np.ndarray:
    """x: [B, T, D] (normed), w: a sparse layer's weights -> routed experts' weighted sum plus the
    shared experts, [B, T, D]."""
    c, ops = model.config, model.ops
    experts = c.grouped_experts

    def route(router_logits: np.ndarray, moe) -> tuple[np.ndarray, np.ndarray]:
        return model.route_experts(
            router_logits,
            w.router_correction_bias,
            experts.experts_per_token,
            experts.num_groups,
            experts.groups_per_token,
            experts.norm_topk_prob,
            experts.routed_scaling_factor,
        )

    out = mixture_of_experts(x, w, c, ops, route)
    if w.shared_experts is not None:
        out = out + expert_mlp_through(ops, c)(x, w.shared_experts)
    return out
