"""gpt-oss: config.json to ``ModelConfig`` fields.

Attention sinks, sliding and full layers alternating, biases on every
projection, YaRN, and experts routed top-k-then-softmax through a biased
router into a clamped SwiGLU.
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
)
from refllm.families.tables import PRE_NORMS, ExpertNames, Tensor, attention_tensors, norm_tensors
from refllm.moe_parameters import TOPK_THEN_SOFTMAX, MoeParameters
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION

# The files hold the experts fused only: mlp.router (with a bias), gate_up_proj as [X, D, 2M] with gate
# and up columns interleaved, biases on every projection (refllm/families/experts.py).
EXPERTS = ExpertNames("mlp.router", None, interleaved=True, router_bias=True, expert_bias=True)
GPT_OSS_ROPE_THETA = 150_000.0
GPT_OSS_RMS_NORM_EPS = 1e-5  # transformers' GptOssConfig default
# transformers' default when config.json names no RoPE scaling
GPT_OSS_YARN = dict(
    rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096
)


def read_gpt_oss(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    if keys.items("layer_types") is not None:
        layer_types = keys.items("layer_types")
    else:  # even layers slide, odd layers see everything
        layer_types = tuple(
            SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(common["num_hidden_layers"])
        )
    if keys.get("rope_parameters") is None and keys.get("rope_scaling") is None:
        keys = HFKeys(keys.config | {"rope_scaling": GPT_OSS_YARN})
    bias = bool(keys.get("attention_bias", True))
    mlp = gated_mlp(keys)
    return dict(
        **common,
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias, sinks=True),
        mlp=mlp,
        norms=rms_norms(keys, default_eps=GPT_OSS_RMS_NORM_EPS),
        sliding_window=keys.get("sliding_window", 128),
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys, GPT_OSS_ROPE_THETA)),
        experts=MoeParameters(
            num_experts=expert_count(keys),
            experts_per_token=keys.size("num_experts_per_tok", 4),
            moe_intermediate_size=mlp.intermediate_size,
            routing=TOPK_THEN_SOFTMAX,
            norm_topk_prob=False,  # the softmax over the k chosen already sums to 1
            swiglu_limit=keys.get("swiglu_limit", 7.0),
            swiglu_alpha=keys.get("swiglu_alpha", 1.702),
        ),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """Attention with sinks; every MLP a mixture of experts."""
    return attention_tensors(c) + sparse_layer_tensors(c, layout, EXPERTS) + norm_tensors(c, PRE_NORMS)


ARCHITECTURES = (
    Architecture(
        "gpt_oss",
        read_gpt_oss,
        layer_tensors,
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
        experts=EXPERTS,
    ),
)
