"""The words a family's recipe is written in: what one decoder layer computes, as typed settings.

A ``ModelConfig`` (``refllm/config.py``) holds one of each, built by its family's
reader (``refllm/families/``) from config.json:

    norms      Norms: where the norms sit (NormPlacement), which norm (NormKind), eps, Gemma's (1 + w)
    attention  GroupedQueryAttention (heads, biases, q/k norm, scale, soft-cap, sinks) or LatentAttention
    mlp        GatedMLP: the dense MLP (size, activation, bias)
    experts    MoeParameters or GroupedExperts (``refllm/moe_parameters.py``), or None: every MLP dense

The model turns them into blocks once, at load (``refllm/models/blocks.py``); its
forward pass never asks which family it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from refllm.config_checks import check_number, check_size
from refllm.errors import ConfigError

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # config.json's hidden_act; the functions: refllm/nn/mlp.py


class NormPlacement(Enum):
    """Where a layer's norms sit around its attention and MLP (``refllm/nn/residual.py``)."""

    PRE = "pre-norm"  # x + f(norm(x)): Llama and most others
    SANDWICH = "sandwich"  # x + norm(f(norm(x))): Gemma
    POST = "post-norm"  # x + norm(f(x)): OLMo 2
    PARALLEL = "parallel"  # x + attention(norm(x)) + mlp(norm(x)): Cohere's Command-R


class NormKind(Enum):
    """Which norm (``refllm/nn/norm.py``)."""

    RMS = "RMSNorm"
    LAYER = "LayerNorm without bias"


class QKNorm(Enum):
    """How queries and keys are normed before RoPE."""

    NONE = "none"
    PER_HEAD = "per head"  # over each head's E dims: Qwen3, Gemma 3 (one [E] weight), Cohere ([H, E])
    WHOLE = "whole projection"  # over all H * E dims at once: OLMo 2


@dataclass(frozen=True)
class Norms:
    """A model's norms: their placement, kind, epsilon and weight offset (the q/k norms' too)."""

    placement: NormPlacement = NormPlacement.PRE
    kind: NormKind = NormKind.RMS
    eps: float = 1e-6
    weight_offset: float = 0.0  # Gemma stores RMSNorm weights as w - 1 and applies (1 + w)

    def __post_init__(self) -> None:
        check_number(self.eps, "rms_norm_eps" if self.kind is NormKind.RMS else "layer_norm_eps", positive=True)


@dataclass(frozen=True)
class GroupedQueryAttention:
    """Attention over K key-value heads shared by H query heads (``refllm/nn/attention.py``)."""

    num_heads: int  # H
    num_kv_heads: int  # K
    head_dim: int  # E
    scale: float | None = None  # E ** -0.5 unless the family says otherwise
    bias: bool = False  # on the q, k and v projections
    output_bias: bool = False  # on the output projection
    qk_norm: QKNorm = QKNorm.NONE
    softcap: float | None = None  # scores soft-capped before the mask (Gemma 2)
    sinks: bool = False  # a learned per-head logit in every softmax's denominator (gpt-oss)

    def __post_init__(self) -> None:
        check_size(self.num_heads, "num_attention_heads")
        check_size(self.num_kv_heads, "num_key_value_heads")
        check_size(self.head_dim, "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.scale is None:
            object.__setattr__(self, "scale", self.head_dim**-0.5)

    @property
    def rope_dim(self) -> int:
        """The width RoPE rotates a part of (partial_rotary_factor): every head's E."""
        return self.head_dim


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention's widths (letters as in ``refllm/nn/latent_attention.py``)."""

    num_heads: int  # H
    q_lora_rank: int | None  # Q: the query's low-rank width; None: one plain q_proj
    kv_lora_rank: int  # C: the compressed key-value width, what the cache holds per token ...
    qk_nope_head_dim: int  # N: per-head key/query dims without RoPE
    qk_rope_head_dim: int  # P: ... with the RoPE key, shared by all heads
    v_head_dim: int  # U: per-head value dims
    scale: float  # of the scores (DeepSeek's YaRN scales it: refllm/families/deepseek.py)
    bias: bool = False  # on q_a_proj, kv_a_proj_with_mqa and o_proj
    rope_interleave: bool = True  # the checkpoint pairs RoPE dims (2i, 2i+1); refllm permutes them at load

    def __post_init__(self) -> None:
        check_size(self.num_heads, "num_attention_heads")
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_size(getattr(self, name), name)
        if self.q_lora_rank is not None:
            check_size(self.q_lora_rank, "q_lora_rank")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even (RoPE rotates pairs); got {self.qk_rope_head_dim}")

    @property
    def qk_head_dim(self) -> int:
        """N + P: a query's (and a decompressed key's) width per head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """C + P: what one token costs the cache per layer (one shared latent, not H keys and values)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def rope_dim(self) -> int:
        """The width RoPE rotates: the P RoPE dims of each query head and of the shared key."""
        return self.qk_rope_head_dim


@dataclass(frozen=True)
class GatedMLP:
    """The dense MLP, down(act(gate(x)) * up(x)) (``refllm/nn/mlp.py``)."""

    intermediate_size: int  # F
    activation: str = "silu"
    bias: bool = False  # on the gate, up and down projections

    def __post_init__(self) -> None:
        check_size(self.intermediate_size, "intermediate_size")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"unsupported activation {self.activation!r}; supported: {', '.join(ACTIVATIONS)}")
