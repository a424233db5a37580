"""A model's layers built once, at load, from its recipe (``refllm/recipe.py``), its weights and an op set.

Every choice a family makes is taken here, into objects the forward pass only calls:

    norm           RMSNorm ((1 + w) for Gemma) or LayerNorm without bias, over each of the layer's norm roles
    attention      GroupedQueryAttentionBlock or LatentAttentionBlock (``refllm/models/attention.py``)
    mlp            DenseMLP: the gated MLP (``refllm/nn/mlp.py``), or SparseMLP: the mixture of experts with
                   its family's routing (``refllm/nn/moe.py``, ``refllm/nn/moe_grouped.py``)
    layer          DecoderLayer: attention, then the MLP, each a residual block whose norms sit before,
                   around or after it (and whose output Granite scales); or ParallelDecoderLayer: both
                   from one normed copy of x (Cohere) (``refllm/nn/residual.py``)

A test may swap a part of a built layer (a ``SparseMLP``'s ``route``, a layer's norms):
each is a plain attribute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from refllm.config import ModelConfig
from refllm.kv import KVCache
from refllm.models.attention import GroupedQueryAttentionBlock, LatentAttentionBlock, Rotation, Spans, no_rotation
from refllm.models.fused_layer import fused_layer
from refllm.models.ops import OpSet, fast_ops
from refllm.models.weights import LayerWeights, ModelWeights, SparseMLPWeights
from refllm.moe_parameters import TOPK_THEN_SOFTMAX, GroupedExperts, MoeParameters
from refllm.nn.mlp import MLPWeights, clamped_swiglu, gated_mlp
from refllm.nn.moe import mixture_of_experts, softmax_then_topk, topk_then_softmax
from refllm.nn.moe_grouped import grouped_topk_routing
from refllm.nn.residual import parallel_residual_block, residual_block
from refllm.recipe import LatentAttention, NormKind, NormPlacement


class Norm:
    """x [..., N] -> normed x, with one weight (a layer's norm, the final norm)."""

    def __init__(self, weight: np.ndarray, function: Callable):
        self.weight, self.function = weight, function

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.function(x, self.weight)


def norm_function(config: ModelConfig, ops: OpSet) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """(x, weight) -> normed x: the model's norm, its epsilon and weight offset bound."""
    norms = config.norms
    if norms.kind is NormKind.LAYER:
        return functools.partial(ops.layer_norm, bias=None, eps=norms.eps)
    return functools.partial(ops.rms_norm, eps=norms.eps, offset=norms.weight_offset)


class DenseMLP:
    """h [..., D] (normed) -> [..., D]: the gated MLP."""

    def __init__(self, w: MLPWeights, gate: Callable, linear: Callable):
        self.w, self.gate, self.linear = w, gate, linear

    def __call__(self, h: np.ndarray) -> np.ndarray:
        return gated_mlp(h, self.w, self.gate, self.linear)


class SparseMLP:
    """h [..., D] (normed) -> [..., D]: each token's experts, chosen by ``route`` and mixed (and, for
    DeepSeek-V3, its shared experts added)."""

    def __init__(self, w: SparseMLPWeights, route: Callable, expert_mlp: Callable, linear: Callable):
        self.w, self.route, self.expert_mlp, self.linear = w, route, expert_mlp, linear

    def __call__(self, h: np.ndarray) -> np.ndarray:
        w = self.w
        return mixture_of_experts(
            h, w.router, w.router_bias, w.experts, self.route, self.expert_mlp, self.linear, w.shared
        )


def routing(config: ModelConfig, w: SparseMLPWeights) -> Callable:
    """router logits [T, X] -> (expert ids [T, k], weights [T, k]), as the family routes."""
    experts = config.experts
    if isinstance(experts, GroupedExperts):
        return functools.partial(
            grouped_topk_routing,
            correction_bias=w.correction_bias,
            experts_per_token=experts.experts_per_token,
            num_groups=experts.num_groups,
            groups_per_token=experts.groups_per_token,
            norm_topk_prob=experts.norm_topk_prob,
            routed_scaling_factor=experts.routed_scaling_factor,
        )
    if experts.routing == TOPK_THEN_SOFTMAX:
        return functools.partial(topk_then_softmax, k=experts.experts_per_token)
    return functools.partial(softmax_then_topk, k=experts.experts_per_token, renormalize=experts.norm_topk_prob)


def mlp_block(config: ModelConfig, w: MLPWeights | SparseMLPWeights, ops: OpSet) -> DenseMLP | SparseMLP:
    gate = functools.partial(ops.gated, activation=config.mlp.activation)
    if isinstance(w, MLPWeights):
        return DenseMLP(w, gate, ops.linear)
    experts = config.experts
    if isinstance(experts, MoeParameters) and experts.swiglu_limit is not None:  # gpt-oss's experts
        gate = functools.partial(clamped_swiglu, alpha=experts.swiglu_alpha, limit=experts.swiglu_limit)
    expert_mlp = functools.partial(gated_mlp, gate=gate, linear=ops.linear)
    return SparseMLP(w, routing(config, w), expert_mlp, ops.linear)


class DecoderLayer:
    """x [B, T, D] -> attention, then the MLP, each added to x with its norms before, around or after it."""

    def __init__(self, attention: Callable, mlp: Callable, norms: dict[str, Norm | None], residual_scale: float | None):
        self.attention, self.mlp, self.residual_scale = attention, mlp, residual_scale
        self.attention_norm, self.attention_output_norm = norms["attention_norm"], norms["attention_output_norm"]
        self.mlp_norm, self.mlp_output_norm = norms["mlp_norm"], norms["mlp_output_norm"]

    def __call__(
        self, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list, image_spans: Spans = None
    ) -> np.ndarray:
        def attend(h: np.ndarray) -> np.ndarray:
            return self.attention(h, positions, cache, seq_ids, image_spans)

        x = residual_block(x, attend, self.attention_norm, self.attention_output_norm, self.residual_scale)
        return residual_block(x, self.mlp, self.mlp_norm, self.mlp_output_norm, self.residual_scale)


class ParallelDecoderLayer:
    """x [B, T, D] -> x + attention(norm(x)) + mlp(norm(x))."""

    def __init__(self, attention: Callable, mlp: Callable, norm: Norm):
        self.attention, self.mlp, self.norm = attention, mlp, norm

    def __call__(
        self, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list, image_spans: Spans = None
    ) -> np.ndarray:
        def attend(h: np.ndarray) -> np.ndarray:
            return self.attention(h, positions, cache, seq_ids, image_spans)

        return parallel_residual_block(x, (attend, self.mlp), self.norm)


def build_layers(config: ModelConfig, weights: ModelWeights, ops: OpSet, dtype: np.dtype) -> list[Callable]:
    """One layer object per decoder layer, every choice of the recipe made."""
    angles = {
        layer_type: ops.rope_angles(params, config.attention.rope_dim, config.max_position_embeddings, dtype)
        for layer_type, params in config.rope.items()
    }
    norm = norm_function(config, ops)
    layers = []
    for index, w in enumerate(weights.layers):
        attention = _attention_block(index, config, w, ops, angles, norm)
        mlp = mlp_block(config, w.mlp, ops)
        if config.norms.placement is NormPlacement.PARALLEL:
            layers.append(ParallelDecoderLayer(attention, mlp, Norm(w.attention_norm, norm)))
            continue
        norms = {role: None if weight is None else Norm(weight, norm) for role, weight in _norm_weights(w).items()}
        layer = DecoderLayer(attention, mlp, norms, config.residual_scale)
        # the fast op set as it is, not a test's variant of it (and no Numba for the spec ops: fast_ops loads it)
        fused = ops.name == "fast" and ops is fast_ops() and dtype == np.float32
        layers.append(fused_layer(config, index, w, layer, angles[config.layer_types[index]]) if fused else layer)
    return layers


def _attention_block(index: int, config: ModelConfig, w: LayerWeights, ops: OpSet, angles: dict, norm: Callable):
    layer_angles, window = angles[config.layer_types[index]], config.window_for_layer(index)
    if isinstance(config.attention, LatentAttention):
        return LatentAttentionBlock(index, config.attention, w.attention, ops, layer_angles, window)
    rotation = Rotation(layer_angles, ops.apply_rope) if config.uses_rope(index) else no_rotation
    return GroupedQueryAttentionBlock(index, config.attention, w.attention, ops, rotation, window, norm)


def _norm_weights(w: LayerWeights) -> dict[str, np.ndarray | None]:
    roles = ("attention_norm", "attention_output_norm", "mlp_norm", "mlp_output_norm")
    return {role: getattr(w, role) for role in roles}
