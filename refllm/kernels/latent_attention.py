"""Latent attention with kv_b_proj absorbed into the query and the output: the fast op set's twin of the spec.

NumPy twin: ``refllm.nn.latent_attention.latent_attention`` (tests/families/test_deepseek.py), whose
docstring derives the absorption. Instead of expanding every cached latent into H keys and
values at every step, the query moves into the latent space and the value projection comes
after the weighted sum: multi-query attention over the cached latents themselves. Plain
NumPy: its products are a few einsums.
"""

from __future__ import annotations

import numpy as np

from refllm.nn.attention import attention


def absorbed_latent_attention(
    q: np.ndarray,
    latent: np.ndarray,
    values: np.ndarray,
    query_positions: np.ndarray,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    *,
    kv_b_proj: np.ndarray,
    nope_dim: int,
) -> np.ndarray:
    """``latent_attention`` with kv_b_proj absorbed into the query and the output: the same [T, H, U]."""
    num_heads, rank = q.shape[1], kv_b_proj.shape[1]
    per_head = kv_b_proj.reshape(num_heads, -1, rank)  # [H, N + U, C]
    key_rows, value_rows = per_head[:, :nope_dim], per_head[:, nope_dim:]  # [H, N, C], [H, U, C]
    q_latent = np.einsum("thn,hnc->thc", q[..., :nope_dim], key_rows)  # [T, H, C]
    q_absorbed = np.concatenate([q_latent, q[..., nope_dim:]], axis=-1)  # [T, H, C + P]
    context = attention(q_absorbed, latent, latent[..., :rank], query_positions, scale, window, softcap)  # [T, H, C]
    return np.einsum("thc,huc->thu", context, value_rows)
