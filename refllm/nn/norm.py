"""RMSNorm, in the plain form and in the (1 + w) form, and LayerNorm without a bias.

    rms_norm(x)   = x / sqrt(mean(x^2) + eps) * (offset + w)
    layer_norm(x) = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w

``offset`` is 0 for the plain form and 1 for checkpoints that store w - 1.
RMSNorm leaves the mean where it is; LayerNorm subtracts it first. Both
normalise the last axis of anything: [B, T, D] hidden states, or [B, T, H, E]
per-head queries and keys (a q/k norm; its weight [E] is shared by the heads,
or [H, E] gives each head a row of its own, broadcast over the batch and tokens).
Which norm a model uses, and where, is its family's recipe (``refllm/families/``).
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """x: [..., N], weight: [N] -> [..., N]."""
    mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
    normed = x / np.sqrt(mean_square + eps)  # eps inside the square root
    return normed * (offset + weight)


def layer_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: [..., N], weight: [N] (or any shape that broadcasts against x) -> [..., N]."""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(np.square(centred), axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight
