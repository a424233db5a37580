"""What the mixture-of-experts families share: the tensor tables of their sparse layers, and GGUF metadata.

A sparse layer's router and experts reach refllm in three layouts:

    per expert  one [out, in] matrix per expert and projection, as the Hub's
                Mixtral, Qwen3-MoE and DeepSeek-V3 files (and transformers 5's ``save_pretrained``) hold them:
                  Mixtral      block_sparse_moe.gate.weight [X, D], block_sparse_moe.experts.{e}.w1/w3 [M, D]
                               (gate, up), .w2 [D, M] (down)
                  Qwen3-MoE,   mlp.gate.weight [X, D], mlp.experts.{e}.gate_proj/up_proj [M, D], .down_proj [D, M]
                  DeepSeek-V3  (which adds mlp.gate.e_score_correction_bias [X] and mlp.shared_experts.*)
    fused       all experts in one 3-D tensor per projection, as transformers 5 keeps them in memory
                (its ``state_dict``) and as gpt-oss's files hold them:
                  Mixtral, Qwen3-MoE,  mlp.gate.weight [X, D], mlp.experts.gate_up_proj [X, 2M, D]
                  DeepSeek-V3          (gate rows, then up rows), mlp.experts.down_proj [X, D, M]
                  gpt-oss              mlp.router.weight [X, D] + .bias [X], mlp.experts.gate_up_proj [X, D, 2M]
                                       ([in, out], gate and up columns interleaved: gate 0, up 0, gate 1, ...)
                                       + gate_up_proj_bias [X, 2M], mlp.experts.down_proj [X, M, D]
                                       + down_proj_bias [X, D]
    stacked     llama.cpp's (below): mlp.gate.weight [X, D], mlp.experts.gate_proj.weight / up_proj.weight
                [X, M, D], mlp.experts.down_proj.weight [X, D, M]

Whichever it is, the table splits it so the forward pass sees one ``MLPWeights`` per
expert, each projection a contiguous [out, in] matrix.

llama.cpp's converter (``convert_hf_to_gguf.py``) stacks each sparse layer's experts
into one tensor per projection and names them after gguf-py's ``tensor_mapping.py``:

    blk.N.ffn_gate_inp    [X, D]      the router             -> mlp.gate.weight
    blk.N.ffn_gate_exps   [X, M, D]   every expert's gate    -> mlp.experts.gate_proj.weight
    blk.N.ffn_up_exps     [X, M, D]   every expert's up      -> mlp.experts.up_proj.weight
    blk.N.ffn_down_exps   [X, D, M]   every expert's down    -> mlp.experts.down_proj.weight

(the "stacked" layout above). Mixtral is stored as a
``llama`` file with ``llama.expert_count`` set (its q/k rows permuted like any llama
file's); Qwen3-MoE as ``qwen3moe``. gpt-oss files (``gpt-oss``) hold their experts in
MXFP4, a block format refllm does not dequantize, and are refused as an unsupported
architecture.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from refllm.families.family import GgufFacts
from refllm.families.tables import ExpertNames, PerExpert, Tensor, gated_mlp_tensors, one

ROUTER_SUFFIX = ".mlp.gate.weight"
PER_EXPERT, FUSED, STACKED = "per expert", "fused", "stacked"


def expert_layout(names: ExpertNames, tensor_names: Iterable[str]) -> str:
    """Which layout a checkpoint holds its experts in (see the module docstring)."""
    tensor_names = list(tensor_names)
    if any(name.endswith(".mlp.experts.gate_proj.weight") for name in tensor_names):
        return STACKED
    if names.expert is None or any(name.endswith(".mlp.experts.gate_up_proj") for name in tensor_names):
        return FUSED
    return PER_EXPERT


def sparse_layer_tensors(c, layout: str, names: ExpertNames) -> list[Tensor]:
    """A sparse layer's router and experts in ``layout``, as ``names`` spells them."""
    experts = c.experts
    D, M, X = c.hidden_size, experts.moe_intermediate_size, experts.num_experts
    roles = {kind: PerExpert((kind,), X) for kind in ("gate_proj", "up_proj", "down_proj")}
    router = names.router if layout == PER_EXPERT or names.interleaved else "mlp.gate"
    tensors = [one(f"{router}.weight", (X, D), "mlp.router")]
    if names.correction_bias is not None:
        tensors.append(one(names.correction_bias, (X,), "mlp.correction_bias"))
    if layout == STACKED:
        tensors += [
            Tensor("mlp.experts.gate_proj.weight", (X, M, D), roles["gate_proj"], by_expert),
            Tensor("mlp.experts.up_proj.weight", (X, M, D), roles["up_proj"], by_expert),
            Tensor("mlp.experts.down_proj.weight", (X, D, M), roles["down_proj"], by_expert),
        ]
    elif layout == PER_EXPERT:
        gate, up, down = names.projections
        for e in range(X):
            prefix = names.expert.format(e=e)
            tensors += [
                one(f"{prefix}{gate}.weight", (M, D), roles["gate_proj"][e]),
                one(f"{prefix}{up}.weight", (M, D), roles["up_proj"][e]),
                one(f"{prefix}{down}.weight", (D, M), roles["down_proj"][e]),
            ]
    else:
        tensors += _fused_tensors(c, names)
    if names.router_bias:
        tensors.append(one(f"{router}.bias", (X,), "mlp.router_bias"))
    if names.shared is not None and experts.num_shared_experts:
        tensors += gated_mlp_tensors(names.shared, "mlp.shared.", D, M * experts.num_shared_experts)
    return tensors


