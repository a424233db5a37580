"""Reference outputs from Hugging Face transformers for every architecture refllm claims.

For each case below, ``build_hf_model`` builds a tiny randomly initialised transformers model
(float32, eager attention) and ``hf_reference`` records, for a prompt longer than the sliding
window, the logits at every position and a greedy continuation generated with transformers' KV
cache. ``python tests/tools/make_hf_fixtures.py`` saves both into ``tests/data/hf/`` (the model
with ``save_pretrained``); ``tests/parity/test_hf_parity.py`` compares refllm against these files
without torch, and against live transformers models built by the same functions when
transformers is installed.
"""

from __future__ import annotations

import inspect

import numpy as np

PROMPT_LEN = 24  # longer than every sliding window below (8)
NEW_TOKENS = 32  # long enough for a wrong RoPE layout to turn into gibberish
SEED = 1234

_BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

_DEEPSEEK = dict(
    num_key_value_heads=4,  # transformers' MLA needs K = H: every head gets its own expanded key
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    rope_interleave=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10_000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "mscale": 0.8,
        "mscale_all_dim": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
)

# name -> (transformers config class name, config overrides, dtype the weights are saved in)
CASES: dict[str, tuple[str, dict, str]] = {
    "llama": ("LlamaConfig", dict(rope_theta=10_000.0), "float32"),
    "llama-bias-tied": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True), "float32"),
    "llama-linear-rope": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "float32"),
    "llama-dynamic-rope": (
        "LlamaConfig",
        dict(max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
        "float32",
    ),
    "llama3-rope": (
        "LlamaConfig",
        dict(
            rope_theta=500_000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "float32",
    ),
    "llama-yarn-rope": (
        "LlamaConfig",
        dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
        "float32",
    ),
    "mistral": ("MistralConfig", dict(sliding_window=8, head_dim=16), "float32"),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=False, sliding_window=8), "bfloat16"),
    "qwen2-sliding": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "float32"),
    "qwen3": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=True), "float16"),
    "phi3": ("Phi3Config", dict(partial_rotary_factor=0.5, sliding_window=8), "float32"),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        "float32",
    ),
    "gemma3_text-softcap": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=3.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        "float32",
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,  # low enough that the random scores reach it
            final_logit_softcapping=3.0,
        ),
        "float32",
    ),
    # four layers: the released interval (4) leaves the last one without RoPE, as llama.cpp assumes
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4, rope_theta=5_000_000.0), "float32"),
    "olmo2": ("Olmo2Config", dict(rms_norm_eps=1e-6), "float32"),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8), "float32"),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=False,
            mlp_only_layers=[1],
        ),
        "float32",
    ),
    "gpt_oss": (
        "GptOssConfig",
        dict(
            head_dim=16,
            sliding_window=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            swiglu_limit=1.0,  # low enough that random weights reach the clamp
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150_000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 32,
            },
        ),
        "float32",
    ),
    # DeepSeek-V3: latent attention (low-rank q, interleaved RoPE, YaRN whose mscale_all_dim scales the
    # softmax), one dense layer then experts routed in groups with a correction bias and a shared expert.
    "deepseek_v3": ("DeepseekV3Config", dict(_DEEPSEEK, num_hidden_layers=3), "float32"),
    # a plain q_proj, rotate-half RoPE, unnormalised weights, biases, two shared experts, one group of two kept
    "deepseek_v3-plain-q": (
        "DeepseekV3Config",
        dict(
            _DEEPSEEK,
            q_lora_rank=None,
            rope_interleave=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            norm_topk_prob=False,
            attention_bias=True,
            n_group=2,
            topk_group=1,
            n_shared_experts=2,
            routed_scaling_factor=1.5,
        ),
        "float32",
    ),
    # IBM Granite 3: Llama with an embedding multiplier, a residual multiplier on every sublayer's output,
    # its own attention scale and the logits divided by logits_scaling; each far from its neutral value
    "granite": (
        "GraniteConfig",
        dict(
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.125,  # E^-0.5 would be 0.25
            logits_scaling=8.0,
            attention_bias=True,
        ),
        "float32",
    ),
    # Cohere's Command-R: attention and the MLP side by side on one LayerNorm (no bias), logits scaled, RoPE
    # pairs interleaved; untied, so the greedy tokens do not settle on one (its config ties by default)
    "cohere": ("CohereConfig", dict(use_qk_norm=True, logit_scale=0.25, tie_word_embeddings=False), "float32"),
    # no q/k norm, biases on the q/k/v/o projections, transformers' default logit scale
    "cohere-no-qk-norm": ("CohereConfig", dict(attention_bias=True, tie_word_embeddings=False), "float32"),
}
ROUTER_SPREAD = 3.0  # router weights scaled so no token's top-k is decided by float rounding

# The long-standing config.json spellings of some cases, written next to the transformers 5 ones.
LEGACY_CONFIGS: dict[str, dict] = {
    "llama3-rope": dict(
        rope_theta=500_000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "gemma3_text-softcap": dict(
        rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window_pattern=2,
    ),
    # layers alternate sliding / global without layer_types; the first configs add sliding_window_size
    "gemma2": dict(rope_theta=10_000.0, sliding_window_size=8),
    # no_rope_layers derived from the interval
    "smollm3": dict(rope_theta=5_000_000.0, no_rope_layer_interval=4),
}


def prompt_ids() -> np.ndarray:
    """[1, PROMPT_LEN] token ids, deterministic."""
    return np.random.default_rng(SEED).integers(3, _BASE["vocab_size"], size=(1, PROMPT_LEN))


def build_hf_model(name: str):
    """A transformers model for ``name``, randomly initialised from a fixed seed, float32 eager."""
    import torch
    import transformers

    class_name, overrides, _ = CASES[name]
    config = getattr(transformers, class_name)(**(_BASE | overrides))
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        # transformers initialises norm weights to exactly 1 (0 for Gemma); perturb them so
        # a norm applied the wrong way (w vs 1 + w) cannot pass unnoticed.
        for param_name, param in model.named_parameters():
            if "norm" in param_name or param_name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.1)
            if param_name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                param.mul_(ROUTER_SPREAD)
            if param_name.endswith("self_attn.sinks"):  # a logit comparable to the attention scores
                param.copy_(torch.randn_like(param))
        # DeepSeek's router bias starts at 0; give it values that change which experts are chosen.
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.1)
    return model.eval()


def hf_reference(model, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Full-sequence logits and a greedy continuation decoded through transformers' KV cache.

    The loop is written out rather than calling ``generate``, whose default logits
    processors (EOS suppression, for one) would change the argmax.
    """
    import torch
    from transformers import DynamicCache

    # transformers 5 names the cache argument `cache` (and warns at `past_key_values`), earlier versions do not
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        input_ids = torch.tensor(ids)
        logits = model(input_ids).logits.float().numpy()
        cache = DynamicCache()
        out = model(input_ids, use_cache=True, **{cache_kwarg: cache})
        greedy = []
        for _ in range(NEW_TOKENS):
            token = int(out.logits[0, -1].argmax())
            greedy.append(token)
            out = model(torch.tensor([[token]]), use_cache=True, **{cache_kwarg: cache})
    return {"input_ids": ids, "logits": logits, "greedy": np.array(greedy)}
