"""RMSNorm, in the plain form and in the (1 + w) form, and LayerNorm.

    rms_norm(x)   = x / sqrt(mean(x^2) + eps) * (offset + w)
    layer_norm(x) = (x - mean(x)) / sqrt(var(x) + eps) * w (+ b)     var(x) = mean((x - mean(x))^2)

``offset`` is 0 for the plain form and 1 for checkpoints that store w - 1.
RMSNorm leaves the mean where it is; LayerNorm subtracts it first, and may add a
learned bias (a vision encoder's does; a text model's may have none). Both
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


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x: [..., N], weight (and bias, or None): [N] (or any shape that broadcasts against x) -> [..., N].
    The variance is the biased one (divided by N), as torch's."""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(np.square(centred), axis=-1, keepdims=True)
    normed = centred / np.sqrt(variance + eps) * weight
    return normed if bias is None else normed + bias
