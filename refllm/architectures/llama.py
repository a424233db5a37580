"""Llama, Mistral, Qwen2, Qwen3 and Phi-3: config.json to ``ModelConfig`` fields."""

from __future__ import annotations

from typing import Any

from refllm.architectures.keys import HFKeys, common_fields, rope_for_types, single_rope, window_layer_types
from refllm.config_checks import COUNT, checked
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION


def read_llama(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bool(keys.get("mlp_bias", False)),
        rope={FULL_ATTENTION: single_rope(keys)},
    )


def read_mistral(keys: HFKeys) -> dict[str, Any]:
    window = keys.get("sliding_window")
    layer_types = window_layer_types(keys, window, 0)
    return dict(
        **common_fields(keys),
        sliding_window=window,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


def read_qwen(keys: HFKeys) -> dict[str, Any]:
    # use_sliding_window: false makes the sliding_window value inert.
    window = keys.get("sliding_window") if keys.get("use_sliding_window", False) else None
    first_window_layer = checked(keys.get("max_window_layers", 28), "max_window_layers", COUNT)
    layer_types = window_layer_types(keys, window, first_window_layer)
    is_qwen3 = keys.require("model_type") == "qwen3"
    qwen3_bias = bool(keys.get("attention_bias", False))
    return dict(
        **common_fields(keys),
        qkv_bias=qwen3_bias if is_qwen3 else True,
        o_proj_bias=qwen3_bias if is_qwen3 else False,
        qk_norm=is_qwen3,
        sliding_window=window if SLIDING_ATTENTION in layer_types else None,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


def read_phi3(keys: HFKeys) -> dict[str, Any]:
    """Mistral's keys, with q/k/v stored as one qkv_proj and gate/up as one gate_up_proj."""
    return read_mistral(keys) | dict(fused_qkv=True, fused_gate_up=True)
