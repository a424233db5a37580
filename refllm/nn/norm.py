"""RMSNorm, in the plain form and in Gemma's (1 + w) form.

    rms_norm(x) = x / sqrt(mean(x^2) + eps) * (offset + w)

``offset`` is 0 for Llama-style norms and 1 for Gemma, whose checkpoints store
w - 1. The same function normalises the last axis of anything: [B, T, D] hidden
states, or [B, T, H, E] per-head queries and keys (the q/k norm of Qwen3 and
Gemma 3).
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """x: [..., N], weight: [N] -> [..., N]."""
    mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
    normed = x / np.sqrt(mean_square + eps)  # eps inside the square root
    return normed * (offset + weight)
