"""Models with seeded random weights: for tests, notebooks and demos that need no download."""

from __future__ import annotations

import numpy as np

from refllm.config import ModelConfig
from refllm.models.contract import InMemorySource
from refllm.models.decoder import DecoderModel
from refllm.models.weights import checkpoint_shapes


def random_tensors(config: ModelConfig, seed: int = 0, std: float = 0.1) -> dict[str, np.ndarray]:
    """Every tensor a checkpoint of ``config`` holds, drawn from N(0, std); norm weights near 1."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in checkpoint_shapes(config).items():
        values = rng.normal(0.0, std, size=shape)
        if "norm" in name:
            # Gemma stores w - 1, others w: either way the applied scale is near 1.
            values = values + (1.0 - config.norms.weight_offset)
        tensors[name] = values.astype(np.float32)
    return tensors


def random_model(config: ModelConfig, seed: int = 0, std: float = 0.1) -> DecoderModel:
    return DecoderModel.load(InMemorySource(config, random_tensors(config, seed, std)))
