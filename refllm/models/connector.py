"""From vision-tower features to text-model embeddings: each family's connector.

    idefics3 (SmolVLM)  features [N, S*S, Dv] -> pixel shuffle by s -> [N, (S/s)^2, s*s*Dv]
                        -> proj (no bias) -> [N, (S/s)^2, D]
    gemma3              features [N, S*S, Dv] -> average pool s x s -> [N, (S/s)^2, Dv]
                        -> RMSNorm, Gemma's (1 + w) form (the soft-embedding norm) -> @ W [Dv, D]

Gemma 3 stores its projection as [Dv, D], the transpose of a linear layer's weight; it
is kept as stored and applied as ``x @ W``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refllm.families.vision import MultimodalConfig
from refllm.models.ops import OpSet
from refllm.models.vision_tower import read_checked
from refllm.nn.image_tokens import average_pool, pixel_shuffle


@dataclass
class ConnectorWeights:
    projection: np.ndarray  # idefics3: [D, s*s*Dv] (a linear weight); gemma3: [Dv, D] (applied as x @ W)
    norm: np.ndarray | None = None  # gemma3's mm_soft_emb_norm: [Dv], stored as w - 1


def connector_shapes(config: MultimodalConfig) -> dict[str, tuple[int, ...]]:
    """The connector's tensors (names after its prefix) and their shapes."""
    Dv, D = config.vision.hidden_size, config.text_hidden_size
    if config.model_type == "idefics3":
        return {"modality_projection.proj.weight": (D, config.scale**2 * Dv)}
    return {"mm_input_projection_weight": (Dv, D), "mm_soft_emb_norm.weight": (Dv,)}


def load_connector(source, config: MultimodalConfig, prefix: str, dtype: np.dtype) -> ConnectorWeights:
    t = read_checked(source, connector_shapes(config), prefix, dtype)
    if config.model_type == "idefics3":
        return ConnectorWeights(t["modality_projection.proj.weight"])
    return ConnectorWeights(t["mm_input_projection_weight"], t["mm_soft_emb_norm.weight"])


def connect(features: np.ndarray, w: ConnectorWeights, config: MultimodalConfig, ops: OpSet) -> np.ndarray:
    """features: [N, S*S, Dv] -> image tokens [N, (S/s)^2, D], in the text model's width."""
    with ops.running():
        if config.model_type == "idefics3":
            return ops.linear(pixel_shuffle(features, config.scale), w.projection)
        pooled = average_pool(features, config.scale)  # [N, (S/s)^2, Dv]
        normed = ops.rms_norm(pooled, w.norm, config.vision.layer_norm_eps, 1.0)
        return normed @ w.projection
