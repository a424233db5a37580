"""DeepSeek-V3: config.json to ``ModelConfig`` fields and its tensors: latent attention and grouped experts.

    x -> embed -> for each layer:
             x = x + latent_attention(rms_norm(x))     keys and values decompressed from one small latent
             x = x + mlp(rms_norm(x))                  the first layers dense, then routed experts + shared
      -> rms_norm -> LM head -> logits

Multi-head latent attention (``refllm/nn/latent_attention.py``) caches one latent
of C + P numbers per token and layer; its settings are ``LatentAttention``
(``refllm/recipe.py``). The mixture of experts routes with group-limited sigmoid
scores (``refllm/nn/moe_grouped.py``) and adds shared experts every token runs;
its settings are ``GroupedExperts`` (``refllm/moe_parameters.py``).

RoPE dims arrive interleaved (pairs 2i, 2i+1) when ``rope_interleave`` is set;
the rows that make q_rope and k_rope are permuted once, at load, to the
rotate-half layout of ``refllm/nn/rope.py`` (a common permutation of q and k
leaves q.k as it was). The official checkpoints hold the multi-token-prediction
layers past the last (``num_nextn_predict_layers``); plain decoding never runs
them, and their tensors are skipped (``ModelConfig.unused_layers``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refllm.config_checks import MAX_LAYERS, check_number
from refllm.errors import ConfigError
from refllm.families.experts import sparse_layer_tensors
from refllm.families.family import Architecture
from refllm.families.keys import HFKeys, common_fields, gated_mlp, rms_norms, single_rope
from refllm.families.tables import (
    PRE_NORMS,
    ExpertNames,
    Tensor,
    dense_mlp_tensors,
    norm_tensors,
    one,
    rotate_half_rows,
)
from refllm.moe_parameters import GroupedExperts
from refllm.recipe import LatentAttention
from refllm.rope_parameters import FULL_ATTENTION, RopeParameters

DEEPSEEK_ROUTED_SCALING_FACTOR = 2.5  # transformers' DeepseekV3Config default, when config.json names none
EXPERTS = ExpertNames(correction_bias="mlp.gate.e_score_correction_bias", shared="mlp.shared_experts.")


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(qk_head_dim: int, rope: RopeParameters) -> float:
    """1 / sqrt(N + P), times mscale(factor, mscale_all_dim)^2 under scaled RoPE (DeepSeek's YaRN).

    YaRN's attention factor already scales cos/sin, i.e. the rope dims; DeepSeek also
    scales the whole score, nope dims included, as its reference code and transformers do.
    """
    scale = qk_head_dim**-0.5
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


def _count(keys: HFKeys, key: str) -> int:
    """A whole number >= 0 (0 when absent), refused by name otherwise."""
    value = keys.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LAYERS:
        raise ConfigError(f"{key} must be an integer in [0, {MAX_LAYERS}]; got {value!r:.60}")
    return value


def read_deepseek_v3(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    q_lora_rank = keys.get("q_lora_rank")
    qk_nope_head_dim, qk_rope_head_dim = keys.size("qk_nope_head_dim"), keys.size("qk_rope_head_dim")
    rope = single_rope(keys)
    attention = LatentAttention(
        num_heads=keys.size("num_attention_heads"),
        q_lora_rank=None if q_lora_rank is None else keys.size("q_lora_rank"),
        kv_lora_rank=keys.size("kv_lora_rank"),
        qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=keys.size("v_head_dim"),
        scale=softmax_scale(qk_nope_head_dim + qk_rope_head_dim, rope),
        bias=bool(keys.get("attention_bias", False)),
        rope_interleave=bool(keys.get("rope_interleave", True)),
    )
    experts = GroupedExperts(
        num_experts=keys.size("n_routed_experts"),
        experts_per_token=keys.size("num_experts_per_tok"),
        moe_intermediate_size=keys.size("moe_intermediate_size"),
        num_shared_experts=_count(keys, "n_shared_experts"),
        num_groups=keys.size("n_group", 1),
        groups_per_token=keys.size("topk_group", 1),
        norm_topk_prob=bool(keys.get("norm_topk_prob", True)),
        routed_scaling_factor=check_number(
            keys.get("routed_scaling_factor", DEEPSEEK_ROUTED_SCALING_FACTOR), "routed_scaling_factor"
        ),
        first_k_dense_replace=_count(keys, "first_k_dense_replace"),
        moe_layer_freq=keys.size("moe_layer_freq", 1),
    )
    return dict(
        **common,
        attention=attention,
        mlp=gated_mlp(keys),
        norms=rms_norms(keys),
        experts=experts,
        rope={FULL_ATTENTION: rope},
        unused_layers=_count(keys, "num_nextn_predict_layers"),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """Latent attention; the dense MLP in the first layers, then routed and shared experts; Llama's norms."""
    mlp = sparse_layer_tensors(c, layout, EXPERTS) if c.is_sparse(layer) else dense_mlp_tensors(c)
    return latent_attention_tensors(c) + mlp + norm_tensors(c, PRE_NORMS)


def latent_attention_tensors(c) -> list[Tensor]:
    """Latent attention's projections and norms (letters as in refllm/nn/latent_attention.py), the rows
    that make RoPE's dims reordered to rotate-half when the checkpoint interleaves them."""
    a, D = c.attention, c.hidden_size
    H, Q, C = a.num_heads, a.q_lora_rank, a.kv_lora_rank
    q_rows = rotate_half_rows(a.qk_head_dim, a.qk_rope_head_dim, H, a.rope_interleave)
    kv_rows = rotate_half_rows(a.cache_width, a.qk_rope_head_dim, 1, a.rope_interleave)

    def rotate_half(rows: np.ndarray):
        return lambda tensor: tensor[rows]

    if Q is None:
        tensors = [one("self_attn.q_proj.weight", (H * a.qk_head_dim, D), "attention.q_proj", rotate_half(q_rows))]
    else:
        tensors = [
            one("self_attn.q_a_proj.weight", (Q, D), "attention.q_a_proj"),
            one("self_attn.q_a_layernorm.weight", (Q,), "attention.q_a_layernorm"),
            one("self_attn.q_b_proj.weight", (H * a.qk_head_dim, Q), "attention.q_b_proj", rotate_half(q_rows)),
        ]
    kv_a = "attention.kv_a_proj_with_mqa"
    tensors += [
        one("self_attn.kv_a_proj_with_mqa.weight", (a.cache_width, D), kv_a, rotate_half(kv_rows)),
        one("self_attn.kv_a_layernorm.weight", (C,), "attention.kv_a_layernorm"),
        one("self_attn.kv_b_proj.weight", (H * (a.qk_nope_head_dim + a.v_head_dim), C), "attention.kv_b_proj"),
        one("self_attn.o_proj.weight", (D, H * a.v_head_dim), "attention.o_proj"),
    ]
    if a.bias:
        tensors += [
            one("self_attn.kv_a_proj_with_mqa.bias", (a.cache_width,), f"{kv_a}_bias", rotate_half(kv_rows)),
            one("self_attn.o_proj.bias", (D,), "attention.o_proj_bias"),
        ]
        if Q is not None:
            tensors.append(one("self_attn.q_a_proj.bias", (Q,), "attention.q_a_proj_bias"))
    return tensors


# Latent attention and grouped experts, tiny; transformers' latent attention needs K = H.
TINY = dict(
    num_key_value_heads=4,
    q_lora_rank=12,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=6,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
)
ARCHITECTURES = (
    Architecture(
        "deepseek_v3", read_deepseek_v3, layer_tensors, "DeepseekV3ForCausalLM", tiny_config=TINY, experts=EXPERTS
    ),
)
