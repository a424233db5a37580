"""A model's weights, read through its family's tensor table: each tensor's shape checked, its values put by role.

The table (``refllm/families/tables.py``) lists every tensor a checkpoint of the
config holds, by its Hugging Face name, with its shape and its role: where its
values go here. ``assemble`` reads them through a ``ModelSource``, refuses a
checkpoint that disagrees, puts every float tensor in the model's dtype, splits
fused tensors (Phi-3's projections, stacked experts) and reorders those the
checkpoint lays out otherwise than the spec (interleaved RoPE rows), so the
forward pass sees one layout for every family:

    ModelWeights     embed_tokens [V, D], norm [D], lm_head [V, D] (the embedding itself when tied), layers
    LayerWeights     attention, mlp, and the norms its family places (refllm/recipe.py, NormPlacement):
                     attention_norm (before attention; in a parallel layer, before both sublayers),
                     attention_output_norm, mlp_norm (before the MLP), mlp_output_norm
    AttentionWeights q/k/v/o projections [out, in], their biases, q/k norm weights, sinks; or
    LatentAttentionWeights for DeepSeek-V3's latent attention
    MLPWeights       gate/up/down projections (refllm/nn/mlp.py); or SparseMLPWeights: a router and experts
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import MissingTensorError, WeightError
from refllm.families import checkpoint_layout, checkpoint_tensors
from refllm.nn.mlp import MLPWeights
from refllm.recipe import LatentAttention

Array = Any  # an np.ndarray, or a QuantizedTensor for a matrix kept in its blocks


@dataclass
class AttentionWeights:
    """One layer's grouped-query attention. Projections are [out, in], as checkpoints store them."""

    q_proj: Array  # [H*E, D]
    k_proj: Array  # [K*E, D]
    v_proj: Array  # [K*E, D]
    o_proj: Array  # [D, H*E]
    q_proj_bias: np.ndarray | None = None
    k_proj_bias: np.ndarray | None = None
    v_proj_bias: np.ndarray | None = None
    o_proj_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # [E] per head, [H, E] a weight per head, or [H*E] over the projection
    k_norm: np.ndarray | None = None  # [E], [K, E] or [K*E]
    sinks: np.ndarray | None = None  # [H], gpt-oss's attention sinks


@dataclass
class LatentAttentionWeights:
    """One layer's multi-head latent attention (DeepSeek-V3). Projections are [out, in]."""

    kv_a_proj_with_mqa: Array  # [C + P, D]
    kv_a_layernorm: np.ndarray  # [C]
    kv_b_proj: Array  # [H * (N + U), C]
    o_proj: Array  # [D, H * U]
    q_proj: Array | None = None  # [H * (N + P), D] when q_lora_rank is None
    q_a_proj: Array | None = None  # [Q, D]
    q_a_layernorm: np.ndarray | None = None  # [Q]
    q_b_proj: Array | None = None  # [H * (N + P), Q]
    q_a_proj_bias: np.ndarray | None = None  # attention_bias
    kv_a_proj_with_mqa_bias: np.ndarray | None = None
    o_proj_bias: np.ndarray | None = None


@dataclass
class SparseMLPWeights:
    """A sparse layer's mixture of experts: the router and each expert's gated MLP."""

    router: Array  # [X, D]
    experts: list[MLPWeights]
    router_bias: np.ndarray | None = None  # [X], gpt-oss
    correction_bias: np.ndarray | None = None  # [X], DeepSeek-V3's e_score_correction_bias
    shared: MLPWeights | None = None  # DeepSeek-V3's shared experts, one MLP every token runs


@dataclass
class LayerWeights:
    """One decoder layer: its attention, its MLP, and the norms its family places around them."""

    attention: AttentionWeights | LatentAttentionWeights
    mlp: MLPWeights | SparseMLPWeights
    attention_norm: np.ndarray | None = None  # [D] each
    attention_output_norm: np.ndarray | None = None
    mlp_norm: np.ndarray | None = None
    mlp_output_norm: np.ndarray | None = None


@dataclass
class ModelWeights:
    embed_tokens: Array  # [V, D]
    norm: np.ndarray  # [D]
    lm_head: Array  # [V, D]; the same array as embed_tokens when tied
    layers: list[LayerWeights] = field(default_factory=list)

    def nbytes(self) -> int:
        """Bytes of every weight, a tied embedding and LM head counted once."""
        return sum(weight_bytes_by_format(self).values())


