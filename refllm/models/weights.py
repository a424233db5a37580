"""Weights by their Hugging Face names, checked against the config, quirks undone once.

``checkpoint_shapes(config)`` is the weight-name map: every tensor a checkpoint
of this architecture holds, with its shape. ``assemble`` reads them through a
``ModelSource``, refuses a checkpoint that disagrees, puts every float tensor in
the model's dtype, and splits Phi-3's fused projections (and fused experts,
``expert_weights.py``) so the forward pass sees one layout for every architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import MissingTensorError, WeightError
from refllm.models.deepseek_weights import (
    LatentAttentionWeights,
    deepseek_view,
    grouped_experts_shapes,
    grouped_experts_weights,
    latent_attention_shapes,
    latent_attention_weights,
)
from refllm.models.expert_weights import (
    expert_layout,
    sparse_layer_shapes,
    sparse_layer_weights,
)
from refllm.nn.mlp import MLPWeights


@dataclass
class LayerWeights:
    """One decoder layer. Projections are [out, in], as checkpoints store them.

    A sparse (mixture-of-experts) layer has ``router`` and ``experts`` instead of gate/up/down_proj.
    DeepSeek-V3's layers hold ``latent`` instead of q/k/v/o_proj (those fields are then None).
    """

    input_layernorm: np.ndarray | None  # [D]; None under post-norms (OLMo 2)
    post_attention_layernorm: np.ndarray  # [D]: Llama's pre-MLP norm; Gemma's and OLMo 2's after attention
    q_proj: np.ndarray  # [H*E, D]
    k_proj: np.ndarray  # [K*E, D]
    v_proj: np.ndarray  # [K*E, D]
    o_proj: np.ndarray  # [D, H*E]
    gate_proj: np.ndarray | None  # [F, D]
    up_proj: np.ndarray | None  # [F, D]
    down_proj: np.ndarray | None  # [D, F]
    q_proj_bias: np.ndarray | None = None
    k_proj_bias: np.ndarray | None = None
    v_proj_bias: np.ndarray | None = None
    o_proj_bias: np.ndarray | None = None
    gate_proj_bias: np.ndarray | None = None
    up_proj_bias: np.ndarray | None = None
    down_proj_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # [E], or [H*E] over the whole projection (OLMo 2)
    k_norm: np.ndarray | None = None  # [E], or [K*E]
    pre_feedforward_layernorm: np.ndarray | None = None  # [D], Gemma's sandwich norms
    post_feedforward_layernorm: np.ndarray | None = None  # [D], Gemma's and OLMo 2's
    sinks: np.ndarray | None = None  # [H], gpt-oss's attention sinks
    router: np.ndarray | None = None  # [X, D]
    router_bias: np.ndarray | None = None  # [X]
    experts: list[MLPWeights] | None = None
    latent: LatentAttentionWeights | None = None  # DeepSeek-V3's attention, in place of q/k/v/o_proj
    router_correction_bias: np.ndarray | None = None  # [X], DeepSeek-V3's e_score_correction_bias
    shared_experts: MLPWeights | None = None  # DeepSeek-V3's shared experts, one MLP every token runs


@dataclass
class ModelWeights:
    embed_tokens: np.ndarray  # [V, D]
    norm: np.ndarray  # [D]
    lm_head: np.ndarray  # [V, D]; the same array as embed_tokens when tied
    layers: list[LayerWeights]

    def nbytes(self) -> int:
        """Bytes of every weight, a tied embedding and LM head counted once."""
        return sum(weight_bytes_by_format(self).values())


def checkpoint_shapes(config: ModelConfig, layout: str | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name (Hugging Face spelling) of a checkpoint for ``config``, with its shape.

    layout: how a sparse layer's experts are stored (``expert_weights.py``); by default as the
    architecture's files on the Hub hold them."""
    D, F, V, E = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    H, K = config.num_attention_heads, config.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, D)
    for i in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        if config.latent_attention is not None:
            shapes |= latent_attention_shapes(config, i)
        else:
            shapes |= _attention_shapes(config, attn)
        if config.qk_norm:
            q_norm, k_norm = ((H * E,), (K * E,)) if config.qk_norm_whole else ((E,), (E,))
            shapes |= {attn + "q_norm.weight": q_norm, attn + "k_norm.weight": k_norm}
        if config.attention_sinks:
            shapes[attn + "sinks"] = (H,)
        if config.grouped_experts is not None and config.is_sparse(i):
            shapes |= grouped_experts_shapes(config, i)
        elif config.is_sparse(i):
            shapes |= sparse_layer_shapes(config, i, layout or expert_layout(config, ()))
        elif config.fused_gate_up:
            shapes[mlp + "gate_up_proj.weight"] = (2 * F, D)
        else:
            shapes |= {mlp + "gate_proj.weight": (F, D), mlp + "up_proj.weight": (F, D)}
        if not config.is_sparse(i):
            shapes[mlp + "down_proj.weight"] = (D, F)
        if config.mlp_bias:
            shapes |= {mlp + "gate_proj.bias": (F,), mlp + "up_proj.bias": (F,), mlp + "down_proj.bias": (D,)}
        norms = ["input_layernorm", "post_attention_layernorm"]
        if config.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        if config.post_norms:
            norms = ["post_attention_layernorm", "post_feedforward_layernorm"]
        for norm in norms:
            shapes[f"model.layers.{i}.{norm}.weight"] = (D,)
    return shapes


