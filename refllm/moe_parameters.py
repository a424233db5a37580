"""Mixture-of-experts settings, as config.json spells them (the maths is in ``refllm/nn/moe.py``).

``MoeParameters`` for Mixtral, Qwen3-MoE and gpt-oss (softmax routings), ``GroupedExperts``
for DeepSeek-V3 (group-limited sigmoid routing, ``refllm/nn/moe_grouped.py``, and shared
experts). Either is a ``ModelConfig``'s ``experts``.
"""

from __future__ import annotations

from dataclasses import dataclass

from refllm.config_checks import COUNT, OPTIONAL_POSITIVE, POSITIVE, SIZE, check_bounds
from refllm.errors import ConfigError

SOFTMAX_THEN_TOPK = "softmax_then_topk"  # Mixtral, Qwen3-MoE
TOPK_THEN_SOFTMAX = "topk_then_softmax"  # gpt-oss
ROUTINGS = (SOFTMAX_THEN_TOPK, TOPK_THEN_SOFTMAX)

MOE_BOUNDS = {
    "num_experts": SIZE,  # ``refllm/families/experts.py`` holds it against the tensors before building per expert
    "experts_per_token": SIZE,
    "moe_intermediate_size": SIZE,
    "decoder_sparse_step": SIZE,
    "swiglu_limit": OPTIONAL_POSITIVE,
    "swiglu_alpha": POSITIVE,
}
_KEYS = {"experts_per_token": "num_experts_per_tok"}  # config.json keys that differ from the field names
GROUPED_BOUNDS = {
    "num_experts": SIZE,
    "experts_per_token": SIZE,
    "moe_intermediate_size": SIZE,
    "num_shared_experts": COUNT,
    "num_groups": SIZE,
    "groups_per_token": SIZE,
    "routed_scaling_factor": POSITIVE,
    "first_k_dense_replace": COUNT,
    "moe_layer_freq": SIZE,
}
_GROUPED_KEYS = {
    "num_experts": "n_routed_experts", "experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts", "num_groups": "n_group", "groups_per_token": "topk_group",
}  # fmt: skip


@dataclass(frozen=True)
class MoeParameters:
    """Which layers are sparse, how tokens are routed among their experts, and the experts' MLP.

    Letters: ``X`` experts per sparse layer, ``k`` experts per token, ``M`` an expert's MLP size.
    """

    num_experts: int  # X
    experts_per_token: int  # k
    moe_intermediate_size: int  # M
    routing: str = SOFTMAX_THEN_TOPK
    norm_topk_prob: bool = True  # renormalise the k chosen probabilities to sum to 1 (softmax_then_topk only)
    swiglu_limit: float | None = None  # gpt-oss: clamped SwiGLU (``refllm.nn.mlp.clamped_swiglu``)
    swiglu_alpha: float = 1.702
    # Qwen3-MoE: layers listed here keep a dense MLP, and layer i is sparse only when (i + 1) % step == 0.
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1

    def __post_init__(self) -> None:
        check_bounds(self, MOE_BOUNDS, keys=_KEYS)
        if self.experts_per_token > self.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({self.experts_per_token}) is more than the {self.num_experts} experts"
            )
        if self.routing not in ROUTINGS:
            raise ConfigError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTINGS)}")

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` runs the experts (else a dense MLP of ``intermediate_size``)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


@dataclass(frozen=True)
class GroupedExperts:
    """DeepSeek's mixture of experts: which layers have it, how tokens are routed, the expert sizes."""

    num_experts: int  # n_routed_experts
    experts_per_token: int  # num_experts_per_tok
    moe_intermediate_size: int  # M, every routed expert's MLP size
    num_shared_experts: int  # n_shared_experts: one shared MLP of n_shared x moe_intermediate_size
    num_groups: int  # n_group
    groups_per_token: int  # topk_group
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int  # layers 0 .. k-1 keep a dense MLP
    moe_layer_freq: int = 1  # past them, every layer i with i % freq == 0 is sparse

    def __post_init__(self) -> None:
        check_bounds(self, GROUPED_BOUNDS, keys=_GROUPED_KEYS)
        if self.num_experts % self.num_groups:
            raise ConfigError(
                f"n_routed_experts ({self.num_experts}) must be a multiple of n_group ({self.num_groups})"
            )
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
