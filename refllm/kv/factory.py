"""Build the cache a CacheConfig asks for."""

from __future__ import annotations

from refllm.kv.base import CacheConfig, CacheShape, KVCache
from refllm.kv.contiguous import ContiguousKVCache


def create_cache(shape: CacheShape, config: CacheConfig, max_context: int) -> KVCache:
    """A paged arena or a contiguous cache for sequences of up to ``max_context`` tokens."""
    if config.kind == "contiguous":
        max_tokens = config.max_bytes // shape.bytes_per_token if config.max_bytes else None
        return ContiguousKVCache(shape, max_tokens)
    from refllm.kv.paged import PagedKVArena

    return PagedKVArena(shape, config, max_context)
