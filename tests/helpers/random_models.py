"""Tiny random models of every architecture the oracle kit knows, built once per process, and the logits of
one uncached spec run that what runs over them is checked against."""

from __future__ import annotations

import numpy as np

from refllm import CacheConfig
from refllm.config import ModelConfig
from refllm.models.random import random_model
from refllm.testing.configs import tiny_config_json

CLOSE = dict(rtol=1e-5, atol=1e-5)  # the same arithmetic on other row groupings: float32 rounding
_MODELS = {}


def tiny_config(model_type: str, sliding_window: int | None = None) -> ModelConfig:
    return ModelConfig.from_hf(tiny_config_json(model_type, sliding_window or 5))


def model_for(arch: str):
    """The tiny random model of ``arch`` (seed 7), built once and shared by every test of the process."""
    if arch not in _MODELS:
        _MODELS[arch] = random_model(tiny_config(arch), seed=7)
    return _MODELS[arch]


def fresh_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits after the last of ``tokens``, from one uncached spec run: the oracle."""
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    return model.prefill(np.array([tokens]), cache, range(len(tokens)))[0]
