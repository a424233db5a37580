"""DeepSeek-V3's weights: latent attention and grouped experts, by their Hugging Face names.

The official checkpoints (and transformers' ``save_pretrained``) store every
expert apart, ``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight``; a
transformers model's own state dict fuses them into 3-D tensors
(``mlp.experts.gate_up_proj`` [X, 2F, D], ``mlp.experts.down_proj`` [X, D, F]).
``deepseek_view`` reads the second layout as the first, so one name map serves
both, and hides the multi-token-prediction layers the official checkpoints hold
past the last layer (``num_nextn_predict_layers``; plain decoding never runs them).

RoPE dims arrive interleaved (pairs 2i, 2i+1) when ``rope_interleave`` is set;
the rows that make q_rope and k_rope are permuted once here to the rotate-half
layout of ``refllm/nn/rope.py`` (a common permutation of q and k leaves q.k as
it was).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.config import ModelConfig
from refllm.nn.mlp import MLPWeights


@dataclass
class LatentAttentionWeights:
    """One layer's multi-head latent attention. Projections are [out, in]."""

    kv_a_proj_with_mqa: np.ndarray  # [C + P, D]
    kv_a_layernorm: np.ndarray  # [C]
    kv_b_proj: np.ndarray  # [H * (N + U), C]
    o_proj: np.ndarray  # [D, H * U]
    q_proj: np.ndarray | None = None  # [H * (N + P), D] when q_lora_rank is None
    q_a_proj: np.ndarray | None = None  # [Q, D]
    q_a_layernorm: np.ndarray | None = None  # [Q]
    q_b_proj: np.ndarray | None = None  # [H * (N + P), Q]
    q_a_proj_bias: np.ndarray | None = None  # attention_bias
    kv_a_proj_with_mqa_bias: np.ndarray | None = None
    o_proj_bias: np.ndarray | None = None


