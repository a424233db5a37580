"""From vision-tower features to text-model embeddings: the connector its family names
(``ImageConnector``, refllm/families/vision.py), made into a block once, at load.

    PIXEL_SHUFFLE  features [N, S*S, Dv] -> pixel shuffle by s -> [N, (S/s)^2, s*s*Dv]
                   -> proj (no bias) -> [N, (S/s)^2, D]
    POOLED         features [N, S*S, Dv] -> average pool s x s -> [N, (S/s)^2, Dv]
                   -> RMSNorm in the (1 + w) form (the soft-embedding norm) -> @ W [Dv, D]

The pooled connector's projection is stored [Dv, D], the transpose of a linear layer's
weight; it is kept as stored and applied as ``x @ W``.
"""

from __future__ import annotations

import numpy as np

from refllm.families.vision import ImageConnector, MultimodalConfig
from refllm.models.ops import OpSet
from refllm.models.vision_tower import read_checked
from refllm.nn.image_tokens import average_pool, pixel_shuffle


class PixelShuffleConnector:
    """s x s patches stacked side by side, then projected: projection [D, s*s*Dv], a linear weight."""

    def __init__(self, tensors: dict[str, np.ndarray], config: MultimodalConfig, ops: OpSet):
        self.projection, self.scale, self.ops = tensors["modality_projection.proj.weight"], config.scale, ops

    def __call__(self, features: np.ndarray) -> np.ndarray:
        with self.ops.running():
            return self.ops.linear(pixel_shuffle(features, self.scale), self.projection)


class PooledConnector:
    """s x s patches averaged, RMS-normed (norm [Dv], stored as w - 1), then ``x @ W``, W [Dv, D]."""

    def __init__(self, tensors: dict[str, np.ndarray], config: MultimodalConfig, ops: OpSet):
        self.projection, self.norm = tensors["mm_input_projection_weight"], tensors["mm_soft_emb_norm.weight"]
        self.scale, self.eps, self.ops = config.scale, config.vision.layer_norm_eps, ops

    def __call__(self, features: np.ndarray) -> np.ndarray:
        with self.ops.running():
            pooled = average_pool(features, self.scale)  # [N, (S/s)^2, Dv]
            return self.ops.rms_norm(pooled, self.norm, self.eps, 1.0) @ self.projection


CONNECTORS = {ImageConnector.PIXEL_SHUFFLE: PixelShuffleConnector, ImageConnector.POOLED: PooledConnector}


def connector_shapes(config: MultimodalConfig) -> dict[str, tuple[int, ...]]:
    """The connector's tensors (names after its prefix) and their shapes."""
    Dv, D = config.vision.hidden_size, config.text_hidden_size
    if config.connector is ImageConnector.PIXEL_SHUFFLE:
        return {"modality_projection.proj.weight": (D, config.scale**2 * Dv)}
    return {"mm_input_projection_weight": (Dv, D), "mm_soft_emb_norm.weight": (Dv,)}


def load_connector(source, config: MultimodalConfig, prefix: str, dtype: np.dtype) -> dict[str, np.ndarray]:
    """The connector's tensors, names and shapes checked (names after ``prefix``)."""
    return read_checked(source, connector_shapes(config), prefix, dtype)


def connector_block(tensors: dict[str, np.ndarray], config: MultimodalConfig, ops: OpSet):
    """features [N, S*S, Dv] -> image tokens [N, (S/s)^2, D]: the family's connector over its tensors."""
    return CONNECTORS[config.connector](tensors, config, ops)
