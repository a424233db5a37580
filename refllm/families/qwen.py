"""Qwen2 and Qwen3: config.json to ``ModelConfig`` fields, and llama.cpp's qwen2/qwen3 files.

Llama's recipe and tensors (``refllm/families/llama.py``). Qwen2 adds biases to
the q/k/v projections and an optional sliding window over the layers past
``max_window_layers``; Qwen3 drops the biases for a per-head RMSNorm of queries
and keys before RoPE. llama.cpp stores them as Hugging Face has them.
"""

from __future__ import annotations

from typing import Any

from refllm.config_checks import COUNT, checked
from refllm.families.family import Architecture, GgufArchitecture
from refllm.families.keys import (
    HFKeys,
    common_fields,
    gated_mlp,
    grouped_query_attention,
    rms_norms,
    rope_for_types,
    single_rope,
    window_layer_types,
)
from refllm.families.llama import layer_tensors
from refllm.recipe import QKNorm
from refllm.rope_parameters import SLIDING_ATTENTION


def read_qwen(keys: HFKeys) -> dict[str, Any]:
    # use_sliding_window: false makes the sliding_window value inert.
    window = keys.get("sliding_window") if keys.get("use_sliding_window", False) else None
    first_window_layer = checked(keys.get("max_window_layers", 28), "max_window_layers", COUNT)
    layer_types = window_layer_types(keys, window, first_window_layer)
    if keys.require("model_type") == "qwen3":
        bias = bool(keys.get("attention_bias", False))
        attention = grouped_query_attention(keys, bias=bias, output_bias=bias, qk_norm=QKNorm.PER_HEAD)
    else:  # Qwen2: q/k/v biases, none on the output projection
        attention = grouped_query_attention(keys, bias=True)
    return dict(
        **common_fields(keys),
        attention=attention,
        mlp=gated_mlp(keys),
        norms=rms_norms(keys),
        sliding_window=window if SLIDING_ATTENTION in layer_types else None,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


ARCHITECTURES = (
    Architecture(
        "qwen2",
        read_qwen,
        layer_tensors,
        "Qwen2ForCausalLM",
        tiny_config=dict(use_sliding_window=True, sliding_window=5, max_window_layers=1),
    ),
    Architecture("qwen3", read_qwen, layer_tensors, "Qwen3ForCausalLM", tiny_config=dict(head_dim=12)),
)
GGUF = (
    GgufArchitecture("qwen2", lambda facts: {"model_type": "qwen2"}),
    GgufArchitecture("qwen3", lambda facts: {"model_type": "qwen3"}),
)
