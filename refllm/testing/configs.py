"""Tiny ``config.json`` dicts for tests, one per architecture refllm supports.

Hugging Face spellings, so that refllm (``ModelConfig.from_hf``) and
transformers (``AutoConfig.for_model``) both build the model they describe:
a shared tiny base, and over it the keys that switch on what each family does
differently (its family module's ``tiny_config``, ``refllm/families/``).
The hypothesis strategies in ``strategies.py`` draw variations of these, leaving
out the keys ``optional_keys`` names and drawing each architecture as often as
ARCHITECTURE_WEIGHTS says.
"""

from __future__ import annotations

import copy
from typing import Any

from refllm.errors import InvalidInputError
from refllm.families import MODEL_TYPES

# every model type with a tiny config of its own (gemma3 wraps gemma3_text and idefics3 a llama: their
# images are refllm/testing/vision.py's)
ARCHITECTURES = tuple(name for name, architecture in MODEL_TYPES.items() if architecture.tiny_config is not None)


class UnknownArchitectureError(InvalidInputError):
    """An architecture name the kit has no tiny config for."""


def check_architectures(names) -> tuple[str, ...]:
    """-> the non-empty names as a tuple; refuses one not in ARCHITECTURES."""
    names = tuple(name for name in names if name)
    for name in names:
        if name not in ARCHITECTURES:
            raise UnknownArchitectureError(f"architecture {name!r} is not one of {', '.join(ARCHITECTURES)}")
    if not names:
        raise UnknownArchitectureError(f"no architecture named; choose from {', '.join(ARCHITECTURES)}")
    return names


CLASS_NAMES = {  # the transformers causal-LM class of each architecture, for config.json's "architectures"
    model_type: MODEL_TYPES[model_type].hf_class for model_type in ARCHITECTURES
}
# config.json keys of its own each family's draws vary (strategies.py), with the values to draw from
DRAWN_KEYS = {model_type: MODEL_TYPES[model_type].drawn_keys for model_type in ARCHITECTURES}


# Architectures whose mechanisms few of their draws reach are drawn more often (weight: times each is listed),
# so that a default run reaches each mechanism at least 5 times (mechanisms.py measures it).
ARCHITECTURE_WEIGHTS = (
    dict.fromkeys(ARCHITECTURES, 2)
    | dict.fromkeys(("llama", "qwen2", "phi3", "gemma3_text", "cohere", "mixtral", "gpt_oss"), 3)
    | {"qwen3_moe": 4, "smollm3": 5, "deepseek_v3": 5}
)
# Keys a config.json may leave out, the family's default then applying (refllm's readers and transformers'
# config classes agree on each, tests/testing/test_oracle_hf.py): each is left out with probability 1/3.
COMMON_OPTIONAL_KEYS = ("attention_bias", "mlp_bias", "tie_word_embeddings", "rms_norm_eps", "rope_theta", "hidden_act")
OPTIONAL_KEYS = {
    "phi3": ("partial_rotary_factor",),
    "gemma2": ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"),
    "gemma3_text": ("final_logit_softcapping", "query_pre_attn_scalar"),
    "qwen3_moe": ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"),
    "gpt_oss": ("swiglu_limit",),
    "deepseek_v3": ("norm_topk_prob", "routed_scaling_factor", "rope_interleave"),
    "cohere": ("logit_scale",),  # rope_theta kept: refllm's default is transformers 5's
    "granite": ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"),
}


def optional_keys(model_type: str) -> tuple[str, ...]:
    """The keys of ``model_type``'s config.json a draw may leave out."""
    common = tuple(key for key in COMMON_OPTIONAL_KEYS if not (model_type == "cohere" and key == "rope_theta"))
    return common + OPTIONAL_KEYS.get(model_type, ())


def weighted(architectures: tuple[str, ...]) -> list[str]:
    """Each architecture listed ARCHITECTURE_WEIGHTS times, for ``st.sampled_from``."""
    return [name for name in architectures for _ in range(ARCHITECTURE_WEIGHTS[name])]


def tiny_config_json(model_type: str, sliding_window: int = 5) -> dict[str, Any]:
    """A fixed tiny ``config.json`` dict per architecture, each with its distinguishing flags on."""
    check_architectures([model_type])
    base = dict(
        model_type=model_type,
        architectures=[CLASS_NAMES[model_type]],
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    extra = copy.deepcopy(MODEL_TYPES[model_type].tiny_config)
    if "sliding_window" in extra:
        extra["sliding_window"] = sliding_window
    return base | extra
