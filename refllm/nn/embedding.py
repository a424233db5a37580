"""Token embedding: a row lookup, optionally scaled (by sqrt(D), or a config's embedding multiplier)."""

from __future__ import annotations

import numpy as np


def embed(token_ids: np.ndarray, table: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """token_ids: [B, T] int, table: [V, D] -> [B, T, D].

    x[b, t] = scale * table[token_ids[b, t]]
    """
    x = table[token_ids]
    if scale != 1.0:
        x = x * scale
    return x
