"""IBM Granite 3: config.json to ``ModelConfig`` fields.

Llama's recipe and tensors (``refllm/families/llama.py``) with four multipliers:

    x -> embed * embedding_multiplier -> for each layer:
             x = x + residual_multiplier * attention(rms_norm(x))    scores scaled by attention_multiplier
             x = x + residual_multiplier * mlp(rms_norm(x))
      -> rms_norm -> LM head -> logits / logits_scaling

``attention_multiplier`` replaces the usual 1 / sqrt(E) as the scale of the attention
scores; the logits are divided by ``logits_scaling`` (a ``logit_scale`` of its inverse).
"""

from __future__ import annotations

from typing import Any

from refllm.config_checks import check_number
from refllm.families.family import Architecture
from refllm.families.keys import HFKeys, common_fields, gated_mlp, grouped_query_attention, rms_norms, single_rope
from refllm.families.llama import layer_tensors
from refllm.rope_parameters import FULL_ATTENTION


def _multiplier(keys: HFKeys, key: str) -> float:
    """A positive multiplier, 1 when config.json leaves it out (transformers' GraniteConfig default)."""
    return check_number(keys.get(key, 1.0), key, positive=True)


def read_granite(keys: HFKeys) -> dict[str, Any]:
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common_fields(keys),
        attention=grouped_query_attention(
            keys, bias=bias, output_bias=bias, scale=_multiplier(keys, "attention_multiplier")
        ),
        mlp=gated_mlp(keys, bias=bool(keys.get("mlp_bias", False))),
        norms=rms_norms(keys),
        rope={FULL_ATTENTION: single_rope(keys)},
        embedding_scale=_multiplier(keys, "embedding_multiplier"),
        residual_scale=_multiplier(keys, "residual_multiplier"),
        logit_scale=1.0 / _multiplier(keys, "logits_scaling"),
    )


ARCHITECTURES = (
    Architecture(
        "granite",
        read_granite,
        layer_tensors,
        "GraniteForCausalLM",
        # multipliers far enough from 1 that a forgotten one shows
        tiny_config=dict(
            embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=3.0
        ),
        drawn_keys=dict(
            embedding_multiplier=(1.0, 12.0),
            residual_multiplier=(0.22, 1.0),
            attention_multiplier=(0.0625, 0.3),
            logits_scaling=(1.0, 8.0),
            attention_bias=(False, True),
            mlp_bias=(False, True),
        ),
    ),
)
