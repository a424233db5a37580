"""The SigLIP vision tower: pixels to one feature per patch, as SmolVLM and Gemma 3 run it.

    pixels [N, C, H, W] -> patch embedding (nn/patches.py) + position embedding
        -> for each layer:  LayerNorm -> q, k, v -> attention among all patches -> out_proj -> residual
                            LayerNorm -> fc1 -> GELU (tanh form) -> fc2 -> residual
        -> post LayerNorm -> features [N, P, Dv]

A pre-norm encoder with biases everywhere and no causal mask: every patch sees every
other (``nn.attention.bidirectional_attention``). The projections run through the op set
(the spec's ``linear``, or its kernel twin); the rest is the spec alone, the norms and
the attention of a few hundred patches costing little beside the matrix products.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refllm.families.vision import VisionConfig
from refllm.errors import MissingTensorError, WeightError
from refllm.models.ops import OpSet
from refllm.nn.attention import bidirectional_attention
from refllm.nn.mlp import gelu_tanh
from refllm.nn.norm import layer_norm
from refllm.nn.patches import patch_embedding, position_embedding


@dataclass
class EncoderLayerWeights:
    """One SigLIP layer, named as the checkpoints name it (under ``encoder.layers.{i}.``)."""

    layer_norm1_weight: np.ndarray  # [Dv]
    layer_norm1_bias: np.ndarray
    q_proj: np.ndarray  # [Dv, Dv]
    q_proj_bias: np.ndarray  # [Dv]
    k_proj: np.ndarray
    k_proj_bias: np.ndarray
    v_proj: np.ndarray
    v_proj_bias: np.ndarray
    out_proj: np.ndarray
    out_proj_bias: np.ndarray
    layer_norm2_weight: np.ndarray
    layer_norm2_bias: np.ndarray
    fc1: np.ndarray  # [Fv, Dv]
    fc1_bias: np.ndarray  # [Fv]
    fc2: np.ndarray  # [Dv, Fv]
    fc2_bias: np.ndarray  # [Dv]


@dataclass
class VisionTowerWeights:
    patch_embedding: np.ndarray  # [Dv, C, Z, Z], a convolution's kernel
    patch_embedding_bias: np.ndarray  # [Dv]
    position_embedding: np.ndarray  # [S * S, Dv]
    layers: list[EncoderLayerWeights]
    post_layernorm_weight: np.ndarray  # [Dv]
    post_layernorm_bias: np.ndarray


def vision_tower_shapes(config: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a SigLIP tower (names after the tower's prefix, e.g. ``model.vision_model.``)."""
    D, F, Z = config.hidden_size, config.intermediate_size, config.patch_size
    shapes = {
        "embeddings.patch_embedding.weight": (D, config.num_channels, Z, Z),
        "embeddings.patch_embedding.bias": (D,),
        "embeddings.position_embedding.weight": (config.grid_side**2, D),
        "post_layernorm.weight": (D,),
        "post_layernorm.bias": (D,),
    }
    for i in range(config.num_hidden_layers):
        layer = f"encoder.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= {f"{layer}self_attn.{name}.weight": (D, D), f"{layer}self_attn.{name}.bias": (D,)}
        for norm in ("layer_norm1", "layer_norm2"):
            shapes |= {f"{layer}{norm}.weight": (D,), f"{layer}{norm}.bias": (D,)}
        shapes |= {f"{layer}mlp.fc1.weight": (F, D), f"{layer}mlp.fc1.bias": (F,)}
        shapes |= {f"{layer}mlp.fc2.weight": (D, F), f"{layer}mlp.fc2.bias": (D,)}
    return shapes


