"""Text embeddings from a decoder-only model: its final hidden states (after the final norm), pooled."""

from __future__ import annotations

import numpy as np

from refllm.kv import CacheConfig

POOLINGS = ("mean", "last")


def pooled_hidden_states(model, ids: list[int], pooling: str = "mean") -> np.ndarray:
    """One text's token ids (at least one) -> [D] float32: the mean, or the last, of its final
    hidden states, computed on a cache of its own."""
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    hidden = model.prefill_hidden(np.array([ids]), cache, range(len(ids)))[0]  # [T, D]
    return hidden.mean(axis=0) if pooling == "mean" else hidden[-1]
