"""DeepSeek-V3: config.json to ``ModelConfig`` fields, and the two settings groups it adds.

``LatentAttention`` holds multi-head latent attention's widths
(``refllm/nn/latent_attention.py``), ``GroupedExperts`` the mixture of experts
with group-limited sigmoid routing (``refllm/nn/moe_grouped.py``). Both are
small frozen dataclasses hung on ``ModelConfig`` (None for every other family).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from refllm.config_checks import MAX_LAYERS, check_number, check_size
from refllm.errors import ConfigError
from refllm.families.family import Architecture
from refllm.families.keys import HFKeys, common_fields, single_rope
from refllm.rope_parameters import FULL_ATTENTION, RopeParameters


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention's widths (letters as in ``refllm/nn/latent_attention.py``)."""

    q_lora_rank: int | None  # Q: the query's low-rank width; None: one plain q_proj
    kv_lora_rank: int  # C: the compressed key-value width, what the cache holds per token ...
    qk_nope_head_dim: int  # N: per-head key/query dims without RoPE
    qk_rope_head_dim: int  # P: ... with the RoPE key, shared by all heads
    v_head_dim: int  # U: per-head value dims
    rope_interleave: bool = True  # the checkpoint pairs RoPE dims (2i, 2i+1); refllm permutes them at load

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_size(getattr(self, name), name)
        if self.q_lora_rank is not None:
            check_size(self.q_lora_rank, "q_lora_rank")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even (RoPE rotates pairs); got {self.qk_rope_head_dim}")

    @property
    def qk_head_dim(self) -> int:
        """N + P: a query's (and a decompressed key's) width per head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """C + P: what one token costs the cache per layer (one shared latent, not H keys and values)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def num_parameters(self, hidden_size: int, num_heads: int, bias: bool) -> int:
        """Weights of one layer's attention: projections, the two latent norms, biases."""
        D, H, Q, C = hidden_size, num_heads, self.q_lora_rank, self.kv_lora_rank
        query = D * H * self.qk_head_dim if Q is None else D * Q + Q + Q * H * self.qk_head_dim
        kv = D * self.cache_width + C + C * H * (self.qk_nope_head_dim + self.v_head_dim)
        out = H * self.v_head_dim * D
        biases = ((Q or 0) + self.cache_width + D) if bias else 0
        return query + kv + out + biases


@dataclass(frozen=True)
class GroupedExperts:
    """DeepSeek's mixture of experts: which layers have it, how tokens are routed, the expert sizes."""

    num_experts: int  # n_routed_experts
    experts_per_token: int  # num_experts_per_tok
    expert_intermediate_size: int  # moe_intermediate_size
    num_shared_experts: int  # n_shared_experts: one shared MLP of n_shared x moe_intermediate_size
    num_groups: int  # n_group
    groups_per_token: int  # topk_group
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int  # layers 0 .. k-1 keep a dense MLP
    moe_layer_freq: int = 1  # past them, every layer i with i % freq == 0 is sparse

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_intermediate_size", "num_groups", "groups_per_token"):
            check_size(getattr(self, name), name)
        check_size(self.moe_layer_freq, "moe_layer_freq")
        check_number(self.routed_scaling_factor, "routed_scaling_factor", positive=True)
        if self.num_shared_experts < 0 or self.first_k_dense_replace < 0:
            raise ConfigError(
                f"n_shared_experts and first_k_dense_replace must be >= 0;"
                f" got {self.num_shared_experts} and {self.first_k_dense_replace}"
            )
        if self.num_experts % self.num_groups:
            raise ConfigError(f"n_routed_experts ({self.num_experts}) must be a multiple of n_group ({self.num_groups})")
        group_size = self.num_experts // self.num_groups
        if group_size < 2:
            raise ConfigError(f"each expert group needs 2 experts (groups score by their top 2); got {group_size}")
        if self.groups_per_token > self.num_groups:
            raise ConfigError(f"topk_group ({self.groups_per_token}) must be at most n_group ({self.num_groups})")
        if self.experts_per_token > self.groups_per_token * group_size:
            raise ConfigError(
                f"num_experts_per_tok ({self.experts_per_token}) exceeds the {self.groups_per_token * group_size}"
                " experts of the chosen groups"
            )

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` has experts (else a dense MLP of intermediate_size)."""
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def mlp_parameters(self, hidden_size: int, active: bool) -> int:
        """Weights of one sparse layer: the router and its bias, the routed experts (``active``: only the
        experts_per_token a token runs), the shared experts every token runs."""
        D, F = hidden_size, self.expert_intermediate_size
        routed = self.experts_per_token if active else self.num_experts
        return self.num_experts * (D + 1) + (routed + self.num_shared_experts) * 3 * D * F


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
    latent = LatentAttention(
        q_lora_rank=None if q_lora_rank is None else keys.size("q_lora_rank"),
        kv_lora_rank=keys.size("kv_lora_rank"),
        qk_nope_head_dim=keys.size("qk_nope_head_dim"),
        qk_rope_head_dim=keys.size("qk_rope_head_dim"),
        v_head_dim=keys.size("v_head_dim"),
        rope_interleave=bool(keys.get("rope_interleave", True)),
    )
    experts = GroupedExperts(
        num_experts=keys.size("n_routed_experts"),
        experts_per_token=keys.size("num_experts_per_tok"),
        expert_intermediate_size=keys.size("moe_intermediate_size"),
        num_shared_experts=_count(keys, "n_shared_experts"),
        num_groups=keys.size("n_group", 1),
        groups_per_token=keys.size("topk_group", 1),
        norm_topk_prob=bool(keys.get("norm_topk_prob", True)),
        routed_scaling_factor=check_number(keys.get("routed_scaling_factor", 1.0), "routed_scaling_factor"),
        first_k_dense_replace=_count(keys, "first_k_dense_replace"),
        moe_layer_freq=keys.size("moe_layer_freq", 1),
    )
    rope = single_rope(keys)
    bias = bool(keys.get("attention_bias", False))
    # head_dim is what RoPE rotates (as transformers sets it); keys and values live in the latent
    common |= dict(num_key_value_heads=common["num_attention_heads"], head_dim=latent.qk_rope_head_dim)
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        attention_scale=softmax_scale(latent.qk_head_dim, rope),
        rope={FULL_ATTENTION: rope},
        latent_attention=latent,
        grouped_experts=experts,
        unused_layers=_count(keys, "num_nextn_predict_layers"),
    )


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
ARCHITECTURES = (Architecture("deepseek_v3", read_deepseek_v3, "DeepseekV3ForCausalLM", tiny_config=TINY),)
