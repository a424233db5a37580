"""Rotary position embedding (RoPE), rotate-half (NeoX / Hugging Face) layout.

Each pair of dimensions (i, i + R/2) of a query or key at position p is rotated
by the angle p * inv_freq[i]:

    inv_freq[i] = 1 / theta^(2i / R)                 i = 0 .. R/2 - 1
    x' = x * cos(p * inv_freq) + rotate_half(x) * sin(p * inv_freq)
    rotate_half([x1, x2]) = [-x2, x1]

so q.k depends only on the distance between the two positions. R = E unless
the model rotates only part of each head (``partial_rotary_factor``).

The scaling variants only change ``inv_freq`` (and, for YaRN, scale cos/sin):
  linear   inv_freq / factor (positions squeezed by ``factor``)
  dynamic  theta grows with the sequence once it passes max_position_embeddings (NTK-aware)
  llama3   low frequencies divided by ``factor``, high ones kept, a smooth band between
  yarn     a ramp between interpolated and original frequencies, and an attention factor

Checkpoints that use the interleaved pairing (2i, 2i + 1), as llama.cpp's files
of some architectures and some families' own do, are converted to this layout at
load; the spec knows one convention.

A NoPE layer (no positional encoding) skips the rotation: its q.k sees what the
tokens are, not where; only the causal mask orders them.

``params`` is one layer type's settings (``refllm.rope_parameters.RopeParameters``:
theta, rope_type, factor, partial_rotary_factor and the variants' own fields).
``rope_cos_sin`` computes the angles of the positions a forward pass covers, anew
each call; the fast op set keeps them in a table instead (``refllm.kernels.rope.RopeTable``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def rotary_dims(params: Any, head_dim: int) -> int:
    """R: how many dimensions of each head are rotated."""
    return int(head_dim * params.partial_rotary_factor)


def inverse_frequencies(
    params: Any, head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[np.ndarray, float]:
    """-> (inv_freq [R/2] float64, attention_factor).

    ``seq_len`` matters only for dynamic NTK scaling: the longest sequence this
    forward pass covers.
    """
    dim = rotary_dims(params, head_dim)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    base = params.theta
    attention_factor = 1.0
    kind = params.rope_type

    if kind == "dynamic":
        seq_len = max(seq_len or max_position_embeddings, max_position_embeddings)
        growth = params.factor * seq_len / max_position_embeddings - (params.factor - 1)
        base = base * growth ** (dim / (dim - 2))

    inv_freq = 1.0 / base**exponents

    if kind == "linear":
        inv_freq = inv_freq / params.factor
    elif kind == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, params)
    elif kind == "yarn":
        inv_freq, attention_factor = _yarn_frequencies(inv_freq, params, dim, base)
    return inv_freq, attention_factor


def _llama3_frequencies(inv_freq: np.ndarray, params: Any) -> np.ndarray:
    """Keep short wavelengths, divide long ones by ``factor``, blend the band between."""
    old_context = params.original_max_position_embeddings
    low_freq_wavelen = old_context / params.low_freq_factor
    high_freq_wavelen = old_context / params.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / params.factor, inv_freq)
    smooth = (old_context / wavelen - params.low_freq_factor) / (params.high_freq_factor - params.low_freq_factor)
    smoothed = (1 - smooth) * scaled / params.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(in_band, smoothed, scaled)


def _yarn_frequencies(inv_freq: np.ndarray, params: Any, dim: int, base: float) -> tuple[np.ndarray, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between."""
    factor = params.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.attention_factor
    if attention_factor is None:
        if params.mscale and params.mscale_all_dim:
            attention_factor = mscale(factor, params.mscale) / mscale(factor, params.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        original = params.original_max_position_embeddings
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.beta_fast), correction_dim(params.beta_slow)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    interpolated = inv_freq / factor
    return interpolated * (1 - extrapolation_weight) + inv_freq * extrapolation_weight, float(attention_factor)


def cos_sin(
    inv_freq: np.ndarray, positions: np.ndarray, attention_factor: float = 1.0, dtype=np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """inv_freq: [R/2], positions: [...] int -> cos, sin: [..., R] in ``dtype``.

    The angles are computed in ``dtype``: float32 rounds inv_freq and the
    positions first, as Hugging Face does; float64 keeps them exact enough for
    ground truth.
    """
    angles = positions[..., None].astype(dtype) * inv_freq.astype(dtype)  # [..., R/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [..., R]
    return np.cos(angles) * attention_factor, np.sin(angles) * attention_factor


def rotate_half(x: np.ndarray) -> np.ndarray:
    """[x1, x2] -> [-x2, x1] on the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: [B, T, heads, E], cos/sin: [B, T, R] -> [B, T, heads, E].

    Rotates the first R dimensions of every head; the rest pass through.
    """
    rotary = cos.shape[-1]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    rotated = x_rot * cos + rotate_half(x_rot) * sin
    return np.concatenate([rotated, x_pass], axis=-1) if x_pass.shape[-1] else rotated


def rope_cos_sin(
    params: Any, head_dim: int, max_position_embeddings: int, positions: np.ndarray, dtype=np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """positions: [B, T] -> cos, sin: [B, T, R] in ``dtype``, for the layer type whose settings are ``params``.

    Dynamic NTK scaling grows the base with the longest position covered, as Hugging Face does.
    """
    seq_len = int(positions.max()) + 1
    inv_freq, attention_factor = inverse_frequencies(params, head_dim, max_position_embeddings, seq_len)
    return cos_sin(inv_freq, positions, attention_factor, dtype)
