"""Scaled dot-product attention with a causal (and optionally sliding) mask.

For a query at position p and the keys at positions j = 0 .. S-1:

    score[h, j] = scale * q[h] . k[g(h), j]                 g(h) = h // (H / K)
    score[h, j] = cap * tanh(score[h, j] / cap)             (optional soft-capping, before the mask)
    score[h, j] = -inf   unless  j <= p  and  p - j < W     (causal, sliding window W)
    out[h]      = sum_j softmax(score[h])[j] * v[g(h), j]

Grouped-query attention is the integer divide in g(h): H query heads share K
key/value heads, H / K queries per group (multi-head attention is K = H).

Attention sinks add one learned logit s[h] per head to the softmax's
denominator, a key that every query sees and that carries no value:

    out[h]      = sum_j exp(score[h, j]) / (exp(s[h]) + sum_j' exp(score[h, j'])) * v[g(h), j]

so a head can put weight "nowhere" instead of being forced onto some key.

Image spans: the tokens of one image, a run of positions [start, end),
see each other whatever their order, inside an otherwise causal (and sliding) mask:

    allowed(p, j) = (j <= p  or  p, j in the same image span)  and  p - j < W

The window still bounds how far back a query looks, as transformers does;
a key ahead of the query (in its image) is always within it.

A vision encoder's patches all see each other (``bidirectional_attention``): no
positions, no causal mask, only padding patches hidden as keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refllm.nn.softcap import soft_cap

ImageSpans = Sequence[tuple[int, int]]  # (start, end) position ranges, each one image's tokens


def attention_mask(
    query_positions: np.ndarray, num_keys: int, window: int | None = None, image_spans: ImageSpans = ()
) -> np.ndarray:
    """query_positions: [T] -> allowed: [T, S] bool (True where the query may look).

    image_spans: (start, end) position ranges whose tokens see each other (a prompt's images)."""
    key_positions = np.arange(num_keys)
    distance = query_positions[:, None] - key_positions[None, :]  # [T, S]
    allowed = distance >= 0
    for start, end in image_spans:
        query_in = (query_positions >= start) & (query_positions < end)  # [T]
        key_in = (key_positions >= start) & (key_positions < end)  # [S]
        allowed |= query_in[:, None] & key_in[None, :]
    if window is not None:
        allowed &= distance < window
    return allowed


def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)): the max is subtracted so exp never overflows."""
    shifted = scores - np.max(scores, axis=axis, keepdims=True)
    weights = np.exp(shifted)
    return weights / np.sum(weights, axis=axis, keepdims=True)


def softmax_with_sink(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """scores: [H, T, S], sinks: [H] -> weights [H, T, S] that sum to 1 - (the sink's share) per query.

    The softmax over [scores, sink] with the sink's column dropped; the max is
    taken over both, so neither side overflows.
    """
    sink_column = np.broadcast_to(sinks[:, None, None], (*scores.shape[:2], 1)).astype(scores.dtype)
    return softmax(np.concatenate([scores, sink_column], axis=-1))[..., :-1]


def attention_weights(
    q: np.ndarray,
    k: np.ndarray,
    query_positions: np.ndarray,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    image_spans: ImageSpans = (),
) -> np.ndarray:
    """q: [T, H, E], k: [S, K, E] (keys at positions 0..S-1), query_positions: [T] -> the softmax weights
    [H, T, S] each query head puts on each key: the attention map ``refllm.tracing`` records."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    k = np.repeat(k, num_heads // num_kv_heads, axis=1)  # [S, H, E]: query head h reads KV head h // group
    q_by_head = q.transpose(1, 0, 2)  # [H, T, E]
    scores = (q_by_head @ k.transpose(1, 2, 0)) * scale  # [H, T, E] @ [H, E, S] -> [H, T, S]
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    allowed = attention_mask(query_positions, k.shape[0], window, image_spans)  # [T, S]
    scores = np.where(allowed[None], scores, -np.inf)
    return softmax(scores) if sinks is None else softmax_with_sink(scores, sinks)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    query_positions: np.ndarray,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    image_spans: ImageSpans = (),
) -> np.ndarray:
    """q: [T, H, E], k/v: [S, K, E] (keys at positions 0..S-1), query_positions: [T] -> [T, H, E].

    sinks: [H] learned sink logits (``softmax_with_sink``), or None.
    image_spans: (start, end) runs of positions whose tokens see each other (``attention_mask``)."""
    weights = attention_weights(q, k, query_positions, scale, window, softcap, sinks, image_spans)  # [H, T, S]
    v = np.repeat(v, q.shape[1] // k.shape[1], axis=1)  # [S, H, E]
    out = weights @ v.transpose(1, 0, 2)  # [H, T, S] @ [H, S, E] -> [H, T, E]
    return out.transpose(1, 0, 2)  # [T, H, E]


def bidirectional_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, key_mask: np.ndarray | None = None
) -> np.ndarray:
    """Every query sees every key: a vision encoder's patches. q, k, v: [N, P, H, E], key_mask: [N, P] bool
    (False for padding patches, which no query sees) -> [N, P, H, E].

        out[n, p, h] = sum_j softmax_j(scale * q[n, p, h] . k[n, j, h]) * v[n, j, h]
    """
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # [N, H, P, E]
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # [N, H, P, E] @ [N, H, E, P] -> [N, H, P, P]
    if key_mask is not None:
        scores = np.where(key_mask[:, None, None, :], scores, -np.inf)
    return (softmax(scores) @ v).transpose(0, 2, 1, 3)  # [N, H, P, P] @ [N, H, P, E] -> [N, P, H, E]
