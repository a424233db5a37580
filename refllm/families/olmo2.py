"""OLMo 2: config.json to ``ModelConfig`` fields, and llama.cpp's olmo2 files.

Llama's projections and MLP, with the norms moved: none before attention or
the MLP, one after each (post-norm, ``refllm/nn/residual.py``), and a q/k
RMSNorm over the whole query and key projections rather than per head.

    x = x + rms_norm(attention(x))
    x = x + rms_norm(mlp(x))
"""

from __future__ import annotations

from typing import Any

from refllm.families.family import Architecture, GgufArchitecture
from refllm.families.keys import HFKeys, common_fields, gated_mlp, grouped_query_attention, rms_norms, single_rope
from refllm.families.tables import POST_NORMS, Tensor, attention_tensors, dense_mlp_tensors, norm_tensors
from refllm.recipe import NormPlacement, QKNorm
from refllm.rope_parameters import FULL_ATTENTION

OLMO2_RMS_NORM_EPS = 1e-5  # transformers' Olmo2Config default


def read_olmo2(keys: HFKeys) -> dict[str, Any]:
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common_fields(keys),
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias, qk_norm=QKNorm.WHOLE),
        mlp=gated_mlp(keys),
        norms=rms_norms(keys, NormPlacement.POST, OLMO2_RMS_NORM_EPS),
        rope={FULL_ATTENTION: single_rope(keys)},
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """post_attention_layernorm after attention, post_feedforward_layernorm after the MLP; the q/k norms
    over the whole projections, q_norm [H*E] and k_norm [K*E]."""
    return attention_tensors(c) + dense_mlp_tensors(c) + norm_tensors(c, POST_NORMS)


ARCHITECTURES = (
    Architecture("olmo2", read_olmo2, layer_tensors, "Olmo2ForCausalLM", tiny_config=dict(head_dim=12)),
)
# after attention and after the MLP, nothing before
POST_NORM_NAMES = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
GGUF = (GgufArchitecture("olmo2", lambda facts: {"model_type": "olmo2"}, layer_names=POST_NORM_NAMES),)