def _attention_shapes(config: ModelConfig, attn: str) -> dict[str, tuple[int, ...]]:
    """q/k/v/o projections (Phi-3's fused qkv) and their biases, names after ``attn``."""
    D, E, H, K = config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads
    if config.fused_qkv:
        shapes = {attn + "qkv_proj.weight": ((H + 2 * K) * E, D)}
    else:
        shapes = {attn + "q_proj.weight": (H * E, D), attn + "k_proj.weight": (K * E, D), attn + "v_proj.weight": (K * E, D)}
    shapes[attn + "o_proj.weight"] = (D, H * E)
    if config.qkv_bias:
        shapes |= {attn + "q_proj.bias": (H * E,), attn + "k_proj.bias": (K * E,), attn + "v_proj.bias": (K * E,)}
    if config.o_proj_bias:
        shapes[attn + "o_proj.bias"] = (D,)
    return shapes


# Tensors a checkpoint may carry that a text-only forward pass does not use.
_IGNORED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
# Wrappers around the language model in multimodal checkpoints (Gemma 3): old and new spellings.
_WRAPPERS = {"language_model.model.": "model.", "model.language_model.": "model.", "language_model.lm_head.": "lm_head."}


def canonical_name(name: str) -> str | None:
    """The Hugging Face text-model name of a checkpoint tensor, or None if it is not used."""
    if name.startswith(_IGNORED_PREFIXES) or name.endswith("rotary_emb.inv_freq"):
        return None
    for wrapper, plain in _WRAPPERS.items():
        if name.startswith(wrapper):
            return plain + name[len(wrapper) :]
    return name


def assemble(config: ModelConfig, source, dtype=np.float32) -> ModelWeights:
    """Read every tensor ``config`` calls for from ``source`` (a ModelSource), checking names and shapes.

    Float tensors come out in ``dtype``; a quantized matrix (a ``QuantizedTensor``) stays in its blocks.
    """
    source = deepseek_view(config, source)
    available = {}
    for stored in source.tensor_names():
        name = canonical_name(stored)
        if name is not None:
            available[name] = stored
    layout = expert_layout(config, available) if config.moe is not None else None
    expected = checkpoint_shapes(config, layout)
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = sorted(set(available) - set(expected) - optional)
    if unexpected:
        raise WeightError(
            f"unexpected tensor {available[unexpected[0]]!r} in {source.where(available[unexpected[0]])}"
            f" ({len(unexpected)} unexpected in all) for a {config.model_type} config"
        )
    tensors: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        if name not in available:
            raise MissingTensorError(f"tensor {name!r} (shape {shape}) is missing from {source.where(None)}")
        array = source.tensor(available[name])
        if tuple(array.shape) != shape:
            raise WeightError(
                f"tensor {available[name]!r} in {source.where(available[name])} has shape {tuple(array.shape)};"
                f" config.json implies {shape}"
            )
        tensors[name] = np.asarray(array, dtype) if isinstance(array, np.ndarray) else array
    return _from_tensors(config, tensors, layout)


