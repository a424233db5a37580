"""A GenerativeModel written apart from refllm.models: what a backend author would bring to the runtime.

One attention layer with learned absolute positions, its own NumPy attention
(handed to the cache as ``attend``), and a tied LM head. It shares nothing with
``DecoderModel`` but the contract (``refllm/models/contract.py``) and
refllm's KV caches, which any model may use.

Dimensions: V vocabulary, D hidden size, P positions, B batch, T tokens, S keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refllm.errors import ContextLengthError, PositionError
from refllm.kv import CacheConfig, CacheShape, KVCache, create_cache
from refllm.models.contract import ModelMetadata


def attend(q, k, v, query_positions, scale, window=None, softcap=None):
    """q [T, 1, D], k/v [S, 1, D] (keys at 0 .. S-1) -> [T, 1, D]: causal softmax attention, one head."""
    scores = scale * q[:, 0] @ k[:, 0].T  # [T, S]
    scores[np.arange(k.shape[0])[None, :] > query_positions[:, None]] = -np.inf
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return ((weights / weights.sum(axis=1, keepdims=True)) @ v[:, 0])[:, None]


class TinyAttentionLM:
    supports_decode_all_logits = True
    supports_hidden_states = True

    def __init__(self, vocab_size: int = 48, hidden_size: int = 16, context_length: int = 96, seed: int = 0):
        rng = np.random.default_rng(seed)
        V, D, P = vocab_size, hidden_size, context_length
        self.token_table = rng.normal(0, 1, (V, D)).astype(np.float32)  # [V, D], also the LM head
        self.position_table = rng.normal(0, 1, (P, D)).astype(np.float32)  # [P, D]
        self.wq, self.wk, self.wv, self.wo = (rng.normal(0, D**-0.5, (D, D)).astype(np.float32) for _ in range(4))
        self.tokenizer = None  # token ids only
        self._metadata = ModelMetadata("tiny-attention", V, D, 1, P, 4 * D * D + (V + P) * D, None, (0,))

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def create_kv_cache(self, config: CacheConfig | None = None) -> KVCache:
        D = self.metadata.hidden_size
        return create_cache(CacheShape(1, 1, D), config or CacheConfig(), self.metadata.context_length)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.token_table[np.asarray(tokens)]

    def embed_multimodal(self, tokens: np.ndarray, images) -> np.ndarray:
        return self.embed(tokens)

    def forward_step(self, x: np.ndarray, cache: KVCache, seq_ids: Sequence[int]) -> np.ndarray:
        B, T, D = x.shape
        starts = [cache.length(s) if s in cache else 0 for s in seq_ids]
        if max(starts) + T > self.metadata.context_length:
            raise ContextLengthError(f"a sequence would pass {self.metadata.context_length} positions")
        positions = np.array(starts)[:, None] + np.arange(T)  # [B, T]
        h = x + self.position_table[positions]
        cache.reserve(seq_ids, T)
        q, k, v = ((h @ w).reshape(B, T, 1, D) for w in (self.wq, self.wk, self.wv))
        cache.write(0, seq_ids, k, v)
        out = cache.attention(0, seq_ids, q, D**-0.5, attend=attend)
        cache.commit(seq_ids, T)
        return h + out.reshape(B, T, D) @ self.wo

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return hidden @ self.token_table.T

    def prefill_hidden(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        x = np.asarray(x)
        for row in range(x.shape[0]):
            held = cache.length(row) if row in cache else 0
            if pos.start != held or len(pos) != x.shape[1]:
                raise PositionError(f"pos {pos} does not continue row {row}'s {held} positions")
        embedded = self.embed(x) if np.issubdtype(x.dtype, np.integer) else x
        return self.forward_step(embedded, cache, list(range(x.shape[0])))

    def prefill(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        return self.logits(self.prefill_hidden(x, cache, pos)[:, -1])

    def prefill_all_logits(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        return self.logits(self.prefill_hidden(x, cache, pos))

    def decode(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        return self.decode_all_logits(x, cache)[:, -1]

    def decode_all_logits(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        start = cache.length(0) if 0 in cache else 0
        return self.prefill_all_logits(x, cache, range(start, start + np.shape(x)[1]))
