"""BlockPool: the paged arena's blocks, their reference counts and the prefix cache's keys.

Every block is in exactly one of three states: held (reference count =
number of block tables holding it, >= 1), on the free list, or cached and
unreferenced (keyed, reference count 0).

A full block whose token ids are known carries a key, sha256(previous block's
key + its token ids), so a key names the whole prefix up to the end of its
block. A keyed block no sequence holds stays in the cache,
counted as free, until the free list runs dry; then the least recently
released one is evicted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def _block_key(keys_before: list[bytes], token_ids: Sequence[int]) -> bytes:
    """The key of a full block of ``token_ids`` after blocks keyed ``keys_before``."""
    previous = keys_before[-1] if keys_before else b""
    return hashlib.sha256(previous + np.asarray(token_ids, np.int64).tobytes()).digest()


class BlockPool:
    """Which of ``num_blocks`` blocks are held, free or cached, and the keys of the cached ones."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.refcounts = np.zeros(num_blocks, np.int32)  # [N]: block tables holding each block
        self.reset()

    def reset(self) -> None:
        """Every block free and unkeyed."""
        self.refcounts[:] = 0
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # a stack: block 0 is taken first
        self._unreferenced_cached: OrderedDict[int, None] = OrderedDict()  # oldest release first
        self._key_of_block: dict[int, bytes] = {}
        self._block_of_key: dict[bytes, int] = {}

    def free_count(self) -> int:
        """Blocks ``take`` may hand out: the free list plus unreferenced cached blocks."""
        return len(self._free) + len(self._unreferenced_cached)

    def cached_count(self) -> int:
        """Cached and unreferenced blocks: kept for prefix reuse, counted as free."""
        return len(self._unreferenced_cached)

    def cached_blocks(self) -> list[int]:
        """The blocks the prefix cache knows by a key, held or not."""
        return list(self._key_of_block)

    def cached_prefix(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        """The cached blocks a prompt of ``token_ids`` would start on, without holding them."""
        blocks: list[int] = []
        keys: list[bytes] = []
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            keys.append(_block_key(keys, token_ids[start : start + block_size]))
            if keys[-1] not in self._block_of_key:
                break
            blocks.append(self._block_of_key[keys[-1]])
        return blocks

    def take(self) -> int:
        """A block for one holder: from the free list, else evict the least recently released cached block."""
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._unreferenced_cached.popitem(last=False)
            self.drop_key(block)
        self.refcounts[block] = 1
        return block

    def hold(self, block: int) -> None:
        """One more holder of ``block``: a held block, or a cached one taken back from eviction."""
        self._unreferenced_cached.pop(block, None)
        self.refcounts[block] += 1

    def release(self, block: int) -> None:
        self.refcounts[block] -= 1
        if self.refcounts[block] == 0:
            if block in self._key_of_block:
                self._unreferenced_cached[block] = None
            else:
                self._free.append(block)

    def hold_cached_prefix(self, token_ids: list[int], block_size: int) -> tuple[list[int], list[bytes]]:
        """Hold the cached blocks ``token_ids`` begins with; returns them and their keys."""
        blocks: list[int] = []
        keys: list[bytes] = []
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            key = _block_key(keys, token_ids[start : start + block_size])
            block = self._block_of_key.get(key)
            if block is None:
                break
            self.hold(block)
            blocks.append(block)
            keys.append(key)
        return blocks, keys

    def key_blocks(
        self, blocks: list[int], keys: list[bytes], token_ids: list[int], full: int, block_size: int
    ) -> None:
        """Extend ``keys``, those of a block table's first blocks, to its first ``full`` blocks of ``token_ids``.

        Each newly keyed block is cached unless an equal prefix was cached first: a block carries one key at most.
        """
        for index in range(len(keys), full):
            key = _block_key(keys, token_ids[index * block_size : (index + 1) * block_size])
            keys.append(key)
            block = blocks[index]
            if key not in self._block_of_key and block not in self._key_of_block:
                self._block_of_key[key] = block
                self._key_of_block[block] = key

    def drop_key(self, block: int) -> None:
        """Take ``block`` out of the prefix cache, if it is there (it is about to be overwritten)."""
        key = self._key_of_block.pop(block, None)
        if key is not None:
            del self._block_of_key[key]
