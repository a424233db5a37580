"""Gemma 2 and Gemma 3: config.json to ``ModelConfig`` fields, their tensors, and llama.cpp's gemma2/gemma3 files.

    x -> embed * sqrt(D) -> for each layer:
             x = x + rms_norm(attention(rms_norm(x)))     sandwich norms, (1 + w) weights
             x = x + rms_norm(mlp(rms_norm(x)))           GeGLU: down(gelu_tanh(gate(x)) * up(x))
      -> rms_norm -> LM head -> (soft-cap) -> logits

Both scale embeddings by sqrt(D), store RMSNorm weights as w - 1 and apply (1 + w),
wrap attention and the MLP in sandwich norms (one before, one after each), scale
queries by query_pre_attn_scalar^-0.5, and alternate sliding-window and global
layers. Gemma 2 soft-caps attention scores and logits; Gemma 3 replaced the
attention cap with a per-head q/k norm and gives its sliding layers a RoPE base
of their own.

GGUF files of either family leave out the layer pattern, the query scale and (Gemma
3) the local RoPE base: llama.cpp fixes them in code (``src/llama-model.cpp``), from
google/gemma_pytorch's ``gemma/config.py``, and so does refllm. Their converter adds
1 to every norm weight so llama.cpp can multiply by w.
"""

from __future__ import annotations

import math
from typing import Any

from refllm.config_checks import check_number
from refllm.errors import ConfigError
from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
from refllm.families.keys import (
    HFKeys,
    common_fields,
    gated_mlp,
    grouped_query_attention,
    rms_norms,
    rope_for_types,
    single_rope,
)
from refllm.families.tables import SANDWICH_NORMS, Tensor, attention_tensors, dense_mlp_tensors, norm_tensors
from refllm.recipe import NormPlacement, QKNorm
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION, RopeParameters

GEMMA3_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_LOCAL_ROPE_THETA = 10_000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every sixth layer is global
GEMMA2_SLIDING_WINDOW_PATTERN = 2  # every other layer is global, the first one slides
# transformers' Gemma2Config defaults, taken when config.json lacks the key (an explicit null means no cap).
GEMMA2_ATTN_LOGIT_SOFTCAPPING = 50.0
GEMMA2_FINAL_LOGIT_SOFTCAPPING = 30.0
GEMMA_QUERY_PRE_ATTN_SCALAR = 256
# The 27B models scale queries by (D / H)^-0.5, the others by E^-0.5 (GGUF files carry neither).
GEMMA3_27B_LAYERS = 62
GEMMA2_27B_LAYERS = 46