def read_checked(source, names: dict[str, tuple[int, ...]], prefix: str, dtype: np.dtype) -> dict[str, np.ndarray]:
    """The tensors ``prefix + name`` of ``source`` (a ModelSource), each of its shape, in ``dtype``."""
    available = set(source.tensor_names())
    tensors = {}
    for name, shape in names.items():
        if prefix + name not in available:
            raise MissingTensorError(f"tensor {prefix + name!r} (shape {shape}) is missing from {source.where(None)}")
        array = source.tensor(prefix + name)
        if not isinstance(array, np.ndarray) or tuple(array.shape) != shape:
            raise WeightError(
                f"tensor {prefix + name!r} in {source.where(prefix + name)} has shape"
                f" {tuple(getattr(array, 'shape', ()))}; config.json implies {shape}"
            )
        tensors[name] = np.asarray(array, dtype)
    return tensors


def load_vision_tower(source, config: VisionConfig, prefix: str, dtype: np.dtype) -> VisionTowerWeights:
    t = read_checked(source, vision_tower_shapes(config), prefix, dtype)
    layers = []
    for i in range(config.num_hidden_layers):
        p = f"encoder.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(
            EncoderLayerWeights(
                t[p + "layer_norm1.weight"], t[p + "layer_norm1.bias"],
                t[a + "q_proj.weight"], t[a + "q_proj.bias"], t[a + "k_proj.weight"], t[a + "k_proj.bias"],
                t[a + "v_proj.weight"], t[a + "v_proj.bias"], t[a + "out_proj.weight"], t[a + "out_proj.bias"],
                t[p + "layer_norm2.weight"], t[p + "layer_norm2.bias"],
                t[m + "fc1.weight"], t[m + "fc1.bias"], t[m + "fc2.weight"], t[m + "fc2.bias"],
            )  # fmt: skip
        )
    return VisionTowerWeights(
        t["embeddings.patch_embedding.weight"], t["embeddings.patch_embedding.bias"],
        t["embeddings.position_embedding.weight"], layers, t["post_layernorm.weight"], t["post_layernorm.bias"],
    )  # fmt: skip


def vision_tower(
    pixels: np.ndarray, w: VisionTowerWeights, config: VisionConfig, ops: OpSet, patch_mask: np.ndarray | None = None
) -> np.ndarray:
    """pixels: [N, C, H, W] (H, W multiples of the patch size), patch_mask: [N, H/Z, W/Z] bool (True where a
    patch holds image content; None: all do) -> features [N, P, Dv] after the post-LayerNorm."""
    N, _, H, W = pixels.shape
    Z, heads, eps = config.patch_size, config.num_attention_heads, config.layer_norm_eps
    if patch_mask is None:
        patch_mask = np.ones((N, H // Z, W // Z), dtype=bool)
    x = patch_embedding(pixels, w.patch_embedding, w.patch_embedding_bias)  # [N, P, Dv]
    x = x + position_embedding(patch_mask, w.position_embedding)
    key_mask = patch_mask.reshape(N, -1)
    with ops.running():
        for layer in w.layers:
            x = x + _self_attention(layer, layer_norm(x, layer.layer_norm1_weight, layer.layer_norm1_bias, eps), heads,
                                    key_mask, ops)  # fmt: skip
            h = layer_norm(x, layer.layer_norm2_weight, layer.layer_norm2_bias, eps)
            x = x + ops.linear(gelu_tanh(ops.linear(h, layer.fc1, layer.fc1_bias)), layer.fc2, layer.fc2_bias)
    return layer_norm(x, w.post_layernorm_weight, w.post_layernorm_bias, eps)


def _self_attention(layer: EncoderLayerWeights, h: np.ndarray, heads: int, key_mask: np.ndarray, ops: OpSet):
    """h: [N, P, Dv] (normed) -> [N, P, Dv]: multi-head attention among all patches of each image."""
    N, P, D = h.shape
    E = D // heads
    q = ops.linear(h, layer.q_proj, layer.q_proj_bias).reshape(N, P, heads, E)
    k = ops.linear(h, layer.k_proj, layer.k_proj_bias).reshape(N, P, heads, E)
    v = ops.linear(h, layer.v_proj, layer.v_proj_bias).reshape(N, P, heads, E)
    out = bidirectional_attention(q, k, v, E**-0.5, key_mask)  # [N, P, H, E]
    return ops.linear(out.reshape(N, P, D), layer.out_proj, layer.out_proj_bias)