def latent_attention_shapes(config: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    D, H, latent = config.hidden_size, config.num_attention_heads, config.latent_attention
    Q, C = latent.q_lora_rank, latent.kv_lora_rank
    attn = f"model.layers.{layer}.self_attn."
    shapes: dict[str, tuple[int, ...]] = {}
    if Q is None:
        shapes[attn + "q_proj.weight"] = (H * latent.qk_head_dim, D)
    else:
        shapes |= {attn + "q_a_proj.weight": (Q, D), attn + "q_a_layernorm.weight": (Q,)}
        shapes[attn + "q_b_proj.weight"] = (H * latent.qk_head_dim, Q)
    shapes |= {
        attn + "kv_a_proj_with_mqa.weight": (latent.cache_width, D),
        attn + "kv_a_layernorm.weight": (C,),
        attn + "kv_b_proj.weight": (H * (latent.qk_nope_head_dim + latent.v_head_dim), C),
        attn + "o_proj.weight": (D, H * latent.v_head_dim),
    }
    if config.qkv_bias:
        shapes |= {attn + "kv_a_proj_with_mqa.bias": (latent.cache_width,), attn + "o_proj.bias": (D,)}
        if Q is not None:
            shapes[attn + "q_a_proj.bias"] = (Q,)
    return shapes


def grouped_experts_shapes(config: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    D, experts = config.hidden_size, config.grouped_experts
    F, X = experts.expert_intermediate_size, experts.num_experts
    mlp = f"model.layers.{layer}.mlp."
    shapes: dict[str, tuple[int, ...]] = {mlp + "gate.weight": (X, D), mlp + "gate.e_score_correction_bias": (X,)}
    for e in range(X):
        shapes |= _mlp_shapes(f"{mlp}experts.{e}.", D, F)
    if experts.num_shared_experts:
        shapes |= _mlp_shapes(mlp + "shared_experts.", D, F * experts.num_shared_experts)
    return shapes


def _mlp_shapes(prefix: str, D: int, F: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (F, D), prefix + "up_proj.weight": (F, D), prefix + "down_proj.weight": (D, F)}


def latent_attention_weights(config: ModelConfig, get: Callable[[str], np.ndarray | None]) -> LatentAttentionWeights:
    """``get``: a layer's tensor by its name after ``model.layers.{i}.``, or None."""
    latent, H = config.latent_attention, config.num_attention_heads
    q_rows = _rope_rows(latent.qk_head_dim, latent.qk_rope_head_dim, H, latent.rope_interleave)
    kv_rows = _rope_rows(latent.cache_width, latent.qk_rope_head_dim, 1, latent.rope_interleave)
    q_proj, q_b_proj = get("self_attn.q_proj.weight"), get("self_attn.q_b_proj.weight")
    kv_a, kv_a_bias = get("self_attn.kv_a_proj_with_mqa.weight"), get("self_attn.kv_a_proj_with_mqa.bias")
    return LatentAttentionWeights(
        kv_a_proj_with_mqa=kv_a[kv_rows],
        kv_a_layernorm=get("self_attn.kv_a_layernorm.weight"),
        kv_b_proj=get("self_attn.kv_b_proj.weight"),
        o_proj=get("self_attn.o_proj.weight"),
        q_proj=None if q_proj is None else q_proj[q_rows],
        q_a_proj=get("self_attn.q_a_proj.weight"),
        q_a_layernorm=get("self_attn.q_a_layernorm.weight"),
        q_b_proj=None if q_b_proj is None else q_b_proj[q_rows],
        q_a_proj_bias=get("self_attn.q_a_proj.bias"),
        kv_a_proj_with_mqa_bias=None if kv_a_bias is None else kv_a_bias[kv_rows],
        o_proj_bias=get("self_attn.o_proj.bias"),
    )


def _rope_rows(width: int, rope_dim: int, heads: int, interleaved: bool) -> np.ndarray:
    """Row order that turns each block of ``width`` rows, its last ``rope_dim`` interleaved, into rotate-half."""
    within = np.arange(width)
    if interleaved:
        start = width - rope_dim
        within[start:] = start + np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
    return (np.arange(heads)[:, None] * width + within).ravel()


def grouped_experts_weights(
    config: ModelConfig, get: Callable[[str], np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray, list[MLPWeights], MLPWeights | None]:
    """-> (router [X, D], its correction bias [X], the routed experts, the shared experts as one MLP
    of S x moe_intermediate_size, or None) of a sparse layer; ``get`` as for ``latent_attention_weights``."""

    def expert(prefix: str) -> MLPWeights:
        return MLPWeights(*(get(f"{prefix}{name}_proj.weight") for name in ("gate", "up", "down")))

    experts = [expert(f"mlp.experts.{e}.") for e in range(config.grouped_experts.num_experts)]
    shared = expert("mlp.shared_experts.") if config.grouped_experts.num_shared_experts else None
    return get("mlp.gate.weight"), get("mlp.gate.e_score_correction_bias"), experts, shared


_FUSED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


class _DeepseekView:
    """A ModelSource that shows fused 3-D expert tensors as the per-expert tensors they hold, and hides
    the tensors of layers past ``num_layers`` (the multi-token-prediction module)."""

    def __init__(self, source, fused: dict[str, str], num_layers: int):
        self._source = source
        self._fused = fused  # fused name -> its prefix, "model.layers.{i}.mlp.experts."
        self._num_layers = num_layers
        self._parts: dict[str, tuple[str, int, slice]] = {}  # per-expert name -> (fused name, expert, rows)
        for name, prefix in fused.items():
            stacked_shape = source.tensor(name).shape  # [X, 2F, D] or [X, D, F]
            for e in range(stacked_shape[0]):
                if name.endswith("gate_up_proj"):
                    half = stacked_shape[1] // 2
                    self._parts[f"{prefix}{e}.gate_proj.weight"] = (name, e, slice(0, half))
                    self._parts[f"{prefix}{e}.up_proj.weight"] = (name, e, slice(half, None))
                else:
                    self._parts[f"{prefix}{e}.down_proj.weight"] = (name, e, slice(None))

    def __getattr__(self, name):
        return getattr(self._source, name)

    def tensor_names(self) -> list[str]:
        names = [n for n in self._source.tensor_names() if n not in self._fused] + list(self._parts)
        return [n for n in names if not ((layer := _LAYER.match(n)) and int(layer.group(1)) >= self._num_layers)]

    def tensor(self, name: str):
        if name not in self._parts:
            return self._source.tensor(name)
        fused, expert, rows = self._parts[name]
        return self._source.tensor(fused)[expert, rows]

    def where(self, name: str | None) -> str:
        return self._source.where(self._parts[name][0] if name in self._parts else name)


def deepseek_view(config: ModelConfig, source):
    """``source`` itself, or for DeepSeek-V3 a view of it with fused expert tensors split per expert
    and its unused layers hidden."""
    if config.grouped_experts is None and not config.unused_layers:
        return source
    fused = {name: match.group(1) for name in source.tensor_names() if (match := _FUSED.match(name))}
    return _DeepseekView(source, fused, config.num_hidden_layers)
