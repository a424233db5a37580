"""KV caches behind one interface: the contiguous baseline and the paged arena."""

from refllm.kv.base import CacheCapacityError, CacheConfig, CacheShape, KVCache, UnknownSequenceError
from refllm.kv.contiguous import ContiguousKVCache
from refllm.kv.factory import create_cache
from refllm.kv.paged import OutOfBlocksError, PagedKVArena

__all__ = [
    "CacheCapacityError",
    "CacheConfig",
    "CacheShape",
    "ContiguousKVCache",
    "KVCache",
    "OutOfBlocksError",
    "PagedKVArena",
    "UnknownSequenceError",
    "create_cache",
]
