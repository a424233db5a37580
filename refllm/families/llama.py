"""Llama and Mistral: config.json to ``ModelConfig`` fields, their tensors, and llama.cpp's ``llama`` files.

The recipe most families start from:

    x -> embed -> for each layer:
             x = x + attention(rms_norm(x))        q, k, v projections -> RoPE -> grouped-query attention
             x = x + mlp(rms_norm(x))              down(silu(gate(x)) * up(x))
      -> rms_norm -> LM head -> logits

with optional biases on the attention's projections (``attention_bias``) and the
MLP's (``mlp_bias``). Mistral is Llama with a sliding window over every layer
(``window_layer_types``). llama.cpp writes both, and Mixtral too, as ``llama``
files, their q/k rows permuted for its interleaved RoPE; a ``llama`` file with
experts is Mixtral's (``refllm/families/mixtral.py``).
"""

from __future__ import annotations

from typing import Any

from refllm.families.experts import gguf_moe_keys
from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
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
from refllm.families.tables import PRE_NORMS, Tensor, attention_tensors, dense_mlp_tensors, norm_tensors
from refllm.rope_parameters import FULL_ATTENTION


def read_llama(keys: HFKeys) -> dict[str, Any]:
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common_fields(keys),
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias),
        mlp=gated_mlp(keys, bias=bool(keys.get("mlp_bias", False))),
        norms=rms_norms(keys),
        rope={FULL_ATTENTION: single_rope(keys)},
    )


def read_mistral(keys: HFKeys, default_eps: float = 1e-6) -> dict[str, Any]:
    """Mistral's keys (and Phi-3's, whose RMSNorm epsilon defaults to ``default_eps`` 1e-5)."""
    window = keys.get("sliding_window")
    layer_types = window_layer_types(keys, window, 0)
    return dict(
        **common_fields(keys),
        attention=grouped_query_attention(keys),
        mlp=gated_mlp(keys),
        norms=rms_norms(keys, default_eps=default_eps),
        sliding_window=window,
        layer_types=layer_types,
        rope=rope_for_types(layer_types, single_rope(keys)),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """input_layernorm before attention, post_attention_layernorm before the MLP (Llama's names)."""
    return attention_tensors(c) + dense_mlp_tensors(c) + norm_tensors(c, PRE_NORMS)


def llama_file(facts: GgufFacts) -> dict[str, Any]:
    return gguf_moe_keys(facts, "mixtral") or {"model_type": "llama"}


ARCHITECTURES = (
    Architecture("llama", read_llama, layer_tensors, "LlamaForCausalLM", tiny_config=dict(attention_bias=True)),
    Architecture("mistral", read_mistral, layer_tensors, "MistralForCausalLM", tiny_config=dict(sliding_window=5)),
)
GGUF = (GgufArchitecture("llama", llama_file, permuted_qk=True),)
