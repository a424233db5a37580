"""gpt-oss: config.json to ``ModelConfig`` fields.

Attention sinks, sliding and full layers alternating, biases on every
projection, YaRN, and experts routed top-k-then-softmax through a biased
router into a clamped SwiGLU.
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
)
from refllm.moe_parameters import TOPK_THEN_SOFTMAX, MoeParameters
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION

GPT_OSS_ROPE_THETA = 150_000.0
# transformers' default when config.json names no RoPE scaling
GPT_OSS_YARN = dict(
    rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096
)


def read_gpt_oss(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    if keys.get("layer_types") is not None:
        layer_types = tuple(keys.get("layer_types"))
    else:  # even layers slide, odd layers see everything
        layer_types = tuple(
            SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(common["num_hidden_layers"])
        )
    if keys.get("rope_parameters") is None and keys.get("rope_scaling") is None:
        keys = HFKeys(keys.config | {"rope_scaling": GPT_OSS_YARN})
    bias = bool(keys.get("attention_bias", True))
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        sliding_window=keys.get("sliding_window", 128),
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys, GPT_OSS_ROPE_THETA)),
        attention_sinks=True,
        moe=MoeParameters(
            num_experts=expert_count(keys),
            experts_per_token=keys.size("num_experts_per_tok", 4),
            moe_intermediate_size=common["intermediate_size"],
            routing=TOPK_THEN_SOFTMAX,
            norm_topk_prob=False,  # the softmax over the k chosen already sums to 1
            router_bias=True,
            expert_bias=True,
            swiglu_limit=float(keys.get("swiglu_limit", 7.0)),
            swiglu_alpha=float(keys.get("swiglu_alpha", 1.702)),
        ),
    )


ARCHITECTURES = (
    Architecture(
        "gpt_oss",
        read_gpt_oss,
        "GptOssForCausalLM",
        tiny_config=dict(
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=5,
            swiglu_limit=1.0,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150_000.0,
                "factor": 2.0,
                "truncate": False,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
)
