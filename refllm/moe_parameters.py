"""Mixture-of-experts settings, as config.json spells them (the maths is in ``refllm/nn/moe.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from refllm.config_checks import OPTIONAL_POSITIVE, POSITIVE, SIZE, check_bounds
from refllm.errors import ConfigError

SOFTMAX_THEN_TOPK = "softmax_then_topk"  # Mixtral, Qwen3-MoE
TOPK_THEN_SOFTMAX = "topk_then_softmax"  # gpt-oss
ROUTINGS = (SOFTMAX_THEN_TOPK, TOPK_THEN_SOFTMAX)

MOE_BOUNDS = {
    "num_experts": SIZE,  # ``models/expert_weights.py`` holds it against the tensors before building per expert
    "experts_per_token": SIZE,
    "moe_intermediate_size": SIZE,
    "decoder_sparse_step": SIZE,
    "swiglu_limit": OPTIONAL_POSITIVE,
    "swiglu_alpha": POSITIVE,
}
_KEYS = {"experts_per_token": "num_experts_per_tok"}  # config.json keys that differ from the field names


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
    router_bias: bool = False  # gpt-oss: the router's linear layer has a bias
    expert_bias: bool = False  # gpt-oss: every expert projection has a bias
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

    def mlp_parameters(self, hidden_size: int, active: bool) -> int:
        """Weights of one sparse layer's router and experts; ``active``: only the k experts a token runs."""
        D, M, X = hidden_size, self.moe_intermediate_size, self.num_experts
        expert = 3 * D * M + (2 * M + D if self.expert_bias else 0)
        router = X * D + (X if self.router_bias else 0)
        return router + (self.experts_per_token if active else X) * expert
