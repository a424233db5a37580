"""Gemma 3: config.json to ``ModelConfig`` fields."""

from __future__ import annotations

import math
from typing import Any

from refllm.architectures.keys import HFKeys, common_fields
from refllm.errors import ConfigError
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION, RopeParameters

GEMMA3_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_LOCAL_ROPE_THETA = 10_000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every sixth layer is global


def read_gemma3_text(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    common["hidden_act"] = keys.get("hidden_activation", keys.get("hidden_act", "gelu_pytorch_tanh"))
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    n = common["num_hidden_layers"]
    if keys.get("layer_types") is not None:
        layer_types = tuple(keys.get("layer_types"))
    else:
        pattern = keys.size("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
        layer_types = tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n))
    max_pos = common["max_position_embeddings"]
    parameters = keys.get("rope_parameters")
    if parameters is not None and FULL_ATTENTION in parameters:
        # transformers 5: one dict per layer type.
        full = dict(parameters.get(FULL_ATTENTION) or {})
        local = dict(parameters.get(SLIDING_ATTENTION) or {})
    else:
        # Long-standing keys: rope_scaling applies to the global layers only.
        full = dict(keys.get("rope_scaling") or {})
        full.setdefault("rope_theta", keys.get("rope_theta", GEMMA3_GLOBAL_ROPE_THETA))
        local = {"rope_theta": keys.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA)}
    rope = {
        FULL_ATTENTION: RopeParameters.from_dict(full, GEMMA3_GLOBAL_ROPE_THETA, max_pos),
        SLIDING_ATTENTION: RopeParameters.from_dict(local, GEMMA3_LOCAL_ROPE_THETA, max_pos),
    }
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        qk_norm=True,
        norm_weight_offset=1.0,
        embedding_scale=math.sqrt(common["hidden_size"]),
        sandwich_norms=True,
        attention_scale=float(keys.get("query_pre_attn_scalar", 256)) ** -0.5,
        # Gemma 3 replaced Gemma 2's attention soft-capping with q/k norm; transformers'
        # Gemma 3 ignores attn_logit_softcapping, and so does refllm.
        attn_logit_softcapping=None,
        final_logit_softcapping=keys.get("final_logit_softcapping"),
        sliding_window=keys.get("sliding_window", 4096),
        layer_types=layer_types,
        rope=rope,
    )


def read_gemma3(keys: HFKeys) -> dict[str, Any]:
    """The multimodal Gemma 3 config nests the language model under text_config."""
    text_config = keys.get("text_config", {})
    if not isinstance(text_config, dict):
        raise ConfigError(f"config.json's text_config must be an object; got {text_config!r:.60}")
    return read_gemma3_text(HFKeys(text_config | {"model_type": "gemma3_text"}))