def _from_tensors(config: ModelConfig, tensors: dict[str, np.ndarray], layout: str | None) -> ModelWeights:
    H, K, E, F = config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.intermediate_size
    layers = []
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."

        def get(suffix: str) -> np.ndarray | None:
            return tensors.get(prefix + suffix)

        if config.latent_attention is not None:
            q = k = v = None  # in ``latent``
        elif config.fused_qkv:
            # Phi-3: rows [q | k | v] of one projection; row slices are views, no copy.
            qkv = get("self_attn.qkv_proj.weight")
            q, k, v = qkv[: H * E], qkv[H * E : (H + K) * E], qkv[(H + K) * E :]
        else:
            q, k, v = get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight")
        if config.fused_gate_up:
            gate_up = get("mlp.gate_up_proj.weight")  # rows [gate | up]
            gate, up = gate_up[:F], gate_up[F:]
        else:
            gate, up = get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")
        router = router_bias = experts = correction_bias = shared_experts = None
        if config.grouped_experts is not None and config.is_sparse(i):
            router, correction_bias, experts, shared_experts = grouped_experts_weights(config, get)
        elif config.is_sparse(i):
            router, router_bias, experts = sparse_layer_weights(config, i, layout, tensors.get)
        layers.append(
            LayerWeights(
                input_layernorm=get("input_layernorm.weight"),
                post_attention_layernorm=get("post_attention_layernorm.weight"),
                q_proj=q,
                k_proj=k,
                v_proj=v,
                o_proj=get("self_attn.o_proj.weight"),
                gate_proj=gate,
                up_proj=up,
                down_proj=get("mlp.down_proj.weight"),
                q_proj_bias=get("self_attn.q_proj.bias"),
                k_proj_bias=get("self_attn.k_proj.bias"),
                v_proj_bias=get("self_attn.v_proj.bias"),
                o_proj_bias=get("self_attn.o_proj.bias"),
                gate_proj_bias=get("mlp.gate_proj.bias"),
                up_proj_bias=get("mlp.up_proj.bias"),
                down_proj_bias=get("mlp.down_proj.bias"),
                q_norm=get("self_attn.q_norm.weight"),
                k_norm=get("self_attn.k_norm.weight"),
                pre_feedforward_layernorm=get("pre_feedforward_layernorm.weight"),
                post_feedforward_layernorm=get("post_feedforward_layernorm.weight"),
                sinks=get("self_attn.sinks"),
                router=router,
                router_bias=router_bias,
                experts=experts,
                latent=latent_attention_weights(config, get) if config.latent_attention else None,
                router_correction_bias=correction_bias,
                shared_experts=shared_experts,
            )
        )
    embed = tensors["model.embed_tokens.weight"]
    lm_head = embed if config.tie_word_embeddings else tensors["lm_head.weight"]
    return ModelWeights(embed_tokens=embed, norm=tensors["model.norm.weight"], lm_head=lm_head, layers=layers)


def weight_format(array: Any) -> str:
    """GGML's name for how a weight is held: a quantized matrix's block format, else F32/F64/F16/BF16."""
    if not isinstance(array, np.ndarray):
        return array.format  # a QuantizedTensor
    return {"float32": "F32", "float64": "F64", "float16": "F16"}.get(array.dtype.name, array.dtype.name.upper())


def weight_leaves(weights: Any) -> list[Any]:
    """Every array (or QuantizedTensor) of a ModelWeights, or any dataclass of them, lists and tuples
    followed; an array reached twice (a tied embedding and LM head) is listed once."""
    seen: dict[int, Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, np.ndarray) or hasattr(value, "blocks"):  # an ndarray or a QuantizedTensor
            seen[id(value)] = value
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif is_dataclass(value):
            for field in fields(value):
                visit(getattr(value, field.name))

    visit(weights)
    return list(seen.values())


def weight_bytes_by_format(weights: Any) -> dict[str, int]:
    """Bytes of a model's weights (a ModelWeights, or any dataclass of arrays and lists of them) by format.

    An array reached twice (a tied embedding and LM head) counts once.
    """
    totals: dict[str, int] = {}
    for array in weight_leaves(weights):
        totals[weight_format(array)] = totals.get(weight_format(array), 0) + array.nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))
