"""Cohere's Command-R: config.json to ``ModelConfig`` fields and its tensors. A parallel-residual family.

    x -> embed -> for each layer:
             h = layer_norm(x)                                  LayerNorm without a bias
             x = x + attention(h) + mlp(h)                      both sublayers read the same normed h
      -> layer_norm -> LM head -> logits * logit_scale

Attention is grouped-query, with an optional q/k LayerNorm (``use_qk_norm``) whose
weight is [H, E] ([K, E] for keys): each head normed over its own E dims with its
own row. The MLP is Llama's (SwiGLU). One ``input_layernorm`` per layer, no other.

Cohere's RoPE is interleaved: it rotates dims (2i, 2i + 1) of each head together,
where the spec (``refllm/nn/rope.py``) rotates (i, i + E/2). The rows of the q and k
projections (and their biases and q/k norm weights) are reordered once, at load,
into rotate-half; the same order for queries and keys leaves q.k as it was.
"""

from __future__ import annotations

from typing import Any

from refllm.config_checks import check_number
from refllm.errors import ConfigError
from refllm.families.family import Architecture
from refllm.families.keys import HFKeys, common_fields, gated_mlp, grouped_query_attention, single_rope
from refllm.families.tables import Tensor, attention_tensors, dense_mlp_tensors, norm_tensors, one, rotate_half_rows
from refllm.recipe import NormKind, NormPlacement, Norms, QKNorm
from refllm.rope_parameters import FULL_ATTENTION

COHERE_LOGIT_SCALE = 0.0625  # transformers' CohereConfig default
COHERE_LAYER_NORM_EPS = 1e-5
COHERE_ROPE_THETA = 500_000.0  # transformers 5's CohereConfig default, when config.json names none


def read_cohere(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    qk_norm = keys.get("use_qk_norm", False)
    if not isinstance(qk_norm, bool):
        raise ConfigError(f"use_qk_norm must be true or false; got {qk_norm!r:.60}")
    bias = bool(keys.get("attention_bias", False))
    eps = keys.get("layer_norm_eps", COHERE_LAYER_NORM_EPS)
    return dict(
        **common,
        attention=grouped_query_attention(
            keys, bias=bias, output_bias=bias, qk_norm=QKNorm.PER_HEAD if qk_norm else QKNorm.NONE
        ),
        mlp=gated_mlp(keys),
        norms=Norms(NormPlacement.PARALLEL, NormKind.LAYER, eps),
        rope={FULL_ATTENTION: single_rope(keys, COHERE_ROPE_THETA)},
        logit_scale=check_number(keys.get("logit_scale", COHERE_LOGIT_SCALE), "logit_scale", positive=True),
    )


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    """Llama's names, one norm per layer, q/k norm weights [H, E] and [K, E]; the RoPE rows made rotate-half."""
    a = c.attention
    H, K, E = a.num_heads, a.num_kv_heads, a.head_dim
    rows = {"q": rotate_half_rows(E, E, H), "k": rotate_half_rows(E, E, K)}  # rows of [heads * E, ...]
    within = rotate_half_rows(E, E, 1)  # the columns of a [heads, E] norm weight

    def rotate_half(tensor: Tensor) -> Tensor:
        name = tensor.name.removeprefix("self_attn.")
        if name.startswith(("q_proj.", "k_proj.")):
            order = rows[name[0]]
            return one(tensor.name, tensor.shape, tensor.roles[0], lambda weights: weights[order])
        if name.startswith(("q_norm.", "k_norm.")):
            return one(tensor.name, tensor.shape, tensor.roles[0], lambda weights: weights[:, within])
        return tensor

    attention = [rotate_half(tensor) for tensor in attention_tensors(c, ((H, E), (K, E)))]
    return attention + dense_mlp_tensors(c) + norm_tensors(c, {"input_layernorm": "attention_norm"})


ARCHITECTURES = (
    Architecture(
        "cohere",
        read_cohere,
        layer_tensors,
        "CohereForCausalLM",
        tiny_config=dict(use_qk_norm=True, logit_scale=0.5),
        drawn_keys=dict(use_qk_norm=(False, True), logit_scale=(0.0625, 1.0), attention_bias=(False, True)),
    ),
)
