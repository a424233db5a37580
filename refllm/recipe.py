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

from refllm.config_checks import FINITE, OPTIONAL_POSITIVE, POSITIVE, SIZE, Bound, check_bounds
from refllm.errors import ConfigError

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # config.json's hidden_act; the functions: refllm/nn/mlp.py

# What each part's fields may hold (``refllm/config_checks.py``), named by their config.json keys.
NORMS_BOUNDS = {"eps": Bound(float, 0, 1, above=True), "weight_offset": FINITE}
ATTENTION_BOUNDS = {
    "num_heads": SIZE,
    "num_kv_heads": SIZE,
    "head_dim": SIZE,
    "scale": OPTIONAL_POSITIVE,  # None: head_dim ** -0.5
    "softcap": OPTIONAL_POSITIVE,
}
_ATTENTION_KEYS = {
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "scale": "attention scale",
    "softcap": "attn_logit_softcapping",
}  # fmt: skip
LATENT_BOUNDS = {
    "num_heads": SIZE,
    "q_lora_rank": Bound(int, 1, SIZE.high, optional=True),  # None: one plain q_proj
    "kv_lora_rank": SIZE,
    "qk_nope_head_dim": SIZE,
    "qk_rope_head_dim": SIZE,
    "v_head_dim": SIZE,
    "scale": POSITIVE,
}
MLP_BOUNDS = {"intermediate_size": SIZE}


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
        eps_key = "rms_norm_eps" if self.kind is NormKind.RMS else "layer_norm_eps"
        check_bounds(self, NORMS_BOUNDS, keys={"eps": eps_key})


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
        check_bounds(self, ATTENTION_BOUNDS, keys=_ATTENTION_KEYS)
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
        check_bounds(self, LATENT_BOUNDS, keys={"num_heads": "num_attention_heads", "scale": "attention scale"})
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
        check_bounds(self, MLP_BOUNDS)
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"unsupported activation {self.activation!r}; supported: {', '.join(ACTIVATIONS)}")
