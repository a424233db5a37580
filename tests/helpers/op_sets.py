"""Comparing the op sets (refllm/models/ops.py): the spec and its kernel twins, within float32 rounding.

Each path's error against the float64 truth is rounding of the same operations in another order, so
two float32 paths may differ by ``ROUNDING_MULTIPLE`` times the spec's own error against truth, never
less than ``ULP_FLOOR``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from refllm.config import ModelConfig
from refllm.io.safetensors import HFDirectorySource
from refllm.kv import CacheConfig
from refllm.models.contract import InMemorySource
from refllm.models.decoder import DecoderModel
from refllm.models.ops import fast_ops
from refllm.models.random import random_tensors
from tests.helpers.paths import HF_DATA

# How many times the float32 spec's own error against truth two float32 evaluations of the same
# operations may differ by: each is within the spec's error of truth (x2), and the kernels' sums
# in other orders carry up to twice the rounding of NumPy's pairwise ones (x2). An error in the
# math (a bias dropped, a wrong rotation) is orders of magnitude past it.
ROUNDING_MULTIPLE = 4.0
# A floor for cases whose float32 spec happens to match truth almost exactly: 16 float32 ulps.
ULP_FLOOR = 16 * 2.0**-24


def random_weights_model(
    name: str, dtype: str = "float32", reference: bool | None = None, seed: int = 0
) -> DecoderModel:
    """The fixture ``tests/data/hf/<name>``'s architecture (its config.json) with seeded random weights."""
    config = ModelConfig.from_hf(json.loads((HF_DATA / name / "config.json").read_text()))
    return DecoderModel.load(InMemorySource(config, random_tensors(config, seed)), dtype, reference)


def logits_over(m: DecoderModel, kind: str, tokens: list[int], prompt: int) -> np.ndarray:
    """Prefill ``prompt`` tokens (all logits), then decode the rest one at a time -> [T, V]."""
    cache = m.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    rows = list(m.prefill_all_logits(np.array([tokens[:prompt]]), cache, range(prompt))[0])
    rows += [m.decode(np.array([[t]]), cache)[0] for t in tokens[prompt:]]
    return np.stack(rows)


def weights_read_by_a_decode_step(path) -> tuple[DecoderModel, set[int]]:
    """The model at ``path``, and the ids of every weight its op set's linear reads in one decode step after a
    four-token prompt."""
    read, recording = set(), []
    linear = fast_ops().linear

    def recording_linear(x, weight, bias=None):
        if recording:
            read.add(id(weight))
        return linear(x, weight, bias)

    model = DecoderModel.load(HFDirectorySource(path), ops=replace(fast_ops(), linear=recording_linear))
    cache = model.create_kv_cache()
    model.prefill(np.array([[5, 9, 33, 2]]), cache, range(4))
    recording.append(True)
    model.decode(np.array([[7]]), cache)
    return model, read
