"""KV caches behind one interface: the contiguous baseline and the paged arena."""

from refllm.kv.base import OWN_ATTENTION, CacheCapacityError, CacheConfig, CacheShape, KVCache, UnknownSequenceError
from refllm.kv.contiguous import ContiguousKVCache
from refllm.kv.factory import create_cache
from refllm.kv.paged import OutOfBlocksError, PagedKVArena

__all__ = [
    "OWN_ATTENTION",
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