def checkpoint_shapes(config: ModelConfig, layout: str | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name (Hugging Face spelling) of a checkpoint for ``config``, with its shape.

    layout: how a sparse layer's experts are stored (``refllm/families/experts.py``); by default as the
    family's files on the Hub hold them."""
    return {tensor.name: tensor.shape for tensor in checkpoint_tensors(config, layout)}


# Tensors a checkpoint may carry that the text model does not use: a vision tower and its connector
# (Gemma 3's, SmolVLM's), which refllm/models/multimodal.py reads.
_IGNORED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                     "model.vision_model.", "model.connector.")  # fmt: skip
# Wrappers around the language model in multimodal checkpoints (Gemma 3, SmolVLM): old and new spellings.
_WRAPPERS = {"language_model.model.": "model.", "model.language_model.": "model.", "language_model.lm_head.": "lm_head.",
             "model.text_model.": "model."}  # fmt: skip


def canonical_name(name: str) -> str | None:
    """The Hugging Face text-model name of a checkpoint tensor, or None if it is not used."""
    if name.startswith(_IGNORED_PREFIXES) or name.endswith("rotary_emb.inv_freq"):
        return None
    for wrapper, plain in _WRAPPERS.items():
        if name.startswith(wrapper):
            return plain + name[len(wrapper) :]
    return name


_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_LAYER_ROLE = re.compile(r"layers\.(\d+)\.")


def assemble(config: ModelConfig, source, dtype=np.float32) -> ModelWeights:
    """Read every tensor ``config``'s table calls for from ``source`` (a ModelSource), checking names and shapes.

    Float tensors come out in ``dtype``; a quantized matrix (a ``QuantizedTensor``) stays in its blocks.
    """
    available = {}
    unused = range(config.num_hidden_layers, config.num_hidden_layers + config.unused_layers)
    for stored in source.tensor_names():
        name = canonical_name(stored)
        if name is not None and not ((layer := _LAYER.match(name)) and int(layer.group(1)) in unused):
            available[name] = stored
    table = checkpoint_tensors(config, checkpoint_layout(config, available))
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = sorted(set(available) - {tensor.name for tensor in table} - optional)
    if unexpected:
        raise WeightError(
            f"unexpected tensor {available[unexpected[0]]!r} in {source.where(available[unexpected[0]])}"
            f" ({len(unexpected)} unexpected in all) for a {config.model_type} config"
        )
    by_role: dict[str, Array] = {}
    for tensor in table:
        if tensor.name not in available:
            raise MissingTensorError(
                f"tensor {tensor.name!r} (shape {tensor.shape}) is missing from {source.where(None)}"
            )
        array = source.tensor(available[tensor.name])
        if tuple(array.shape) != tensor.shape:
            raise WeightError(
                f"tensor {available[tensor.name]!r} in {source.where(available[tensor.name])} has shape"
                f" {tuple(array.shape)}; config.json implies {tensor.shape}"
            )
        array = np.asarray(array, dtype) if isinstance(array, np.ndarray) else array
        by_role |= zip(tensor.roles, (array,) if tensor.split is None else tensor.split(array), strict=True)
    return _model_weights(config, by_role)


def _model_weights(config: ModelConfig, by_role: dict[str, Array]) -> ModelWeights:
    """The weights dataclasses, from the values by role (``refllm/families/tables.py``)."""
    per_layer: list[dict[str, Array]] = [{} for _ in range(config.num_hidden_layers)]
    for role, value in by_role.items():
        if (layer := _LAYER_ROLE.match(role)) is not None:
            per_layer[int(layer.group(1))][role[layer.end() :]] = value
    attention_weights = LatentAttentionWeights if isinstance(config.attention, LatentAttention) else AttentionWeights
    layers = []
    for roles in per_layer:
        mlp_roles = _under(roles, "mlp.")
        if "router" in mlp_roles:
            experts = [MLPWeights(**_under(mlp_roles, f"experts.{e}.")) for e in range(config.experts.num_experts)]
            shared = _under(mlp_roles, "shared.")
            mlp = SparseMLPWeights(
                router=mlp_roles["router"],
                experts=experts,
                router_bias=mlp_roles.get("router_bias"),
                correction_bias=mlp_roles.get("correction_bias"),
                shared=MLPWeights(**shared) if shared else None,
            )
        else:
            mlp = MLPWeights(**mlp_roles)
        norms = {role: value for role, value in roles.items() if "." not in role}
        layers.append(LayerWeights(attention_weights(**_under(roles, "attention.")), mlp, **norms))
    embed = by_role["embed_tokens"]
    lm_head = embed if config.tie_word_embeddings else by_role["lm_head"]
    return ModelWeights(embed_tokens=embed, norm=by_role["norm"], lm_head=lm_head, layers=layers)


def _under(roles: dict[str, Array], prefix: str) -> dict[str, Array]:
    """The roles that start with ``prefix``, without it (``attention.q_proj`` -> ``q_proj``)."""
    return {role[len(prefix) :]: value for role, value in roles.items() if role.startswith(prefix)}


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
            for part in fields(value):
                visit(getattr(value, part.name))

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