def _fused_tensors(c, names: ExpertNames) -> list[Tensor]:
    """gate_up and down of every expert in one tensor each (and their biases)."""
    D, M, X = c.hidden_size, c.experts.moe_intermediate_size, c.experts.num_experts

    def gates_then_ups(t: Any) -> tuple:  # [X, D, 2M] or [X, 2M, D] -> X gates, then X ups, [M, D] each
        if names.interleaved:  # columns gate 0, up 0, gate 1, ...
            return _contiguous((*t[:, :, ::2].transpose(0, 2, 1), *t[:, :, 1::2].transpose(0, 2, 1)))
        return _contiguous((*t[:, :M], *t[:, M:]))  # rows [gate | up]

    def bias_halves(t: Any) -> tuple:  # [X, 2M] -> X gate biases, then X up biases, [M] each
        return _contiguous((*t[:, ::2], *t[:, 1::2]) if names.interleaved else (*t[:, :M], *t[:, M:]))

    gate_up, down = PerExpert(("gate_proj", "up_proj"), X), PerExpert(("down_proj",), X)
    if names.interleaved:  # [in, out]
        tensors = [
            Tensor("mlp.experts.gate_up_proj", (X, D, 2 * M), gate_up, gates_then_ups),
            Tensor("mlp.experts.down_proj", (X, M, D), down, lambda t: _contiguous(t.transpose(0, 2, 1))),
        ]
    else:
        tensors = [
            Tensor("mlp.experts.gate_up_proj", (X, 2 * M, D), gate_up, gates_then_ups),
            Tensor("mlp.experts.down_proj", (X, D, M), down, _contiguous),
        ]
    if names.expert_bias:
        tensors += [
            Tensor("mlp.experts.gate_up_proj_bias", (X, 2 * M), PerExpert(("gate_proj_bias", "up_proj_bias"), X),
                   bias_halves),
            Tensor("mlp.experts.down_proj_bias", (X, D), PerExpert(("down_proj_bias",), X), _contiguous),
        ]
    return tensors


def by_expert(tensor: Any) -> tuple:
    """[X, ...] -> X views [...], one per expert."""
    return tuple(tensor[e] for e in range(tensor.shape[0]))


def _contiguous(parts: Any) -> tuple:
    """Each part (or each [...] of an [X, ...] array) as a contiguous array."""
    return tuple(np.ascontiguousarray(part) for part in parts)


def gguf_moe_keys(facts: GgufFacts, model_type: str) -> dict[str, Any]:
    """config.json keys of a mixture of experts, from ``{arch}.expert_*`` metadata; {} for a dense file."""
    arch = facts.architecture
    if facts.value(f"{arch}.expert_count") is None:
        return {}
    return dict(
        model_type=model_type,
        num_local_experts=facts.size(f"{arch}.expert_count"),
        num_experts_per_tok=facts.size(f"{arch}.expert_used_count"),
    )


def routed_layers(facts: GgufFacts) -> set[int]:
    """The layers whose router a GGUF file holds (model.layers.N.mlp.gate.weight)."""
    return {int(name.split(".")[2]) for name in facts.tensor_names if name.endswith(ROUTER_SUFFIX)}
