"""Mixtral: config.json to ``ModelConfig`` fields (Mistral's attention, every MLP a mixture of experts).

llama.cpp writes Mixtral as a ``llama`` file with experts (``refllm/families/llama.py``).
"""

from __future__ import annotations

from typing import Any

from refllm.families.experts import sparse_layer_tensors
from refllm.families.family import Architecture
from refllm.families.keys import (
    HFKeys,
    common_fields,
    expert_count,
    gated_mlp,
    grouped_query_attention,
    rms_norms,
    rope_for_types,
    single_rope,
    window_layer_types,
)
from refllm.families.tables import PRE_NORMS, ExpertNames, Tensor, attention_tensors, norm_tensors
from refllm.moe_parameters import SOFTMAX_THEN_TOPK, MoeParameters

MIXTRAL_ROPE_THETA = 1_000_000.0
MIXTRAL_RMS_NORM_EPS = 1e-5  # transformers' MixtralConfig default
EXPERTS = ExpertNames("block_sparse_moe.gate", "block_sparse_moe.experts.{e}.", ("w1", "w3", "w2"))


def read_mixtral(keys: HFKeys) -> dict[str, Any]:
    window = keys.get("sliding_window")
    layer_types = window_layer_types(keys, window, 0)
    mlp = gated_mlp(keys)
    return dict(
        **common_fields(keys),
        attention=grouped_query_attention(keys),
        mlp=mlp,
        norms=rms_norms(keys, default_eps=MIXTRAL_RMS_NORM_EPS),
        sliding_window=window,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys, MIXTRAL_ROPE_THETA)),
        experts=MoeParameters(
            num_experts=expert_count(keys),
            experts_per_token=keys.size("num_experts_per_tok", 2),
            moe_intermediate_size=mlp.intermediate_size,  # every expert is a full-size MLP
            routing=SOFTMAX_THEN_TOPK,
            norm_topk_prob=True,  # Mixtral always renormalises the chosen weights
        ),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """Mistral's attention and norms; every MLP a mixture of experts, its tensors in ``layout``."""
    return attention_tensors(c) + sparse_layer_tensors(c, layout, EXPERTS) + norm_tensors(c, PRE_NORMS)


ARCHITECTURES = (
    Architecture(
        "mixtral",
        read_mixtral,
        layer_tensors,
        "MixtralForCausalLM",
        tiny_config=dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
        experts=EXPERTS,
    ),
)
