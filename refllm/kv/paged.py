"""PagedKVArena: every sequence's keys and values in fixed-size blocks of two flat arrays.

    k, v: [L, N, Z, K, E] (Z = block size) in the shape's dtype (float32; float64 for ground truth), allocated once
    a sequence = a block table (block ids, in position order) + a length
    position p of a sequence = block block_table[p // Z], offset p % Z

Blocks come from a free list and carry reference counts: ``fork`` shares
every block of the source, and the first write into a shared block copies it
(copy-on-write). ``reserve`` is the only step that takes blocks (new ones and
the copies), and it takes all of them or none.

Prefix caching: once a block is full and the arena knows its token ids (from
``match_prefix`` or ``register_tokens``), it gets a key naming the whole
prefix up to the end of its block (``refllm.kv.blocks``, which also keeps the
free list, the reference counts and the cached blocks' eviction order).
``match_prefix`` gives a new sequence the cached blocks its prompt starts
with. Keyed blocks are never written while keyed: ``reserve`` copies a shared
block the new tokens land in, and takes a keyed block its only holder reopens
(after ``truncate``, or a fully cached prompt) out of the cache first.

``write``, ``attention`` and ``run_layer`` validate and hand the batch's block tables and slots on
(``refllm.kv.block_attention``; a compiled layer's call: decode steps, their batches, speculative checks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from refllm.kv.base import OWN_ATTENTION, CacheCapacityError, CacheConfig, CacheShape, KVCache, OwnAttention, blocks_for
from refllm.kv.block_attention import BatchView, attend_blocks, write_blocks
from refllm.kv.blocks import BlockPool
from refllm.nn.attention import ImageSpans
from refllm.nn.attention import attention as spec_attention

FUSED_TOKENS = 16  # new tokens a sequence from which a layer runs op by op: a prompt chunk's products dominate
DEFAULT_BUDGET_SEQUENCES = 8  # the default arena holds this many full-context sequences ...
DEFAULT_BUDGET_CAP_BYTES = 2 * 1024**3  # ... unless that takes more than 2 GiB


class OutOfBlocksError(CacheCapacityError):
    """Not enough free blocks for a reservation; nothing was changed."""


@dataclass(frozen=True)
class ArenaStats:
    """A snapshot of the arena's occupancy. blocks_used + blocks_free == blocks_total."""

    blocks_total: int
    blocks_used: int  # held by at least one sequence
    blocks_free: int  # on the free list, or cached and unreferenced (reusable on demand)
    blocks_cached: int  # cached and unreferenced: kept for prefix reuse, part of blocks_free
    blocks_shared: int  # held by more than one sequence
    bytes: int  # the k and v arrays
    tokens: int  # committed tokens over all sequences
    unused_slots: int  # slots of used blocks that no holder has filled
    fragmentation: float  # unused_slots / slots of used blocks (0.0 when none are used)
    prefix_hit_tokens: int  # tokens match_prefix served from the cache since the last reset


@dataclass
class _Sequence:
    blocks: list[int] = field(default_factory=list)  # the block table
    length: int = 0  # committed tokens
    tokens: list[int] = field(default_factory=list)  # known token ids, from position 0
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its full, known blocks


