"""RMSNorm, in the plain form and in Gemma's (1 + w) form, and LayerNorm (the vision towers').

    rms_norm(x)   = x / sqrt(mean(x^2) + eps) * (offset + w)
    layer_norm(x) = (x - mean(x)) / sqrt(var(x) + eps) * w + b      var(x) = mean((x - mean(x))^2)

``offset`` is 0 for Llama-style norms and 1 for Gemma, whose checkpoints store
w - 1. The same function normalises the last axis of anything: [B, T, D] hidden
states, or [B, T, H, E] per-head queries and keys (the q/k norm of Qwen3 and
Gemma 3).

LayerNorm also centres each vector and adds a learned bias; SigLIP, the vision
encoder of SmolVLM and Gemma 3, uses it before attention, before its MLP and
once after its last layer.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """x: [..., N], weight: [N] -> [..., N]."""
    mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
    normed = x / np.sqrt(mean_square + eps)  # eps inside the square root
    return normed * (offset + weight)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """x: [..., N], weight/bias: [N] -> [..., N]. The variance is the biased one (divided by N), as torch's."""
    centred = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(np.square(centred), axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias
