"""Llama and Mistral: config.json to ``ModelConfig`` fields, and llama.cpp's ``llama`` files.

Mistral is Llama with a sliding window over every layer (``window_layer_types``).
llama.cpp writes both, and Mixtral too, as ``llama`` files, their q/k rows permuted
for its interleaved RoPE; a ``llama`` file with experts is Mixtral's
(``refllm/families/mixtral.py``).
"""

from __future__ import annotations

from typing import Any

from refllm.families.experts import gguf_moe_keys
from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
from refllm.families.keys import HFKeys, common_fields, rope_for_types, single_rope, window_layer_types
from refllm.rope_parameters import FULL_ATTENTION


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


def llama_file(facts: GgufFacts) -> dict[str, Any]:
    return gguf_moe_keys(facts, "mixtral") or {"model_type": "llama"}


ARCHITECTURES = (
    Architecture("llama", read_llama, "LlamaForCausalLM", tiny_config=dict(attention_bias=True)),
    Architecture("mistral", read_mistral, "MistralForCausalLM", tiny_config=dict(sliding_window=5)),
)
GGUF = (GgufArchitecture("llama", llama_file, permuted_qk=True),)