class PagedKVArena(KVCache):
    """Keys and values in blocks of ``config.block_size`` tokens, attended by Numba kernels.

    The kernels read float32 blocks. A float64 arena, or an ``attend`` function
    passed to ``attention``, gathers each sequence's keys through its block table
    and hands them to NumPy instead.

    The arena has ``config.num_blocks`` blocks, else as many as ``config.max_bytes``
    holds, else enough for 8 sequences of ``max_context`` tokens (at most 2 GiB).
    """

    def __init__(self, shape: CacheShape, config: CacheConfig, max_context: int):
        if max_context < 1:
            raise ValueError(f"max_context must be at least 1, not {max_context}")
        self.shape = shape
        self.config = config
        self.block_size = config.block_size
        self.num_blocks = self._arena_blocks(shape, config, max_context)
        arena_shape = (shape.num_layers, self.num_blocks, self.block_size, shape.num_kv_heads)
        self.k = np.zeros((*arena_shape, shape.head_dim), shape.dtype)  # [L, N, Z, K, E]
        self.v = np.zeros((*arena_shape, shape.value_width), shape.dtype)
        # Writes, and attention without an ``attend``, in the Numba kernels (imported on first use), or in NumPy
        # (nothing to compile) where False. The kernels read float32 keys and values of one width: latent
        # attention's arena has no values. Either may be set between forward passes of a float32 arena.
        self.use_kernels = self.k.dtype == np.float32 and shape.value_width == shape.head_dim
        self._pool = BlockPool(self.num_blocks)
        self.refcounts = self._pool.refcounts  # [N]: block tables holding each block
        self._init_bookkeeping()

    @staticmethod
    def _arena_blocks(shape: CacheShape, config: CacheConfig, max_context: int) -> int:
        if config.num_blocks is not None:
            return config.num_blocks
        block_bytes = config.block_size * shape.bytes_per_token
        if config.max_bytes is not None:
            if config.max_bytes < block_bytes:
                raise ValueError(f"CacheConfig.max_bytes={config.max_bytes} holds no block of {block_bytes} bytes")
            return config.max_bytes // block_bytes
        wanted = DEFAULT_BUDGET_SEQUENCES * blocks_for(max_context, config.block_size)
        return max(1, min(wanted, DEFAULT_BUDGET_CAP_BYTES // block_bytes))

    def _init_bookkeeping(self) -> None:
        self._pool.reset()
        self._sequences: dict[int, _Sequence] = {}
        self._prefix_hit_tokens = 0
        self._version = 0  # bumped by every change to tables or lengths; keys the batch-view memo
        self._batch_memo: tuple[tuple, BatchView] | None = None

    @property
    def pool(self) -> BlockPool:
        """The blocks' states and the prefix cache's keys (read them; the arena changes them)."""
        return self._pool

    # --- queries -------------------------------------------------------------------

    def sequence_ids(self) -> list[int]:
        return list(self._sequences)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._sequences

    def length(self, seq_id: int) -> int:
        return self._known(seq_id).length

    def block_table(self, seq_id: int) -> np.ndarray:
        """[blocks] int32: the blocks of ``seq_id``, in position order (reserved room included)."""
        return np.array(self._known(seq_id).blocks, np.int32)

    def free_blocks(self) -> int:
        """Blocks a reservation may take: the free list plus unreferenced cached blocks."""
        return self._pool.free_count()

    def stats(self) -> ArenaStats:
        used = np.flatnonzero(self.refcounts)
        filled = np.zeros(self.num_blocks, np.int64)  # [N]: slots the fullest holder has filled
        for seq in self._sequences.values():
            for index, block in enumerate(seq.blocks):
                filled[block] = max(filled[block], min(self.block_size, seq.length - index * self.block_size))
        used_slots = len(used) * self.block_size
        unused_slots = used_slots - int(filled[used].sum())
        return ArenaStats(
            blocks_total=self.num_blocks,
            blocks_used=len(used),
            blocks_free=self.free_blocks(),
            blocks_cached=self._pool.cached_count(),
            blocks_shared=int(np.count_nonzero(self.refcounts > 1)),
            bytes=self.k.nbytes + self.v.nbytes,
            tokens=sum(seq.length for seq in self._sequences.values()),
            unused_slots=unused_slots,
            fragmentation=unused_slots / used_slots if used_slots else 0.0,
            prefix_hit_tokens=self._prefix_hit_tokens,
        )

    # --- the forward-pass steps ----------------------------------------------------

    def reserve(self, seq_ids: Sequence[int], num_new: int) -> None:
        """Room for ``num_new`` tokens after each sequence's length; unknown ids start empty.

        Takes new blocks and copies the shared blocks the new tokens will land
        in, all or nothing: OutOfBlocksError, with nothing changed, when the
        free blocks do not cover the whole batch.
        """
        self._check_batch(seq_ids)
        if num_new < 0:
            raise ValueError(f"cannot reserve a negative number of tokens: {num_new}")
        plans = [(seq_id, *self._reservation(self._sequences.get(seq_id, _Sequence()), num_new)) for seq_id in seq_ids]
        needed = sum(len(copies) + grow for _, _, copies, grow in plans)
        if needed > self.free_blocks():
            raise OutOfBlocksError(
                f"reserving {num_new} tokens for sequences {list(seq_ids)} needs {needed} blocks;"
                f" {self.free_blocks()} of {self.num_blocks} are free"
            )
        for seq_id, touched, copies, grow in plans:
            seq = self._sequences.setdefault(seq_id, _Sequence())
            for index in touched:
                if index in copies:
                    self._copy_on_write(seq, index)
                else:
                    self._pool.drop_key(seq.blocks[index])
            seq.blocks.extend(self._pool.take() for _ in range(grow))
        self._version += 1

    def _reservation(self, seq: _Sequence, num_new: int) -> tuple[range, list[int], int]:
        """(table indices of held blocks the new tokens land in, those of them that are shared, blocks to add)."""
        if num_new == 0:
            return range(0), [], 0
        blocks_needed = blocks_for(seq.length + num_new, self.block_size)
        touched = range(seq.length // self.block_size, min(len(seq.blocks), blocks_needed))
        shared = [index for index in touched if self.refcounts[seq.blocks[index]] > 1]
        return touched, shared, max(0, blocks_needed - len(seq.blocks))

    def _copy_on_write(self, seq: _Sequence, index: int) -> None:
        """Give ``seq`` its own copy of a shared block, to write into."""
        shared = seq.blocks[index]
        private = self._pool.take()
        self.k[:, private] = self.k[:, shared]
        self.v[:, private] = self.v[:, shared]
        self._pool.release(shared)
        seq.blocks[index] = private

    def write(self, layer: int, seq_ids: Sequence[int], k: np.ndarray, v: np.ndarray) -> None:
        """k: [B, T, K, E], v: [B, T, K, value width] for positions length .. length + T - 1, stored through
        the slot mapping."""
        self._check_layer(layer)
        num_kv_heads, head_dim, value_width = self.shape.num_kv_heads, self.shape.head_dim, self.shape.value_width
        if (
            k.ndim != 4
            or k.shape[0] != len(seq_ids)
            or k.shape[2:] != (num_kv_heads, head_dim)
            or v.shape != (*k.shape[:3], value_width)
        ):
            raise ValueError(
                f"k and v must be [B, T, K, E] and [B, T, K, {value_width}] with B={len(seq_ids)}, K={num_kv_heads},"
                f" E={head_dim}; got {k.shape} and {v.shape}"
            )
        view = self._batch_view(seq_ids, k.shape[1])
        write_blocks(self.k[layer], self.v[layer], view.slots, k, v, self.use_kernels)

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
        """q: [B, T, H, E] at positions length + t -> [B, T, H, E]: one decode or prefill-chunk kernel call,
        or ``attend`` (the spec's attention for a float64 arena) over each sequence's gathered keys.
        image_spans: per row, image runs whose tokens see each other (``KVCache.attention``)."""
        self._check_layer(layer)
        width_fits = attend is not OWN_ATTENTION or q.shape[-1] == self.shape.head_dim  # an attend may take others
        if q.ndim != 4 or q.shape[0] != len(seq_ids) or not width_fits:
            raise ValueError(f"q must be [B={len(seq_ids)}, T, H, E={self.shape.head_dim}], not {q.shape}")
        if q.shape[2] % self.shape.num_kv_heads:
            raise ValueError(f"{q.shape[2]} query heads do not split into {self.shape.num_kv_heads} KV groups")
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        if softcap is not None and softcap <= 0:
            raise ValueError(f"softcap must be positive, not {softcap}")
        view = self._batch_view(seq_ids, q.shape[1])
        if attend is OWN_ATTENTION:
            attend = None if self.use_kernels else spec_attention  # None: attend_blocks runs the kernels
        return attend_blocks(self.k[layer], self.v[layer], view, q, scale, window, softcap, attend, image_spans)

    def run_layer(self, layer, op_by_op, fused, x, positions, seq_ids, image_spans=None) -> np.ndarray:
        """``KVCache.run_layer``: fused over float32 blocks, below FUSED_TOKENS new tokens a sequence, no images."""
        if not self.use_kernels or x.shape[1] >= FUSED_TOKENS or any(image_spans or ()):
            return op_by_op(x, positions, self, seq_ids, image_spans)
        return fused(x, self.k[layer], self.v[layer], self._batch_view(seq_ids, x.shape[1]), positions)

    def commit(self, seq_ids: Sequence[int], num_new: int) -> None:
        """Count ``num_new`` written tokens in each length; blocks that become full and known get cache keys."""
        self._check_batch(seq_ids)
        seqs = [self._known(seq_id) for seq_id in seq_ids]
        for seq_id, seq in zip(seq_ids, seqs):
            self._check_room(seq_id, seq, num_new)
        for seq in seqs:
            seq.length += num_new
            self._key_full_blocks(seq)
        self._version += 1

    # --- sequences -----------------------------------------------------------------

    def fork(self, src: int, dst: int) -> None:
        """``dst`` shares every block of ``src``'s committed tokens (reference counts up; nothing copied)."""
        self._check_fork(src, dst)
        source = self._sequences[src]
        blocks = source.blocks[: blocks_for(source.length, self.block_size)]
        for block in blocks:
            self._pool.hold(block)
        self._sequences[dst] = _Sequence(
            list(blocks), source.length, source.tokens[: source.length], list(source.block_keys)
        )
        self._version += 1

    def truncate(self, seq_id: int, new_length: int) -> None:
        """Roll back to the first ``new_length`` tokens, releasing the blocks past them; block contents stay."""
        self._check_truncate(seq_id, new_length)
        seq = self._sequences[seq_id]
        keep = blocks_for(new_length, self.block_size)
        for block in seq.blocks[keep:]:
            self._pool.release(block)
        del seq.blocks[keep:]
        del seq.tokens[new_length:]
        del seq.block_keys[new_length // self.block_size :]
        seq.length = new_length
        self._version += 1

    def free(self, seq_id: int) -> None:
        seq = self._known(seq_id)
        for block in seq.blocks:
            self._pool.release(block)
        del self._sequences[seq_id]
        self._version += 1

    def reset(self) -> None:
        """Free every sequence and empty the prefix cache: the arena as built (array contents aside)."""
        self._init_bookkeeping()

    # --- prefix caching --------------------------------------------------------------

    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Start a new sequence on the cached blocks its prompt begins with; returns the cached token count.

        ``token_ids`` is the whole prompt; the arena keeps it (as by
        ``register_tokens``) to key the prompt's blocks as they fill. The
        sequence's length is set to the returned count, so prefill continues
        from there. A fully cached prompt returns ``len(token_ids) - 1``: the
        last position is computed again so its logits exist, and the write
        into its cached block copies it first.
        """
        if seq_id in self._sequences:
            raise ValueError(f"match_prefix starts a new sequence; id {seq_id} already exists")
        tokens = [int(t) for t in token_ids]
        seq = _Sequence(tokens=tokens)
        if self.config.prefix_caching:
            seq.blocks, seq.block_keys = self._pool.hold_cached_prefix(tokens, self.block_size)
        seq.length = min(len(seq.blocks) * self.block_size, max(len(tokens) - 1, 0))
        del seq.block_keys[seq.length // self.block_size :]  # a fully cached prompt's last block is reopened
        self._sequences[seq_id] = seq
        self._prefix_hit_tokens += seq.length
        self._version += 1
        return seq.length

    def register_tokens(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """Append the token ids of ``seq_id``'s next positions, for prefix-cache keys.

        The ids continue the ones the arena already knows (the prompt given to
        ``match_prefix``, then every call here), so register each token fed to
        the model, before or after its commit, but never skip one: once a
        sequence has committed tokens the arena has no ids for, further ids
        would land at the wrong positions and are refused.
        """
        seq = self._known(seq_id)
        if len(seq.tokens) < seq.length:
            raise ValueError(
                f"sequence {seq_id} has {seq.length} committed tokens but only {len(seq.tokens)} known ids;"
                " ids must be registered in position order without gaps"
            )
        seq.tokens.extend(int(t) for t in token_ids)
        self._key_full_blocks(seq)

    def _key_full_blocks(self, seq: _Sequence) -> None:
        """Give cache keys to the full blocks whose tokens are committed and known."""
        if not self.config.prefix_caching:
            return
        full = min(seq.length, len(seq.tokens)) // self.block_size
        self._pool.key_blocks(seq.blocks, seq.block_keys, seq.tokens, full, self.block_size)

    # --- validation and views ------------------------------------------------------------

    def _known(self, seq_id: int) -> _Sequence:
        self._check_known(seq_id)
        return self._sequences[seq_id]

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.shape.num_layers:
            raise ValueError(f"layer {layer} is out of range for {self.shape.num_layers} layers")

    @staticmethod
    def _check_batch(seq_ids: Sequence[int]) -> None:
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"sequence ids repeat in one batch: {list(seq_ids)}")

    def _check_room(self, seq_id: int, seq: _Sequence, num_new: int) -> None:
        room = len(seq.blocks) * self.block_size - seq.length
        if not 0 <= num_new <= room:
            raise ValueError(f"sequence {seq_id} has room for {room} new tokens, not {num_new}; reserve first")

    def _batch_view(self, seq_ids: Sequence[int], num_new: int) -> BatchView:
        """Block tables, lengths and slots of a batch, validated; reused by every layer of a step."""
        memo_key = (tuple(seq_ids), num_new, self._version)
        if self._batch_memo is not None and self._batch_memo[0] == memo_key:
            return self._batch_memo[1]
        self._check_batch(seq_ids)
        seqs = [self._known(seq_id) for seq_id in seq_ids]
        for seq_id, seq in zip(seq_ids, seqs):
            self._check_room(seq_id, seq, num_new)
        tables = np.zeros((len(seqs), max((len(seq.blocks) for seq in seqs), default=0)), np.int32)
        for row, seq in enumerate(seqs):
            tables[row, : len(seq.blocks)] = seq.blocks
        lengths = np.array([seq.length for seq in seqs], np.int64)
        positions = lengths[:, None] + np.arange(num_new)  # [B, T]
        blocks = np.take_along_axis(tables, positions // self.block_size, axis=1).astype(np.int64)
        view = BatchView(tables, lengths, blocks * self.block_size + positions % self.block_size)
        self._batch_memo = (memo_key, view)
        return view
