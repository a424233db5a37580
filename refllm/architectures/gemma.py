"""Gemma 2 and Gemma 3: config.json to ``ModelConfig`` fields."""

from __future__ import annotations

import math
from typing import Any

from refllm.architectures.keys import HFKeys, common_fields, rope_for_types, single_rope
from refllm.config_checks import check_number
from refllm.errors import ConfigError
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION, RopeParameters

GEMMA3_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_LOCAL_ROPE_THETA = 10_000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every sixth layer is global
GEMMA2_SLIDING_WINDOW_PATTERN = 2  # every other layer is global, the first one slides
# transformers' Gemma2Config defaults, taken when config.json lacks the key (an explicit null means no cap).
GEMMA2_ATTN_LOGIT_SOFTCAPPING = 50.0
GEMMA2_FINAL_LOGIT_SOFTCAPPING = 30.0
GEMMA_QUERY_PRE_ATTN_SCALAR = 256


def _gemma_fields(keys: HFKeys) -> dict[str, Any]:
    """What Gemma 2 and 3 share: (1 + w) norms, sqrt(D) embeddings, sandwich norms, a query scale of their own."""
    common = common_fields(keys)
    common["hidden_act"] = keys.get("hidden_activation", keys.get("hidden_act", "gelu_pytorch_tanh"))
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        norm_weight_offset=1.0,
        embedding_scale=math.sqrt(common["hidden_size"]),
        sandwich_norms=True,
        attention_scale=check_number(
            keys.get("query_pre_attn_scalar", GEMMA_QUERY_PRE_ATTN_SCALAR), "query_pre_attn_scalar", positive=True
        ) ** -0.5,
    )


def _layer_types(keys: HFKeys, num_layers: int, default_pattern: int) -> tuple[str, ...]:
    """layer_types (transformers 5), else every ``sliding_window_pattern``-th layer global."""
    if keys.items("layer_types") is not None:
        return keys.items("layer_types")
    pattern = keys.size("sliding_window_pattern", default_pattern)
    return tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers))


def _softcap(keys: HFKeys, key: str, default: float) -> float | None:
    """A soft-cap: the default when the key is absent, None when it is null, else a positive number."""
    value = keys.config[key] if key in keys.config else default
    return None if value is None else check_number(value, key, positive=True)


def read_gemma2(keys: HFKeys) -> dict[str, Any]:
    fields = _gemma_fields(keys)
    layer_types = _layer_types(keys, fields["num_hidden_layers"], GEMMA2_SLIDING_WINDOW_PATTERN)
    return dict(
        **fields,
        attn_logit_softcapping=_softcap(keys, "attn_logit_softcapping", GEMMA2_ATTN_LOGIT_SOFTCAPPING),
        final_logit_softcapping=_softcap(keys, "final_logit_softcapping", GEMMA2_FINAL_LOGIT_SOFTCAPPING),
        # the first Gemma 2 configs spell the window sliding_window_size as well
        sliding_window=keys.get("sliding_window", keys.get("sliding_window_size", 4096)),
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


def read_gemma3_text(keys: HFKeys) -> dict[str, Any]:
    fields = _gemma_fields(keys)
    layer_types = _layer_types(keys, fields["num_hidden_layers"], GEMMA3_SLIDING_WINDOW_PATTERN)
    max_pos = fields["max_position_embeddings"]
    parameters = keys.mapping("rope_parameters")
    if FULL_ATTENTION in parameters:
        # transformers 5: one dict per layer type.
        per_type = HFKeys(parameters)
        full, local = dict(per_type.mapping(FULL_ATTENTION)), dict(per_type.mapping(SLIDING_ATTENTION))
    else:
        # Long-standing keys: rope_scaling applies to the global layers only.
        full = dict(keys.mapping("rope_scaling"))
        full.setdefault("rope_theta", keys.get("rope_theta", GEMMA3_GLOBAL_ROPE_THETA))
        local = {"rope_theta": keys.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA)}
    rope = {
        FULL_ATTENTION: RopeParameters.from_dict(full, GEMMA3_GLOBAL_ROPE_THETA, max_pos),
        SLIDING_ATTENTION: RopeParameters.from_dict(local, GEMMA3_LOCAL_ROPE_THETA, max_pos),
    }
    return dict(
        **fields,
        qk_norm=True,
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
