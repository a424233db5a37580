"""A sparse layer's MLP through the model's op set: route each token, then run its experts.

The maths is ``refllm/nn/moe.py``; this module picks the routing and the
experts' gate a config names, and computes every projection with the op set's
``linear`` (the spec's, or the kernels' for the fast set). Only the experts
some token chose are read, so a decode step reads k experts per layer, not X.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refllm.config import ModelConfig
from refllm.models.ops import OpSet
from refllm.models.weights import LayerWeights
from refllm.moe_parameters import TOPK_THEN_SOFTMAX, MoeParameters
from refllm.nn.mlp import clamped_swiglu
from refllm.nn.moe import Expert, experts_forward, softmax_then_topk, topk_then_softmax


def route(router_logits: np.ndarray, moe: MoeParameters) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: [T, X] -> (expert_ids [T, k], expert_weights [T, k]) by the config's routing."""
    if moe.routing == TOPK_THEN_SOFTMAX:
        return topk_then_softmax(router_logits, moe.experts_per_token)
    return softmax_then_topk(router_logits, moe.experts_per_token, moe.norm_topk_prob)


def expert_mlp_through(ops: OpSet, config: ModelConfig) -> Callable[[np.ndarray, Expert], np.ndarray]:
    """An expert's MLP through ``ops``: ``refllm.nn.mlp.gated_mlp`` one op at a time, its gate the
    config's activation or gpt-oss's clamped SwiGLU. (rows [N, D], expert) -> [N, D]."""
    moe = config.moe

    def gate(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if moe is not None and moe.swiglu_limit is not None:
            return clamped_swiglu(gate, up, moe.swiglu_alpha, moe.swiglu_limit)
        return ops.gated(gate, up, config.hidden_act)

    def expert_mlp(rows: np.ndarray, expert: Expert) -> np.ndarray:
        gate_out = ops.linear(rows, expert.gate_proj, expert.gate_proj_bias)
        hidden = gate(gate_out, ops.linear(rows, expert.up_proj, expert.up_proj_bias))
        return ops.linear(hidden, expert.down_proj, expert.down_proj_bias)

    return expert_mlp


def mixture_of_experts(
    h: np.ndarray, w: LayerWeights, config: ModelConfig, ops: OpSet, routing: Callable = route
) -> np.ndarray:
    """h: [B, T, D] (normed), w: a sparse layer's weights -> [B, T, D]. ``routing``: as ``route``."""
    x = h.reshape(-1, h.shape[-1])  # [B*T, D]: routing is per token
    expert_ids, expert_weights = routing(ops.linear(x, w.router, w.router_bias), config.moe)
    expert_mlp = expert_mlp_through(ops, config)
    return experts_forward(x, expert_ids, expert_weights, w.experts, expert_mlp).reshape(h.shape)
