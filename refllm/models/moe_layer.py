"""A sparse layer's MLP through the model's op set: route each token, then run its experts.

The maths is ``refllm/nn/moe.py``; this module picks the routing and the
experts' gate a config names, and computes every projection with the op set's
``linear`` (the spec's, or the kernels' for the fast set). Only the experts
some token chose are read, so a decode step reads k experts per layer, not X.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from refllm.config import ModelConfig
from refllm.models.ops import OpSet
from refllm.models.weights import LayerWeights
from refllm.moe_parameters import TOPK_THEN_SOFTMAX, MoeParameters
from refllm.nn.mlp import MLPWeights, clamped_swiglu, gated_mlp
from refllm.nn.moe import mixture_of_experts as spec_mixture_of_experts
from refllm.nn.moe import softmax_then_topk, topk_then_softmax


def route(router_logits: np.ndarray, moe: MoeParameters) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: [T, X] -> (expert_ids [T, k], expert_weights [T, k]) by the config's routing."""
    if moe.routing == TOPK_THEN_SOFTMAX:
        return topk_then_softmax(router_logits, moe.experts_per_token)
    return softmax_then_topk(router_logits, moe.experts_per_token, moe.norm_topk_prob)


def expert_mlp_through(ops: OpSet, config: ModelConfig) -> Callable[[np.ndarray, MLPWeights], np.ndarray]:
    """An expert's MLP through ``ops``: ``refllm.nn.mlp.gated_mlp``, its gate the config's activation or
    gpt-oss's clamped SwiGLU. (rows [N, D], expert) -> [N, D]."""
    moe = config.moe
    if moe is not None and moe.swiglu_limit is not None:
        gate = functools.partial(clamped_swiglu, alpha=moe.swiglu_alpha, limit=moe.swiglu_limit)
    else:
        gate = functools.partial(ops.gated, activation=config.hidden_act)
    return functools.partial(gated_mlp, gate=gate, linear=ops.linear)


def mixture_of_experts(
    h: np.ndarray, w: LayerWeights, config: ModelConfig, ops: OpSet, routing: Callable = route
) -> np.ndarray:
    """h: [B, T, D] (normed), w: a sparse layer's weights -> [B, T, D]. ``routing``: as ``route``."""
    route = functools.partial(routing, moe=config.moe)
    expert_mlp = expert_mlp_through(ops, config)
    return spec_mixture_of_experts(h, w.router, w.router_bias, w.experts, route, expert_mlp, ops.linear)
