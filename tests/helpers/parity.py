"""How refllm's outputs are compared with transformers' stored ones: all logits of a prompt, greedy tokens."""

from __future__ import annotations

import numpy as np

from refllm import CacheConfig

ATOL = RTOL = 1e-4  # float32 logits against transformers' float32 logits


def all_logits(model, ids: np.ndarray, cache_kind: str = "contiguous") -> np.ndarray:
    """The logits at every position of ``ids`` [1, T], from one prefill on a fresh cache -> [1, T, V]."""
    cache = model.create_kv_cache(CacheConfig(kind=cache_kind))
    return model.prefill_all_logits(ids, cache, range(0, ids.shape[1]))


def greedy(model, ids: np.ndarray, new_tokens: int, cache_kind: str = "contiguous") -> list[int]:
    """``new_tokens`` greedy tokens after the prompt ``ids`` [1, T]: one prefill, then one decode step each."""
    cache = model.create_kv_cache(CacheConfig(kind=cache_kind))
    logits = model.prefill(ids, cache, range(0, ids.shape[1]))
    tokens = []
    for _ in range(new_tokens):
        token = int(np.argmax(logits[0]))
        tokens.append(token)
        logits = model.decode(np.array([[token]]), cache)
    return tokens
