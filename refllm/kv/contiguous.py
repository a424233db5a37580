"""The baseline cache: one growing array per sequence, attended with the NumPy spec.

Sequence ``s`` keeps ``k[s]``, ``v[s]``: [L, capacity, K, E] in the shape's
dtype; token t of layer l sits at ``k[s][l, t]``. Capacity doubles when a
sequence outgrows it. With the spec op set this is the reference: the spec's
own attention over plain arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from refllm.kv.base import OWN_ATTENTION, CacheCapacityError, CacheShape, KVCache, OwnAttention
from refllm.nn.attention import ImageSpans
from refllm.nn.attention import attention as spec_attention


@dataclass
class _Sequence:
    k: np.ndarray  # [L, capacity, K, E]
    v: np.ndarray
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


class ContiguousKVCache(KVCache):
    """Per-sequence contiguous arrays; ``max_tokens`` (all sequences together) bounds memory."""

    def __init__(self, shape: CacheShape, max_tokens: int | None = None):
        self.shape = shape
        self.max_tokens = max_tokens
        self._sequences: dict[int, _Sequence] = {}

    def sequence_ids(self) -> list[int]:
        return list(self._sequences)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._sequences

    def length(self, seq_id: int) -> int:
        self._check_known(seq_id)
        return self._sequences[seq_id].length

    def keys(self, seq_id: int, layer: int) -> np.ndarray:
        """[length, K, E]: the committed keys of one sequence and layer."""
        seq = self._sequences[seq_id]
        return seq.k[layer, : seq.length]

    def values(self, seq_id: int, layer: int) -> np.ndarray:
        seq = self._sequences[seq_id]
        return seq.v[layer, : seq.length]

    def tokens_held(self) -> int:
        return sum(seq.length for seq in self._sequences.values())

    def reserve(self, seq_ids: Sequence[int], num_new: int) -> None:
        total = self.tokens_held() + num_new * len(set(seq_ids))
        if self.max_tokens is not None and total > self.max_tokens:
            raise CacheCapacityError(f"the cache holds at most {self.max_tokens} tokens; {total} would not fit")
        for seq_id in seq_ids:
            seq = self._sequences.get(seq_id)
            if seq is None:
                seq = self._sequences[seq_id] = self._empty(max(num_new, 16))
            if seq.length + num_new > seq.capacity:
                self._grow(seq, max(seq.length + num_new, 2 * seq.capacity))

    def _empty(self, capacity: int) -> _Sequence:
        shape = (self.shape.num_layers, capacity, self.shape.num_kv_heads)
        return _Sequence(
            np.zeros((*shape, self.shape.head_dim), self.shape.dtype),
            np.zeros((*shape, self.shape.value_width), self.shape.dtype),
        )

    def _grow(self, seq: _Sequence, capacity: int) -> None:
        bigger = self._empty(capacity)
        bigger.k[:, : seq.length] = seq.k[:, : seq.length]
        bigger.v[:, : seq.length] = seq.v[:, : seq.length]
        seq.k, seq.v = bigger.k, bigger.v

    def write(self, layer: int, seq_ids: Sequence[int], k: np.ndarray, v: np.ndarray) -> None:
        num_new = k.shape[1]
        for row, seq_id in enumerate(seq_ids):
            seq = self._sequences[seq_id]
            seq.k[layer, seq.length : seq.length + num_new] = k[row]
            seq.v[layer, seq.length : seq.length + num_new] = v[row]

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
        if attend is OWN_ATTENTION:  # no kernel of its own
            attend = spec_attention
        num_new = q.shape[1]
        out = []
        for row, seq_id in enumerate(seq_ids):
            seq = self._sequences[seq_id]
            end = seq.length + num_new  # the written-but-uncommitted chunk is attended too
            positions = np.arange(seq.length, end)
            spans = {"image_spans": image_spans[row]} if image_spans is not None and image_spans[row] else {}
            out.append(
                attend(q[row], seq.k[layer, :end], seq.v[layer, :end], positions, scale, window, softcap, **spans)
            )
        return np.stack(out)

    def commit(self, seq_ids: Sequence[int], num_new: int) -> None:
        for seq_id in seq_ids:
            self._sequences[seq_id].length += num_new

    def fork(self, src: int, dst: int) -> None:
        self._check_fork(src, dst)
        if self.max_tokens is not None and self.tokens_held() + self.length(src) > self.max_tokens:
            raise CacheCapacityError(f"the cache holds at most {self.max_tokens} tokens; cannot fork {src}")
        seq = self._sequences[src]
        self._sequences[dst] = _Sequence(seq.k.copy(), seq.v.copy(), seq.length)

    def truncate(self, seq_id: int, new_length: int) -> None:
        self._check_truncate(seq_id, new_length)
        self._sequences[seq_id].length = new_length

    def free(self, seq_id: int) -> None:
        self._check_known(seq_id)
        del self._sequences[seq_id]
