"""Tiny ``config.json`` dicts for tests, one per architecture refllm supports.

Hugging Face spellings, so that refllm (``ModelConfig.from_hf``) and
transformers (``AutoConfig.for_model``) both build the model they describe.
The hypothesis strategies in ``strategies.py`` draw variations of these.
"""

from __future__ import annotations

from typing import Any

from refllm.config import SUPPORTED_ARCHITECTURES
from refllm.errors import InvalidInputError

# gemma3 wraps gemma3_text and idefics3 a llama: their images are refllm/testing/vision.py's
ARCHITECTURES = tuple(a for a in SUPPORTED_ARCHITECTURES if a not in ("gemma3", "idefics3"))


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
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}

# DeepSeek-V3's latent attention and grouped experts, tiny; transformers' MLA needs K = H.
DEEPSEEK_TINY = dict(
    num_key_value_heads=4,
    q_lora_rank=12,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=6,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
)


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
    extra = {
        "llama": dict(attention_bias=True),
        "mistral": dict(sliding_window=sliding_window),
        "qwen2": dict(use_sliding_window=True, sliding_window=sliding_window, max_window_layers=1),
        "qwen3": dict(head_dim=12),
        "phi3": dict(partial_rotary_factor=0.5),
        "gemma3_text": dict(
            head_dim=8, sliding_window=sliding_window, layer_types=["sliding_attention", "full_attention"]
        ),
        # caps low enough that tiny random scores and logits reach them
        "gemma2": dict(
            head_dim=8,
            sliding_window=sliding_window,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        "smollm3": dict(no_rope_layer_interval=2),  # the second of the two layers runs without RoPE
        "olmo2": dict(head_dim=12),
        "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=sliding_window),
        "qwen3_moe": dict(
            head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1]
        ),
        "gpt_oss": dict(
            head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=sliding_window, swiglu_limit=1.0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 2.0, "truncate": False,
                             "original_max_position_embeddings": 32},
        ),
        "deepseek_v3": DEEPSEEK_TINY,
    }[model_type]
    return base | extra
