"""PagedKVArena: bookkeeping invariants, equality with the contiguous cache, prefix caching, refusals.

Keys and values here are a deterministic function of the token ids up to and
including their position (as a real model's are), so a block the prefix cache
hands out holds exactly what recomputing it would write.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from refllm.kv import CacheConfig, CacheShape, ContiguousKVCache, OutOfBlocksError, PagedKVArena, UnknownSequenceError
from refllm.kv.blocks import BlockPool
from refllm.kv.paged import DEFAULT_BUDGET_CAP_BYTES

SHAPE = CacheShape(num_layers=2, num_kv_heads=2, head_dim=4)
NUM_HEADS = 4  # two query heads per KV head
SCALE = 0.5
RTOL, ATOL = 1e-5, 1e-6


def token_kv(prefix: list[int], layer: int) -> tuple[np.ndarray, np.ndarray]:
    """k, v: [K, E] of the last token of ``prefix``: a function of the whole prefix."""
    digest = hashlib.sha256(np.array([layer, *prefix], np.int64).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    kv = rng.standard_normal((2, SHAPE.num_kv_heads, SHAPE.head_dim), dtype=np.float32)
    return kv[0], kv[1]


def new_kv(tokens: list[int], start: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """k, v: [T, K, E] for positions start .. len(tokens) - 1."""
    pairs = [token_kv(tokens[: p + 1], layer) for p in range(start, len(tokens))]
    return np.stack([k for k, _ in pairs]), np.stack([v for _, v in pairs])


def forward(cache, seq_ids: list[int], tokens: dict[int, list[int]], num_new: int, rng) -> list[np.ndarray]:
    """One forward step's cache traffic for ``num_new`` tokens per sequence -> attention output per layer.

    The caller has already reserved; this writes, attends and commits.
    """
    outputs = []
    q = rng.standard_normal((len(seq_ids), num_new, NUM_HEADS, SHAPE.head_dim), dtype=np.float32)
    for layer in range(SHAPE.num_layers):
        kvs = [new_kv(tokens[s][: cache.length(s) + num_new], cache.length(s), layer) for s in seq_ids]
        cache.write(layer, seq_ids, np.stack([k for k, _ in kvs]), np.stack([v for _, v in kvs]))
        outputs.append(cache.attention(layer, seq_ids, q, SCALE, window=6, softcap=3.0))
    cache.commit(seq_ids, num_new)
    return outputs


# --- state snapshots ------------------------------------------------------------------


def snapshot(arena: PagedKVArena) -> dict:
    return copy.deepcopy(vars(arena))


def assert_same(before, after, path: str = "arena") -> None:
    """Deep equality that compares arrays element by element."""
    if isinstance(before, np.ndarray):
        assert np.array_equal(before, after), f"{path} changed"
    elif dataclasses.is_dataclass(before) and not isinstance(before, type) or isinstance(before, BlockPool):
        assert_same(vars(before), vars(after), path)
    elif isinstance(before, dict):
        assert list(before) == list(after), f"{path} keys changed"
        for key in before:
            assert_same(before[key], after[key], f"{path}[{key!r}]")
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after), f"{path} changed length"
        for i, (a, b) in enumerate(zip(before, after)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert before == after, f"{path} changed: {before!r} -> {after!r}"


def assert_refused(arena: PagedKVArena, error: type[Exception], action: Callable[[], object]) -> None:
    before = snapshot(arena)
    with pytest.raises(error):
        action()
    assert_same(before, snapshot(arena))


def assert_consistent(arena: PagedKVArena) -> None:
    """Every block is held (refcount = tables holding it), free, or cached-unreferenced: exactly one."""
    holders = np.zeros(arena.num_blocks, np.int64)
    for seq_id in arena.sequence_ids():
        np.add.at(holders, arena.block_table(seq_id), 1)
    np.testing.assert_array_equal(arena.refcounts, holders)
    pool = arena._pool
    free, cached = list(pool._free), list(pool._unreferenced_cached)
    assert len(set(free)) == len(free) and not set(free) & set(cached)
    unreferenced = set(np.flatnonzero(holders == 0).tolist())
    assert set(free) | set(cached) == unreferenced
    assert set(cached) <= set(pool._key_of_block)
    stats = arena.stats()
    assert stats.blocks_used + stats.blocks_free == stats.blocks_total == arena.num_blocks


def gathered(arena: PagedKVArena, seq_id: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """[length, K, E] keys and values of a sequence, gathered through its block table."""
    table, length = arena.block_table(seq_id), arena.length(seq_id)
    k = arena.k[layer][table].reshape(-1, SHAPE.num_kv_heads, SHAPE.head_dim)[:length]
    v = arena.v[layer][table].reshape(-1, SHAPE.num_kv_heads, SHAPE.head_dim)[:length]
    return k, v


# --- the property test: random operations against the contiguous cache -----------------

VOCAB = st.integers(0, 2)  # a tiny vocabulary, so prompts share prefixes often


class ArenaAgainstContiguous(RuleBasedStateMachine):
    """Random start/append/fork/truncate/free/misuse on both caches; they must agree after every step."""

    @initialize(
        block_size=st.sampled_from([1, 2, 3, 4]),
        num_blocks=st.integers(4, 24),
        prefix_caching=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def build(self, block_size: int, num_blocks: int, prefix_caching: bool, seed: int) -> None:
        config = CacheConfig(block_size=block_size, num_blocks=num_blocks, prefix_caching=prefix_caching)
        self.arena = PagedKVArena(SHAPE, config, max_context=64)
        self.spec = ContiguousKVCache(SHAPE)
        self.tokens: dict[int, list[int]] = {}  # every live sequence's token ids
        self.history: list[list[int]] = []  # token ids of every sequence at every commit
        self.next_id = 0
        self.rng = np.random.default_rng(seed)

    def live(self) -> list[int]:
        return self.spec.sequence_ids()

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """A new sequence, often on a prompt that begins like one seen before (so the prefix cache hits)."""
        head = data.draw(st.sampled_from([[], *self.history])) if self.history else []
        head = head[: data.draw(st.integers(0, len(head)))]
        prompt = head + data.draw(st.lists(VOCAB, min_size=0 if head else 1, max_size=12 - min(len(head), 11)))
        seq_id, self.next_id = self.next_id, self.next_id + 1
        cached = self.arena.match_prefix(seq_id, prompt)
        assert 0 <= cached < len(prompt)
        before = snapshot(self.arena)
        try:
            self.arena.reserve([seq_id], len(prompt) - cached)
        except OutOfBlocksError:
            assert_same(before, snapshot(self.arena))
            self.arena.free(seq_id)
            return
        self.tokens[seq_id] = list(prompt)
        self.spec.reserve([seq_id], cached)
        if cached:
            forward(self.spec, [seq_id], self.tokens, cached, self.rng)
        self.spec.reserve([seq_id], len(prompt) - cached)
        self.check_forward([seq_id], len(prompt) - cached)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), num_new=st.integers(1, 3))
    def append(self, data: st.DataObject, num_new: int) -> None:
        seq_ids = data.draw(st.lists(st.sampled_from(self.live()), min_size=1, unique=True))
        new_tokens = {s: data.draw(st.lists(VOCAB, min_size=num_new, max_size=num_new)) for s in seq_ids}
        before = snapshot(self.arena)
        try:
            self.arena.reserve(seq_ids, num_new)
        except OutOfBlocksError:
            assert_same(before, snapshot(self.arena))
            return
        for s in seq_ids:
            self.arena.register_tokens(s, new_tokens[s])
            self.tokens[s] += new_tokens[s]
        self.spec.reserve(seq_ids, num_new)
        self.check_forward(seq_ids, num_new)

    def check_forward(self, seq_ids: list[int], num_new: int) -> None:
        """One forward step on both caches (already reserved) with the same queries; outputs agree."""
        state = self.rng.bit_generator.state
        arena_out = forward(self.arena, seq_ids, self.tokens, num_new, self.rng)
        self.rng.bit_generator.state = state  # the same queries for both caches
        spec_out = forward(self.spec, seq_ids, self.tokens, num_new, self.rng)
        for paged, contiguous in zip(arena_out, spec_out):
            np.testing.assert_allclose(paged, contiguous, rtol=RTOL, atol=ATOL)
        self.history += [self.tokens[s][:] for s in seq_ids]

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(self.live()))
        dst, self.next_id = self.next_id, self.next_id + 1
        self.arena.fork(src, dst)
        self.spec.fork(src, dst)
        self.tokens[dst] = self.tokens[src][: self.spec.length(src)]

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(self.live()))
        new_length = data.draw(st.integers(0, self.spec.length(seq_id)))
        self.arena.truncate(seq_id, new_length)
        self.spec.truncate(seq_id, new_length)
        del self.tokens[seq_id][new_length:]

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(self.live()))
        self.arena.free(seq_id)
        self.spec.free(seq_id)
        del self.tokens[seq_id]

    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """Unknown ids, truncating past the end, appending without room: refused, nothing changed."""
        gone = self.next_id + 100  # never used
        kv = np.zeros((1, 1, SHAPE.num_kv_heads, SHAPE.head_dim), np.float32)
        q = np.zeros((1, 1, NUM_HEADS, SHAPE.head_dim), np.float32)
        actions = [
            (UnknownSequenceError, lambda: self.arena.write(0, [gone], kv, kv)),
            (UnknownSequenceError, lambda: self.arena.attention(0, [gone], q, SCALE)),
            (UnknownSequenceError, lambda: self.arena.commit([gone], 1)),
            (UnknownSequenceError, lambda: self.arena.truncate(gone, 0)),
            (UnknownSequenceError, lambda: self.arena.free(gone)),
            (UnknownSequenceError, lambda: self.arena.fork(gone, gone + 1)),
            (UnknownSequenceError, lambda: self.arena.register_tokens(gone, [1])),
        ]
        if self.live():
            seq_id = data.draw(st.sampled_from(self.live()))
            length = self.spec.length(seq_id)
            room = len(self.arena.block_table(seq_id)) * self.arena.block_size - length
            actions += [
                (ValueError, lambda: self.arena.truncate(seq_id, length + 1)),
                (ValueError, lambda: self.arena.commit([seq_id], room + 1)),
                (ValueError, lambda: self.arena.fork(seq_id, seq_id)),
            ]
        error, action = data.draw(st.sampled_from(actions))
        assert_refused(self.arena, error, action)

    @invariant()
    def agrees_with_contiguous(self) -> None:
        if not hasattr(self, "arena"):
            return
        assert_consistent(self.arena)
        assert sorted(self.arena.sequence_ids()) == sorted(self.live())
        for seq_id in self.live():
            assert self.arena.length(seq_id) == self.spec.length(seq_id)
            for layer in range(SHAPE.num_layers):
                k, v = gathered(self.arena, seq_id, layer)
                np.testing.assert_array_equal(k, self.spec.keys(seq_id, layer))
                np.testing.assert_array_equal(v, self.spec.values(seq_id, layer))

    def teardown(self) -> None:
        if not hasattr(self, "arena"):
            return
        for seq_id in self.live():
            self.arena.free(seq_id)
        assert_consistent(self.arena)
        assert self.arena.free_blocks() == self.arena.num_blocks
        assert self.arena.stats().blocks_used == 0


ArenaAgainstContiguous.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestArenaAgainstContiguous = ArenaAgainstContiguous.TestCase


# --- fork and copy-on-write ---------------------------------------------------------------


def arena(block_size: int = 4, num_blocks: int = 32, prefix_caching: bool = True) -> PagedKVArena:
    config = CacheConfig(block_size=block_size, num_blocks=num_blocks, prefix_caching=prefix_caching)
    return PagedKVArena(SHAPE, config, max_context=64)


def prefill(cache, seq_id: int, tokens: list[int], rng=None, start: int | None = None) -> list[np.ndarray]:
    """Reserve and run positions ``start`` (default: the cached length) .. len(tokens) - 1 of ``seq_id``."""
    start = cache.length(seq_id) if start is None else start
    cache.reserve([seq_id], len(tokens) - start)
    return forward(cache, [seq_id], {seq_id: tokens}, len(tokens) - start, rng or np.random.default_rng(0))


def test_fork_shares_blocks_and_the_first_write_copies_the_partial_block() -> None:
    cache = arena()
    tokens = list(range(10))  # blocks 0 and 1 full, block 2 holds 2 of 4
    cache.reserve([0], 0)
    prefill(cache, 0, tokens)
    cache.fork(0, 1)
    shared = cache.block_table(0)
    np.testing.assert_array_equal(cache.block_table(1), shared)
    assert cache.stats().blocks_shared == 3
    source_kv = [gathered(cache, 0, layer) for layer in range(SHAPE.num_layers)]

    prefill(cache, 1, tokens + [7, 7])  # diverges inside the shared partial block

    table = cache.block_table(1)
    np.testing.assert_array_equal(table[:2], shared[:2])
    assert table[2] != shared[2]
    assert cache.stats().blocks_shared == 2
    for layer, (k, v) in enumerate(source_kv):  # the source's tokens are untouched
        np.testing.assert_array_equal(gathered(cache, 0, layer)[0], k)
        np.testing.assert_array_equal(gathered(cache, 0, layer)[1], v)
        np.testing.assert_array_equal(gathered(cache, 1, layer)[0][:10], k)
    cache.truncate(1, 4)  # back to the shared full block: the copy is released
    assert cache.block_table(1).tolist() == shared[:1].tolist()
    cache.free(0)
    cache.free(1)
    assert_consistent(cache)
    assert cache.free_blocks() == cache.num_blocks


def test_truncate_never_touches_a_shared_block() -> None:
    cache = arena()
    tokens = list(range(6))
    cache.reserve([0], 0)
    prefill(cache, 0, tokens)
    cache.fork(0, 1)
    before = cache.k.copy(), cache.v.copy()
    cache.truncate(1, 1)
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.v, before[1])
    assert cache.block_table(1).tolist() == cache.block_table(0)[:1].tolist()
    assert cache.refcounts[cache.block_table(0)].tolist() == [2, 1]


# --- prefix caching ----------------------------------------------------------------------


def run_prompts(prompts: list[list[int]], prefix_caching: bool) -> tuple[PagedKVArena, list[int], list[list]]:
    """Start each prompt with match_prefix and prefill the rest.

    -> (arena, cached tokens per prompt, per prompt and layer the attention output
    [computed positions, H, E]). Queries are fixed per prompt and position, so two
    runs agree wherever both compute a position.
    """
    cache = arena(prefix_caching=prefix_caching)
    cached_counts, outputs = [], []
    for seq_id, prompt in enumerate(prompts):
        cached = cache.match_prefix(seq_id, prompt)
        queries = np.random.default_rng(seq_id).standard_normal((1, len(prompt), NUM_HEADS, SHAPE.head_dim))
        cache.reserve([seq_id], len(prompt) - cached)
        layer_outputs = []
        for layer in range(SHAPE.num_layers):
            k, v = new_kv(prompt, cached, layer)
            cache.write(layer, [seq_id], k[None], v[None])
            layer_outputs.append(cache.attention(layer, [seq_id], queries[:, cached:], SCALE, window=None)[0])
        cache.commit([seq_id], len(prompt) - cached)
        cached_counts.append(cached)
        outputs.append(layer_outputs)
    return cache, cached_counts, outputs


def test_a_shared_three_block_prefix_is_computed_once_with_the_same_outputs() -> None:
    shared = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]  # 3 blocks of 4
    prompts = [shared + [9, 7, 9], shared + [3, 2]]

    cache, cached, outputs = run_prompts(prompts, prefix_caching=True)
    plain, plain_cached, plain_outputs = run_prompts(prompts, prefix_caching=False)

    assert cached == [0, 12] and plain_cached == [0, 0]
    assert cache.stats().prefix_hit_tokens == 12 and plain.stats().prefix_hit_tokens == 0
    assert cache.block_table(1)[:3].tolist() == cache.block_table(0)[:3].tolist()
    assert cache.stats().blocks_shared == 3 and plain.stats().blocks_shared == 0
    for with_cache, without in zip(outputs[1], plain_outputs[1]):  # the second prompt, position 12 on
        np.testing.assert_allclose(with_cache, without[12:], rtol=RTOL, atol=ATOL)
    for layer in range(SHAPE.num_layers):
        np.testing.assert_array_equal(gathered(cache, 1, layer)[0], gathered(plain, 1, layer)[0])


def test_a_fully_cached_prompt_recomputes_its_last_position_without_touching_the_cached_block() -> None:
    cache = arena()
    prompt = list(range(8))  # exactly 2 blocks
    cache.match_prefix(0, prompt)
    prefill(cache, 0, prompt)
    first_table = cache.block_table(0)
    kept = cache.k.copy(), cache.v.copy()

    assert cache.match_prefix(1, prompt) == 7  # the last position is computed again
    prefill(cache, 1, prompt)

    table = cache.block_table(1)
    assert table[0] == first_table[0] and table[1] != first_table[1]  # copy-on-write
    np.testing.assert_array_equal(cache.k[:, first_table], kept[0][:, first_table])
    np.testing.assert_array_equal(cache.v[:, first_table], kept[1][:, first_table])
    for layer in range(SHAPE.num_layers):
        np.testing.assert_array_equal(gathered(cache, 1, layer)[0], gathered(cache, 0, layer)[0])

    cache.free(0)
    cache.free(1)
    assert cache.match_prefix(2, prompt) == 7
    prefill(cache, 2, prompt)  # the only holder reopens the last block: in place, out of the cache until full again
    assert cache.block_table(2).tolist() == first_table.tolist()
    cache.free(2)
    assert cache.match_prefix(3, prompt) == 7
    assert_consistent(cache)


def test_released_cached_blocks_count_as_free_and_are_reused_then_evicted_oldest_first() -> None:
    cache = arena(block_size=4, num_blocks=6)
    old, recent = [1] * 8, [2] * 8
    for seq_id, prompt in enumerate((old, recent)):
        cache.match_prefix(seq_id, prompt)
        prefill(cache, seq_id, prompt)
        cache.free(seq_id)
    stats = cache.stats()
    assert (stats.blocks_used, stats.blocks_free, stats.blocks_cached) == (0, 6, 4)

    assert cache.match_prefix(2, recent + [3]) == 8  # reused from the cache
    assert cache.stats().blocks_cached == 2
    prefill(cache, 2, recent + [3])
    cache.reserve([2], 8)  # takes the last free-list block, then evicts the oldest cached block
    assert cache.stats().blocks_cached == 1
    cache.free(2)
    assert cache.match_prefix(3, old) == 0  # old's first block was evicted, so its chain is gone
    assert_consistent(cache)


def test_truncating_into_cached_blocks_and_diverging_keeps_the_cache_truthful() -> None:
    cache = arena(block_size=4)
    original = list(range(12))  # 3 full blocks, all cached
    cache.match_prefix(0, original)
    prefill(cache, 0, original)
    cache.truncate(0, 6)  # back into the second block, which sequence 0 alone holds
    diverged = original[:6] + [50, 51, 52, 53, 54, 55]
    cache.register_tokens(0, diverged[6:])
    prefill(cache, 0, diverged)

    for prompt in (original, diverged):  # whatever the cache serves must equal a recomputation
        seq_id = 1 + prompt[-1]
        cached = cache.match_prefix(seq_id, prompt + [0])
        for layer in range(SHAPE.num_layers):
            k, v = gathered(cache, seq_id, layer)
            expected_k, expected_v = new_kv(prompt + [0], 0, layer)
            np.testing.assert_array_equal(k, expected_k[:cached])
            np.testing.assert_array_equal(v, expected_v[:cached])
    assert cache.length(1 + original[-1]) == 4 and cache.length(1 + diverged[-1]) == 12
    assert_consistent(cache)


def test_registering_tokens_after_a_gap_is_refused() -> None:
    cache = arena()
    cache.reserve([0], 3)
    forward(cache, [0], {0: [0, 0, 0]}, 3, np.random.default_rng(0))
    assert_refused(cache, ValueError, lambda: cache.register_tokens(0, [4]))
    assert_refused(cache, ValueError, lambda: cache.match_prefix(0, [1, 2]))


# --- refusals -------------------------------------------------------------------------------


def test_out_of_blocks_changes_nothing_for_the_whole_batch() -> None:
    cache = arena(block_size=4, num_blocks=5)
    cache.reserve([0], 0)
    prefill(cache, 0, list(range(6)))  # 2 blocks
    cache.fork(0, 1)  # shares both; a write by 1 needs a copy of the partial block
    # Sequence 2 (new) fits alone, but 1's copy plus 2's blocks need 4 of the 3 free.
    assert_refused(cache, OutOfBlocksError, lambda: cache.reserve([2, 1], 5))
    assert 2 not in cache
    with pytest.raises(ValueError, match="needs 4 blocks; 3 of 5 are free"):
        cache.reserve([2, 1], 5)


def test_appending_to_a_freed_sequence_is_refused() -> None:
    cache = arena()
    cache.reserve([0], 2)
    cache.free(0)
    kv = np.zeros((1, 1, SHAPE.num_kv_heads, SHAPE.head_dim), np.float32)
    assert_refused(cache, UnknownSequenceError, lambda: cache.write(0, [0], kv, kv))
    assert_refused(cache, UnknownSequenceError, lambda: cache.commit([0], 1))
    assert_refused(cache, UnknownSequenceError, lambda: cache.length(0))
    with pytest.raises(KeyError, match="unknown sequence id 0"):
        cache.write(0, [0], kv, kv)


def test_malformed_calls_are_refused_and_name_the_bad_value() -> None:
    cache = arena()
    cache.reserve([0, 1], 2)
    kv = np.zeros((2, 2, SHAPE.num_kv_heads, SHAPE.head_dim), np.float32)
    five_tokens = np.zeros((2, 5, SHAPE.num_kv_heads, SHAPE.head_dim), np.float32)
    q = np.zeros((2, 2, NUM_HEADS, SHAPE.head_dim), np.float32)
    refusals = [
        ("repeat", lambda: cache.reserve([3, 3], 1)),
        ("negative", lambda: cache.reserve([0], -1)),
        ("layer 2", lambda: cache.write(2, [0, 1], kv, kv)),
        (r"\(2, 2, 2, 3\)", lambda: cache.write(0, [0, 1], kv[..., :3], kv[..., :3])),
        ("room for 4 new tokens, not 5", lambda: cache.write(0, [0, 1], five_tokens, five_tokens)),
        ("window must be at least 1, not 0", lambda: cache.attention(0, [0, 1], q, SCALE, window=0)),
        ("softcap must be positive", lambda: cache.attention(0, [0, 1], q, SCALE, softcap=-1.0)),
        ("3 query heads", lambda: cache.attention(0, [0, 1], q[:, :, :3], SCALE)),
        ("already exists", lambda: cache.fork(0, 1)),
        ("cannot truncate sequence 0 of length 0 to 1", lambda: cache.truncate(0, 1)),
    ]
    for message, action in refusals:
        before = snapshot(cache)
        with pytest.raises(ValueError, match=message):
            action()
        assert_same(before, snapshot(cache))


# --- sizing and stats ---------------------------------------------------------------------


def test_sizing_from_blocks_bytes_or_the_default_budget() -> None:
    block_bytes = 4 * SHAPE.bytes_per_token
    assert PagedKVArena(SHAPE, CacheConfig(block_size=4, num_blocks=7), 64).num_blocks == 7
    assert PagedKVArena(SHAPE, CacheConfig(block_size=4, max_bytes=10 * block_bytes + 1), 64).num_blocks == 10
    assert PagedKVArena(SHAPE, CacheConfig(block_size=4), max_context=10).num_blocks == 8 * 3
    big = CacheShape(num_layers=64, num_kv_heads=8, head_dim=128)
    capped = PagedKVArena(big, CacheConfig(block_size=16), max_context=1 << 20)
    assert capped.stats().bytes <= DEFAULT_BUDGET_CAP_BYTES < capped.stats().bytes + 16 * big.bytes_per_token
    with pytest.raises(ValueError, match="max_bytes=1 "):
        PagedKVArena(SHAPE, CacheConfig(max_bytes=1), 64)
    with pytest.raises(ValueError, match="max_context must be at least 1, not 0"):
        PagedKVArena(SHAPE, CacheConfig(), 0)


def test_stats_report_tokens_bytes_and_fragmentation() -> None:
    cache = arena(block_size=4, num_blocks=8)
    cache.reserve([0], 0)
    prefill(cache, 0, list(range(5)))  # 2 blocks, 3 slots unused
    cache.fork(0, 1)
    stats = cache.stats()
    assert (stats.blocks_used, stats.blocks_free, stats.blocks_shared) == (2, 6, 2)
    assert (stats.tokens, stats.unused_slots, stats.fragmentation) == (10, 3, 3 / 8)
    assert stats.bytes == 8 * 4 * SHAPE.bytes_per_token
    cache.reset()
    assert cache.stats() == dataclasses.replace(
        stats, blocks_used=0, blocks_free=8, blocks_shared=0, tokens=0, unused_slots=0, fragmentation=0.0
    )
