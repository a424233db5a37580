"""The tensors of a sparse layer (router and experts) in the layouts checkpoints hold them.

Three layouts reach refllm:

    per expert  one [out, in] matrix per expert and projection, as the Hub's
                Mixtral and Qwen3-MoE files (and transformers 5's ``save_pretrained``) hold them:
                  Mixtral    block_sparse_moe.gate.weight [X, D], block_sparse_moe.experts.{e}.w1/w3 [M, D]
                             (gate, up), .w2 [D, M] (down)
                  Qwen3-MoE  mlp.gate.weight [X, D], mlp.experts.{e}.gate_proj/up_proj [M, D], .down_proj [D, M]
    fused       all experts in one 3-D tensor per projection, as transformers 5 keeps them in memory
                (its ``state_dict``) and as gpt-oss's files hold them:
                  Mixtral, Qwen3-MoE   mlp.gate.weight [X, D], mlp.experts.gate_up_proj [X, 2M, D]
                                       (gate rows, then up rows), mlp.experts.down_proj [X, D, M]
                  gpt-oss              mlp.router.weight [X, D] + .bias [X], mlp.experts.gate_up_proj [X, D, 2M]
                                       ([in, out], gate and up columns interleaved: gate 0, up 0, gate 1, ...)
                                       + gate_up_proj_bias [X, 2M], mlp.experts.down_proj [X, M, D]
                                       + down_proj_bias [X, D]
    stacked     one 3-D tensor per projection, gate and up apart, as llama.cpp's GGUF files
                hold them (``ffn_gate_exps``, ``ffn_up_exps``, ``ffn_down_exps``; ``refllm/io/gguf.py``):
                  mlp.gate.weight [X, D], mlp.experts.gate_proj.weight / up_proj.weight [X, M, D],
                  mlp.experts.down_proj.weight [X, D, M]

Whichever it is, the forward pass sees a list of ``MLPWeights``, each projection a contiguous [out, in] matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from refllm.config import ModelConfig
from refllm.nn.mlp import MLPWeights

# model_type -> (router name, expert prefix with {e}, gate, up, down names) of the per-expert layout
PER_EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts.{e}.", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp.gate", "mlp.experts.{e}.", "gate_proj", "up_proj", "down_proj"),
}
# Architectures whose files hold experts fused, transposed to [in, out] with gate/up columns interleaved.
INTERLEAVED_FUSED = ("gpt_oss",)
PER_EXPERT, FUSED, STACKED = "per expert", "fused", "stacked"


def expert_layout(config: ModelConfig, tensor_names: Iterable[str]) -> str:
    """Which layout a checkpoint holds its experts in (see the module docstring)."""
    names = list(tensor_names)
    if any(name.endswith(".mlp.experts.gate_proj.weight") for name in names):
        return STACKED
    if config.model_type not in PER_EXPERT_NAMES or any(name.endswith(".mlp.experts.gate_up_proj") for name in names):
        return FUSED
    return PER_EXPERT


def sparse_layer_shapes(config: ModelConfig, layer: int, layout: str) -> dict[str, tuple[int, ...]]:
    """The router's and experts' tensor names of sparse ``layer`` in ``layout``, with their shapes."""
    moe = config.moe
    D, M, X = config.hidden_size, moe.moe_intermediate_size, moe.num_experts
    prefix = f"model.layers.{layer}."
    if layout == STACKED:
        experts = prefix + "mlp.experts."
        shapes = {f"{prefix}mlp.gate.weight": (X, D), experts + "gate_proj.weight": (X, M, D)}
        return shapes | {experts + "up_proj.weight": (X, M, D), experts + "down_proj.weight": (X, D, M)}
    if layout == PER_EXPERT:
        router, expert, gate, up, down = PER_EXPERT_NAMES[config.model_type]
        shapes = {f"{prefix}{router}.weight": (X, D)}
        for e in range(X):
            names = prefix + expert.format(e=e)
            shapes |= {f"{names}{gate}.weight": (M, D), f"{names}{up}.weight": (M, D), f"{names}{down}.weight": (D, M)}
        return shapes
    experts = prefix + "mlp.experts."  # FUSED
    if config.model_type in INTERLEAVED_FUSED:
        shapes = {f"{prefix}mlp.router.weight": (X, D), experts + "gate_up_proj": (X, D, 2 * M)}
        shapes[experts + "down_proj"] = (X, M, D)
    else:
        shapes = {f"{prefix}mlp.gate.weight": (X, D), experts + "gate_up_proj": (X, 2 * M, D)}
        shapes[experts + "down_proj"] = (X, D, M)
    if moe.router_bias:
        shapes[f"{prefix}mlp.router.bias"] = (X,)
    if moe.expert_bias:
        shapes |= {experts + "gate_up_proj_bias": (X, 2 * M), experts + "down_proj_bias": (X, D)}
    return shapes


def sparse_layer_weights(
    config: ModelConfig, layer: int, layout: str, get: Callable[[str], np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray | None, list[MLPWeights]]:
    """-> (router [X, D], router bias [X] or None, the experts) of sparse ``layer``; ``get(name)`` reads a tensor."""
    prefix = f"model.layers.{layer}."
    X = config.moe.num_experts
    if layout == STACKED:
        gates, ups, downs = (get(f"{prefix}mlp.experts.{n}.weight") for n in ("gate_proj", "up_proj", "down_proj"))
        return get(prefix + "mlp.gate.weight"), None, [MLPWeights(gates[e], ups[e], downs[e]) for e in range(X)]
    if layout == PER_EXPERT:
        router, expert, gate, up, down = PER_EXPERT_NAMES[config.model_type]
        experts = []
        for e in range(X):
            names = prefix + expert.format(e=e)
            experts.append(MLPWeights(*(get(f"{names}{projection}.weight") for projection in (gate, up, down))))
        return get(f"{prefix}{router}.weight"), None, experts
    gate_up, down = get(prefix + "mlp.experts.gate_up_proj"), get(prefix + "mlp.experts.down_proj")
    gate_up_bias, down_bias = get(prefix + "mlp.experts.gate_up_proj_bias"), get(prefix + "mlp.experts.down_proj_bias")
    if config.model_type in INTERLEAVED_FUSED:
        # [X, D, 2M] columns gate 0, up 0, gate 1, up 1, ...: to [out, in] rows
        gates, ups = gate_up[:, :, ::2].transpose(0, 2, 1), gate_up[:, :, 1::2].transpose(0, 2, 1)
        downs = down.transpose(0, 2, 1)
        gate_biases = gate_up_bias[:, ::2] if gate_up_bias is not None else None
        up_biases = gate_up_bias[:, 1::2] if gate_up_bias is not None else None
        router = get(prefix + "mlp.router.weight")
    else:
        M = config.moe.moe_intermediate_size
        gates, ups, downs = gate_up[:, :M], gate_up[:, M:], down  # rows [gate | up]
        gate_biases = up_biases = None
        router = get(prefix + "mlp.gate.weight")
    experts = [
        MLPWeights(*(None if stacked is None else np.ascontiguousarray(stacked[e])
                 for stacked in (gates, ups, downs, gate_biases, up_biases, down_bias)))
        for e in range(X)
    ]
    return router, get(prefix + "mlp.router.bias"), experts