def _gemma_fields(keys: HFKeys, **attention: Any) -> dict[str, Any]:
    """What Gemma 2 and 3 share: (1 + w) sandwich norms, sqrt(D) embeddings, GeGLU, a query scale of their own."""
    common = common_fields(keys)
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    bias = bool(keys.get("attention_bias", False))
    scalar = check_number(
        keys.get("query_pre_attn_scalar", GEMMA_QUERY_PRE_ATTN_SCALAR), "query_pre_attn_scalar", positive=True
    )
    activation = keys.get("hidden_activation", keys.get("hidden_act", "gelu_pytorch_tanh"))
    return dict(
        **common,
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias, scale=scalar**-0.5, **attention),
        mlp=gated_mlp(keys, activation=activation),
        norms=rms_norms(keys, NormPlacement.SANDWICH, weight_offset=1.0),
        embedding_scale=math.sqrt(common["hidden_size"]),
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
    softcap = _softcap(keys, "attn_logit_softcapping", GEMMA2_ATTN_LOGIT_SOFTCAPPING)
    fields = _gemma_fields(keys, softcap=softcap)
    layer_types = _layer_types(keys, fields["num_hidden_layers"], GEMMA2_SLIDING_WINDOW_PATTERN)
    return dict(
        **fields,
        final_logit_softcapping=_softcap(keys, "final_logit_softcapping", GEMMA2_FINAL_LOGIT_SOFTCAPPING),
        # the first Gemma 2 configs spell the window sliding_window_size as well
        sliding_window=keys.get("sliding_window", keys.get("sliding_window_size", 4096)),
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


def read_gemma3_text(keys: HFKeys) -> dict[str, Any]:
    # Gemma 3 replaced Gemma 2's attention soft-capping with q/k norm; transformers'
    # Gemma 3 ignores attn_logit_softcapping, and so does refllm.
    fields = _gemma_fields(keys, qk_norm=QKNorm.PER_HEAD)
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


# ---- GGUF files ----------------------------------------------------------------------------------------


def _gguf_layer_types(facts: GgufFacts, pattern: int) -> list[str]:
    """Every ``pattern``-th layer global, the others sliding; all global when the file has no window."""
    if facts.window is None:  # newer converters omit the window of a model without one
        return [FULL_ATTENTION] * facts.layers
    return [FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_ATTENTION for i in range(facts.layers)]


def _gemma_file(facts: GgufFacts, pattern: int, layers_27b: int) -> dict[str, Any]:
    config: dict[str, Any] = dict(
        layer_types=_gguf_layer_types(facts, pattern),
        query_pre_attn_scalar=facts.hidden_size // facts.num_heads if facts.layers == layers_27b else facts.head_dim,
        hidden_activation="gelu_pytorch_tanh",
    )
    if facts.window is not None:
        config["sliding_window"] = facts.window
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if facts.value(f"{facts.architecture}.{cap}"):
            config[cap] = facts.number(f"{facts.architecture}.{cap}")
    return config


def gemma3_file(facts: GgufFacts) -> dict[str, Any]:
    """Gemma 3 files carry no layer pattern, local RoPE base or query scale (and no attention soft-cap)."""
    config = _gemma_file(facts, GEMMA3_SLIDING_WINDOW_PATTERN, GEMMA3_27B_LAYERS)
    config.pop("attn_logit_softcapping", None)
    return config | {"model_type": "gemma3_text", "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA}


def gemma2_file(facts: GgufFacts) -> dict[str, Any]:
    """Gemma 2 files carry no layer pattern or query scale; both soft-caps are keys of their own
    (llama.cpp takes 50 and 30 where they are missing, as transformers does)."""
    return _gemma_file(facts, GEMMA2_SLIDING_WINDOW_PATTERN, GEMMA2_27B_LAYERS) | {"model_type": "gemma2"}


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """The sandwich norms: input_layernorm and post_attention_layernorm around attention,
    pre_feedforward_layernorm and post_feedforward_layernorm around the MLP."""
    return attention_tensors(c) + dense_mlp_tensors(c) + norm_tensors(c, SANDWICH_NORMS)


# The sandwich norms' GGUF names: post_attention_norm follows attention, and the pre-MLP norm (ffn_norm,
# Llama's post_attention_layernorm) is pre_feedforward_layernorm.
SANDWICH_NORM_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

ARCHITECTURES = (
    Architecture(
        "gemma3_text",
        read_gemma3_text,
        layer_tensors,
        "Gemma3ForCausalLM",
        tiny_config=dict(head_dim=8, sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
    ),
    Architecture("gemma3", read_gemma3, layer_tensors, "Gemma3ForConditionalGeneration"),
    Architecture(
        "gemma2",
        read_gemma2,
        layer_tensors,
        "Gemma2ForCausalLM",
        # caps low enough that tiny random scores and logits reach them
        tiny_config=dict(
            head_dim=8,
            sliding_window=5,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
    ),
)
GGUF = (
    GgufArchitecture("gemma3", gemma3_file, layer_names=SANDWICH_NORM_NAMES, norms_plus_one=True),
    GgufArchitecture("gemma2", gemma2_file, layer_names=SANDWICH_NORM_NAMES, norms_plus_one=True),
)
