"""Multi-head latent attention (MLA): keys and values decompressed from one small latent.

Letters beyond the legend: C the latent width (``kv_lora_rank``), N the per-head
query/key dims without RoPE (``qk_nope_head_dim``), P the RoPE dims
(``qk_rope_head_dim``), U the per-head value dims (``v_head_dim``), Q the
query's low-rank width (``q_lora_rank``). For a normed hidden state x [D]:

    query      q = q_b_proj( rms_norm(q_a_proj(x)) )        [H, N + P]   (or q = q_proj(x) when Q is None)
               q = [q_nope | q_rope],  q_rope = RoPE(q_rope)
    latent     [c | k_rope] = kv_a_proj_with_mqa(x)         c: [C], k_rope: [P]
               c = rms_norm(c),  k_rope = RoPE(k_rope)      one RoPE key for all heads
    cached     [c | k_rope]                                 C + P numbers per token and layer
    expand     [k_nope | v] = kv_b_proj(c)                  k_nope: [H, N], v: [H, U]
               k[h] = [k_nope[h] | k_rope]                  [H, N + P]
    attention  out = attention(q, k, v, scale)              [H, U], then o_proj

The cache keeps the latent, not the H keys and values it expands into: per token
and layer C + P numbers instead of 2 K E (with C = 512, P = 64 and 128 heads of
192: 576 numbers against 2 x 128 x 192 = 49152). The price is ``expand_latent``
on every cached token at every step. An implementation can fold kv_b_proj into
the query and the output instead ("absorption"): with
W_k[h] [N, C] and W_v[h] [U, C] the rows of kv_b_proj that make head h's key
and value,

    q_nope[h] . (W_k[h] c) = (W_k[h]^T q_nope[h]) . c      so the query moves into the latent space
    sum_j p_j W_v[h] c_j   = W_v[h] (sum_j p_j c_j)         and the value projection comes after the sum

which is multi-query attention over the cached latents themselves, keys
[c | k_rope] and values c. ``refllm.kernels.latent_attention.absorbed_latent_attention``
is that twin, the fast op set's; the expanded form above is the spec.

The latent norms use eps 1e-6 whatever the model's other norms use (as the
reference implementation and transformers build them).
"""

from __future__ import annotations

import numpy as np

from refllm.nn.attention import attention
from refllm.nn.linear import linear

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm


def expand_latent(
    latent: np.ndarray, kv_b_proj: np.ndarray, num_heads: int, nope_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """latent: [S, C + P] cached [c | k_rope], kv_b_proj: [H * (N + U), C] -> k: [S, H, N + P], v: [S, H, U]."""
    rank = kv_b_proj.shape[1]
    c, k_rope = latent[:, :rank], latent[:, rank:]  # [S, C], [S, P]
    kv = linear(c, kv_b_proj).reshape(len(latent), num_heads, -1)  # [S, H, N + U]
    k_nope, v = kv[..., :nope_dim], kv[..., nope_dim:]
    k_rope = np.broadcast_to(k_rope[:, None, :], (len(latent), num_heads, k_rope.shape[1]))  # shared by all heads
    return np.concatenate([k_nope, k_rope], axis=-1), v


def latent_attention(
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
    """q: [T, H, N + P], latent: [S, 1, C + P] (the cache's one "head"), values: [S, 1, 0] (the cache
    keeps no values) -> [T, H, U].

    The signature of ``refllm.nn.attention.attention`` (bind kv_b_proj and nope_dim), so a KV cache
    hands it each sequence's cached latents as it would keys.
    """
    k, v = expand_latent(latent[:, 0], kv_b_proj, q.shape[1], nope_dim)
    return attention(q, k, v, query_positions, scale, window, softcap)
