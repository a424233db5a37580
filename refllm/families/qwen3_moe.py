"""Qwen3-MoE: config.json to ``ModelConfig`` fields, and llama.cpp's qwen3moe files.

Qwen3's attention (``refllm/families/qwen.py``), sparse and dense MLPs mixed: a
layer runs a mixture of experts unless ``mlp_only_layers`` lists it (or
``decoder_sparse_step`` skips it). llama.cpp stores it as Hugging Face has it.
"""

from __future__ import annotations

from typing import Any

from refllm.errors import ConfigError
from refllm.families.experts import gguf_moe_keys, routed_layers, sparse_layer_tensors
from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
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
from refllm.families.tables import PRE_NORMS, ExpertNames, Tensor, attention_tensors, dense_mlp_tensors, norm_tensors
from refllm.recipe import QKNorm
from refllm.moe_parameters import SOFTMAX_THEN_TOPK, MoeParameters
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION

EXPERTS = ExpertNames()  # mlp.gate, mlp.experts.{e}.gate_proj / up_proj / down_proj


def read_qwen3_moe(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    # use_sliding_window: false makes the sliding_window value inert; when true, every layer slides.
    window = keys.get("sliding_window") if keys.get("use_sliding_window", False) else None
    layer_types = (SLIDING_ATTENTION if window is not None else FULL_ATTENTION,) * common["num_hidden_layers"]
    mlp_only_layers = keys.get("mlp_only_layers", [])
    if not isinstance(mlp_only_layers, list) or not all(isinstance(i, int) for i in mlp_only_layers):
        raise ConfigError(f"mlp_only_layers must be a list of layer indices; got {mlp_only_layers!r:.60}")
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias, qk_norm=QKNorm.PER_HEAD),
        mlp=gated_mlp(keys),
        norms=rms_norms(keys),
        sliding_window=window,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
        experts=MoeParameters(
            num_experts=expert_count(keys),
            experts_per_token=keys.size("num_experts_per_tok", 8),
            moe_intermediate_size=keys.size("moe_intermediate_size", 768),
            routing=SOFTMAX_THEN_TOPK,
            norm_topk_prob=bool(keys.get("norm_topk_prob", False)),
            mlp_only_layers=tuple(mlp_only_layers),
            decoder_sparse_step=keys.size("decoder_sparse_step", 1),
        ),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """Qwen3's attention and norms; a mixture of experts in the sparse layers, the dense MLP in the others."""
    mlp = sparse_layer_tensors(c, layout, EXPERTS) if c.is_sparse(layer) else dense_mlp_tensors(c)
    return attention_tensors(c) + mlp + norm_tensors(c, PRE_NORMS)


def qwen3moe_file(facts: GgufFacts) -> dict[str, Any]:
    keys = gguf_moe_keys(facts, "qwen3_moe")
    if not keys:
        return {"model_type": "qwen3_moe"}
    arch, routed = facts.architecture, routed_layers(facts)
    return keys | dict(
        moe_intermediate_size=facts.size(f"{arch}.expert_feed_forward_length"),
        # llama.cpp's qwen3moe graph renormalises unless the file says otherwise
        norm_topk_prob=bool(facts.value(f"{arch}.expert_weights_norm", True)),
        mlp_only_layers=[layer for layer in range(facts.layers) if layer not in routed],
    )


ARCHITECTURES = (
    Architecture(
        "qwen3_moe",
        read_qwen3_moe,
        layer_tensors,
        "Qwen3MoeForCausalLM",
        tiny_config=dict(
            head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1]
        ),
        experts=EXPERTS,
    ),
)
GGUF = (GgufArchitecture("qwen3moe", qwen3moe_file),)
