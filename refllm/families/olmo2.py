"""OLMo 2: config.json to ``ModelConfig`` fields, and llama.cpp's olmo2 files.

Llama's projections and MLP, with the norms moved: none before attention or
the MLP, one after each (``post_norms``), and a q/k RMSNorm over the whole
query and key projections rather than per head (``qk_norm_whole``).
"""

from __future__ import annotations

from typing import Any

from refllm.config_checks import check_number
from refllm.families.family import Architecture, GgufArchitecture
from refllm.families.keys import HFKeys, common_fields, single_rope
from refllm.rope_parameters import FULL_ATTENTION

OLMO2_RMS_NORM_EPS = 1e-5  # transformers' Olmo2Config default


def read_olmo2(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    common["rms_norm_eps"] = check_number(keys.get("rms_norm_eps", OLMO2_RMS_NORM_EPS), "rms_norm_eps", positive=True)
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        qk_norm=True,
        qk_norm_whole=True,
        post_norms=True,
        rope={FULL_ATTENTION: single_rope(keys)},
    )


ARCHITECTURES = (Architecture("olmo2", read_olmo2, "Olmo2ForCausalLM", tiny_config=dict(head_dim=12)),)
# after attention and after the MLP, nothing before
POST_NORM_NAMES = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
GGUF = (GgufArchitecture("olmo2", lambda facts: {"model_type": "olmo2"}, layer_names=POST_NORM_NAMES),)
