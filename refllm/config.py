"""ModelConfig: one dataclass for every supported architecture.

Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3, SmolLM3, OLMo 2, DeepSeek-V3 and
the mixture-of-experts families (Mixtral, Qwen3-MoE, gpt-oss) differ only by the flags
below; the forward pass in ``refllm/models/llama.py`` reads them, it never asks which
architecture it is running.

``ModelConfig.from_hf(config_json)`` reads a Hugging Face ``config.json`` through
the reader of its family (``refllm/families/``), in both spellings found in
the wild: the long-standing keys (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``, ``sliding_window_pattern``) and the transformers 5 keys
(``rope_parameters``, per layer type for Gemma 3, and ``layer_types``). Unknown
keys are ignored; a missing required key is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from refllm.config_checks import check_fields
from refllm.errors import ConfigError
from refllm.families import MODEL_TYPES
from refllm.families.deepseek import GroupedExperts, LatentAttention
from refllm.families.keys import HFKeys
from refllm.moe_parameters import MoeParameters
from refllm.rope_parameters import FULL_ATTENTION, ROPE_TYPES, SLIDING_ATTENTION, RopeParameters

__all__ = [
    "ACTIVATIONS", "FULL_ATTENTION", "ROPE_TYPES", "SLIDING_ATTENTION", "SUPPORTED_MODEL_TYPES",
    "ConfigError", "ModelConfig", "RopeParameters", "UnsupportedArchitectureError",
]

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_MODEL_TYPES = tuple(MODEL_TYPES)  # config.json's model_type (GGUF architectures: refllm/io/gguf.py)


class UnsupportedArchitectureError(ConfigError):
    """A ``model_type`` refllm does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model.

    Dimension letters used across refllm: ``D`` hidden size, ``H`` query heads,
    ``K`` KV heads, ``E`` head dim, ``F`` MLP size, ``V`` vocabulary, ``L`` layers.
    """

    model_type: str
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_hidden_layers: int  # L
    num_attention_heads: int  # H
    num_key_value_heads: int  # K
    head_dim: int  # E
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    # Biases: q/k/v projections, the output projection, and the three MLP projections.
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    # Per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    # OLMo 2: the q/k RMSNorm spans the whole projection (H*E and K*E), not each head.
    qk_norm_whole: bool = False
    # Gemma stores RMSNorm weights as w - 1 and applies (1 + w).
    norm_weight_offset: float = 0.0
    # Gemma multiplies embeddings by sqrt(D); 1.0 elsewhere.
    embedding_scale: float = 1.0
    # Gemma's sandwich norms: a norm after attention and another pair around the MLP.
    sandwich_norms: bool = False
    # OLMo 2's post-norms: no norm before attention or the MLP, one after each (refllm/nn/residual.py).
    post_norms: bool = False
    # Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj.
    fused_qkv: bool = False
    fused_gate_up: bool = False
    attention_scale: float | None = None  # defaults to E ** -0.5
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    nope_layers: tuple[int, ...] = ()  # SmolLM3: layers whose queries and keys skip RoPE
    rope: dict[str, RopeParameters] = field(default_factory=dict)  # keyed by layer type
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # gpt-oss: a learned per-head logit joins each attention softmax's denominator.
    attention_sinks: bool = False
    # Mixture of experts (Mixtral, Qwen3-MoE, gpt-oss): the sparse layers' routers and experts; None when dense.
    moe: MoeParameters | None = None
    # DeepSeek-V3: multi-head latent attention instead of q/k/v, grouped experts in place of some MLPs.
    latent_attention: LatentAttention | None = None
    grouped_experts: GroupedExperts | None = None
    # Layers a checkpoint holds past the last that plain decoding never runs (DeepSeek-V3's
    # multi-token-prediction module, num_nextn_predict_layers): their tensors are skipped.
    unused_layers: int = 0

    def __post_init__(self) -> None:
        check_fields(self)  # before anything is built per layer
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unsupported activation {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        if self.attention_scale is None:
            object.__setattr__(self, "attention_scale", self.head_dim**-0.5)
        for layer in self.nope_layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_hidden_layers:
                raise ConfigError(f"nope_layers holds {layer!r:.30}, not a layer of 0 .. {self.num_hidden_layers - 1}")
        if self.post_norms and self.sandwich_norms:
            raise ConfigError("post_norms and sandwich_norms are two placements; a model has one")
        for layer_type in set(self.layer_types):
            if layer_type not in self.rope:
                raise ConfigError(f"no rope parameters for layer type {layer_type!r}")

    @property
    def context_length(self) -> int:
        """The longest sequence refllm runs: max_position_embeddings, stretched by dynamic NTK scaling."""
        dynamic = [p.factor for p in self.rope.values() if p.rope_type == "dynamic"]
        return int(self.max_position_embeddings * max(dynamic, default=1.0))

    def window_for_layer(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (keys within the last W positions), or None."""
        return self.sliding_window if self.layer_types[layer] == SLIDING_ATTENTION else None

    def uses_rope(self, layer: int) -> bool:
        """False for a NoPE layer, whose attention sees no positions but the causal mask's."""
        return layer not in self.nope_layers

    def rope_for_layer(self, layer: int) -> RopeParameters:
        return self.rope[self.layer_types[layer]]

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    @property
    def experts(self) -> MoeParameters | GroupedExperts | None:
        """The sparse layers' settings, ``moe`` or DeepSeek-V3's ``grouped_experts``; None when dense."""
        return self.moe if self.moe is not None else self.grouped_experts

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return self.experts is not None and self.experts.is_sparse(layer)

    @property
    def num_parameters(self) -> int:
        """Every weight, all experts included."""
        return self._count_parameters(active=False)

    @property
    def active_parameters(self) -> int:
        """The weights one token's forward pass reads: of each sparse layer, only its k chosen experts
        (DeepSeek-V3's shared experts, which every token runs, included)."""
        return self._count_parameters(active=True)

    def _count_parameters(self, active: bool) -> int:
        D, F, V, E = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        H, K = self.num_attention_heads, self.num_key_value_heads
        if self.latent_attention is None:
            attention = D * H * E + 2 * D * K * E + H * E * D + (H if self.attention_sinks else 0)
            attention += ((H + 2 * K) * E if self.qkv_bias else 0) + (D if self.o_proj_bias else 0)
        else:
            attention = self.latent_attention.num_parameters(D, H, self.qkv_bias)
        dense_mlp = 3 * D * F + (2 * F + D if self.mlp_bias else 0)
        qk_norms = (H + K) * E if self.qk_norm_whole else 2 * E
        norms = (4 if self.sandwich_norms else 2) * D + (qk_norms if self.qk_norm else 0)
        mlps = sum(
            self.experts.mlp_parameters(D, active) if self.is_sparse(layer) else dense_mlp
            for layer in range(self.num_hidden_layers)
        )
        head = 0 if self.tie_word_embeddings else V * D
        return V * D + self.num_hidden_layers * (attention + norms) + mlps + D + head

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Build a ModelConfig from the dict of a Hugging Face ``config.json``."""
        if not isinstance(config, dict):
            raise ConfigError(f"config.json must hold a JSON object; got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitectureError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        try:
            return cls(**MODEL_TYPES[model_type].read(HFKeys(config)))
        except ConfigError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as error:
            # a value of the wrong kind somewhere the readers take it as it comes (rope settings, say)
            raise ConfigError(f"config.json has a value of the wrong kind for a {model_type} model: {error}") from None
