"""The one interface every KV cache implements.

A cache holds, for every layer, the keys and values of any number of
sequences, each known by an integer id. The forward pass talks to it in four
steps per forward call:

    cache.reserve(seq_ids, T)          make room for T new tokens per sequence (or raise, changing nothing)
    for each layer:
        cache.write(layer, seq_ids, k, v)             keys/values of the T new tokens
        out = cache.attention(layer, seq_ids, q, ...) the new queries over every key so far
    cache.commit(seq_ids, T)           the T tokens now count in each sequence's length

Until ``commit`` the new tokens are invisible to ``length``, so a forward
pass that fails half-way leaves every sequence as it was. Attention lives
behind this interface: given an ``attend`` function (the spec op set's
``refllm.nn.attention.attention``), a cache hands it each sequence's keys and
values as plain arrays; given ``OWN_ATTENTION`` (the fast op set's), it attends
its own way (the paged arena's Numba kernels; the contiguous cache has only the
spec). Which cache a model runs with and which op set it computes with are
separate choices (``refllm/models/ops.py``). A layer the fast op set also built as one
compiled call asks the cache to run it (``run_layer``): the paged arena runs the compiled
call over its blocks where its kernels can take it, every cache runs the layer's steps above
otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from refllm.errors import CacheCapacityError, UnknownSequenceError
from refllm.nn.attention import ImageSpans

__all__ = [
    "OWN_ATTENTION", "CacheCapacityError", "CacheConfig", "CacheShape", "KVCache", "OwnAttention",
    "UnknownSequenceError", "blocks_for",
]


class OwnAttention:
    """What ``attend`` is to ask a cache for its own attention instead of handing it a function: the paged
    arena's Numba kernels over float32 blocks (the spec's attention over its gathered keys otherwise), the
    contiguous cache's spec attention."""

    def __repr__(self) -> str:
        return "OWN_ATTENTION"


OWN_ATTENTION = OwnAttention()


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that ``num_tokens`` positions of one unshared sequence occupy."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class CacheConfig:
    """How to build a model's KV cache.

    kind: ``"paged"`` (blocks in flat arrays, Numba attention) or
        ``"contiguous"`` (one growing array per sequence, NumPy spec attention).
    block_size: tokens per block (paged only).
    num_blocks: blocks in the arena (paged only); ``None`` sizes it from ``max_bytes``.
    max_bytes: memory budget for keys and values; ``None`` takes the default budget.
    prefix_caching: reuse full blocks of identical prompt prefixes (paged only).
    """

    kind: Literal["paged", "contiguous"] = "paged"
    block_size: int = 16
    num_blocks: int | None = None
    max_bytes: int | None = None
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("paged", "contiguous"):
            raise ValueError(f"CacheConfig.kind must be 'paged' or 'contiguous', not {self.kind!r}")
        if self.block_size < 1:
            raise ValueError(f"CacheConfig.block_size must be at least 1, not {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"CacheConfig.num_blocks must be at least 1, not {self.num_blocks}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"CacheConfig.max_bytes must be positive, not {self.max_bytes}")


@dataclass(frozen=True)
class CacheShape:
    """The per-token shape of what a cache stores: keys [layers, kv_heads, head_dim] in ``dtype``, and
    values [layers, kv_heads, value_dim].

    ``value_dim`` None means head_dim. Latent attention (DeepSeek) caches one latent per token as a
    single key "head" of width C + P and no values: ``value_dim`` 0.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"
    value_dim: int | None = None

    @property
    def value_width(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def bytes_per_token(self) -> int:
        itemsize = np.dtype(self.dtype).itemsize
        return self.num_layers * self.num_kv_heads * (self.head_dim + self.value_width) * itemsize


class KVCache(ABC):
    """Keys and values of many sequences for every layer (see the module docstring)."""

    shape: CacheShape

    @abstractmethod
    def sequence_ids(self) -> list[int]:
        """Ids of the live sequences."""

    @abstractmethod
    def length(self, seq_id: int) -> int:
        """Committed tokens of ``seq_id``; raises UnknownSequenceError for an unknown id."""

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.sequence_ids()

    @abstractmethod
    def reserve(self, seq_ids: Sequence[int], num_new: int) -> None:
        """Make room for ``num_new`` tokens after each sequence's length, creating unknown ids empty.

        Raises CacheCapacityError, with nothing changed, when the room is not there.
        """

    @abstractmethod
    def write(self, layer: int, seq_ids: Sequence[int], k: np.ndarray, v: np.ndarray) -> None:
        """k: [B, T, K, E], v: [B, T, K, value_width] for positions length .. length + T - 1 of each sequence."""

    @abstractmethod
    def attention(
        self,
        layer: int,
        seq_ids: Sequence[int],
        q: np.ndarray,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        attend: Callable | OwnAttention = OWN_ATTENTION,
        image_spans: Sequence[ImageSpans] | None = None,
    ) -> np.ndarray:
        """q: [B, T, H, E] at positions length + t -> [B, T, H, E], over every key up to its position.

        attend: ``(q [T, H, E], k, v [S, K, E], query_positions [T], scale, window, softcap) -> [T, H, E]``,
        called once per sequence with its keys and values; ``OWN_ATTENTION``: the cache's own. An ``attend``
        may take queries and give outputs of other widths (latent attention's [T, H, N + P] -> [T, H, U]).
        image_spans: per row, (start, end) runs of positions whose tokens also see the keys after them up to
        ``end`` (Gemma 3's images; each ends within the T new tokens). ``attend`` then gets them as
        ``image_spans=``.
        """

    def run_layer(
        self, layer: int, op_by_op: Callable, fused: Callable, x: np.ndarray, positions: np.ndarray,
        seq_ids: Sequence[int], image_spans: Sequence[ImageSpans] | None = None,
    ) -> np.ndarray:  # fmt: skip
        """x [B, T, D] through decoder layer ``layer`` -> [B, T, D]: ``fused(x, keys, values, view, positions)``,
        the whole layer in one compiled call over this cache's blocks of the layer, where the cache's own
        kernels can take it; else ``op_by_op(x, positions, cache, seq_ids, image_spans)``, the layer's blocks
        calling this cache's ``write`` and ``attention``. Here: op by op."""
        return op_by_op(x, positions, self, seq_ids, image_spans)

    @abstractmethod
    def commit(self, seq_ids: Sequence[int], num_new: int) -> None:
        """Count the ``num_new`` written tokens in each sequence's length."""

    @abstractmethod
    def fork(self, src: int, dst: int) -> None:
        """A new sequence ``dst`` holding the same tokens as ``src``."""

    @abstractmethod
    def truncate(self, seq_id: int, new_length: int) -> None:
        """Roll ``seq_id`` back to its first ``new_length`` tokens."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Forget ``seq_id`` and release its memory."""

    def reset(self) -> None:
        """Free every sequence."""
        for seq_id in self.sequence_ids():
            self.free(seq_id)

    def _check_known(self, seq_id: int) -> None:
        if seq_id not in self:
            raise UnknownSequenceError(f"unknown sequence id {seq_id}")

    def _check_truncate(self, seq_id: int, new_length: int) -> None:
        length = self.length(seq_id)
        if not 0 <= new_length <= length:
            raise ValueError(f"cannot truncate sequence {seq_id} of length {length} to {new_length}")

    def _check_fork(self, src: int, dst: int) -> None:
        self._check_known(src)
        if dst in self:
            raise ValueError(f"cannot fork into sequence id {dst}: it already exists")
