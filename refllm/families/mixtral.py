"""Mixtral: config.json to ``ModelConfig`` fields (Mistral's attention, every MLP a mixture of experts).

llama.cpp writes Mixtral as a ``llama`` file with experts (``refllm/families/llama.py``).
"""

from __future__ import annotations

from typing import Any

from refllm.families.family import Architecture
from refllm.families.keys import (
    HFKeys,
    common_fields,
    expert_count,
    rope_for_types,
    single_rope,
    window_layer_types,
)
from refllm.moe_parameters import SOFTMAX_THEN_TOPK, MoeParameters

MIXTRAL_ROPE_THETA = 1_000_000.0


def read_mixtral(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    window = keys.get("sliding_window")
    layer_types = window_layer_types(keys, window, 0)
    return dict(
        **common,
        sliding_window=window,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys, MIXTRAL_ROPE_THETA)),
        moe=MoeParameters(
            num_experts=expert_count(keys),
            experts_per_token=keys.size("num_experts_per_tok", 2),
            moe_intermediate_size=common["intermediate_size"],  # every expert is a full-size MLP
            routing=SOFTMAX_THEN_TOPK,
            norm_topk_prob=True,  # Mixtral always renormalises the chosen weights
        ),
    )


ARCHITECTURES = (
    Architecture(
        "mixtral",
        read_mixtral,
        "MixtralForCausalLM",
        tiny_config=dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
    ),
)
