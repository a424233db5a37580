"""Decode attention over a paged KV arena: the Numba kernel against NumPy.

One new query token per sequence, a 135M-class shape (9 query heads, 3 KV
heads, head dim 64), block size 16, each sequence's blocks interleaved with
other sequences' blocks (as they are when sequences grow side by side). Three ways to answer:

    numba paged        refllm.kernels.paged_decode_attention over the blocks, in place
    numpy gather       copy each sequence's blocks into contiguous arrays, then the spec
    numpy contiguous   the spec over keys that already sit in one array (ContiguousKVCache)

plus ``arena call``: PagedKVArena.attention, the kernel with the arena's
Python bookkeeping around it.

    python benchmarks/bench_paged_attention.py [--contexts 512 2048 8192] [--batches 1 8] [--rounds 15]

Each figure is the median of every call's time over all rounds, so a call
that waited for a core another process held does not move it. Every method
runs in its own block of calls per round, with a pause between blocks:
NumPy's BLAS threads and Numba's worker threads both spin for a while after
they finish, and on a small machine one pool's spinning would be billed to
the other.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np

from refllm.kernels.attention import paged_decode_attention
from refllm.kv import CacheConfig, CacheShape, PagedKVArena
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.nn.attention import attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
SCALE = HEAD_DIM**-0.5
PAUSE_S = 0.2  # lets the other thread pool fall asleep before a block of calls
BLOCK_S = 0.1  # time spent per method per round (at least 3 calls)


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory instead of handing it back to the OS (True if it agreed).

    NumPy's attention allocates megabytes of temporaries per call. By default
    glibc may return them to the OS on free and page-fault them back in on the
    next call, which made the NumPy columns up to 10x slower, depending on the
    heap's history. The baselines should not pay for that.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_mmap_threshold, 32 << 20))


def call_seconds(call: Callable[[], object]) -> list[float]:
    """Seconds of each call in one block of calls lasting about BLOCK_S (at least 3 calls)."""
    time.sleep(PAUSE_S)
    times: list[float] = []
    while len(times) < 3 or sum(times) < BLOCK_S:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def setup(context: int, batch: int, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    """The four ways to compute one decode step for ``batch`` sequences of ``context`` keys."""
    shape = CacheShape(num_layers=1, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    config = CacheConfig(block_size=BLOCK_SIZE, num_blocks=(batch + 1) * blocks_per_seq)
    arena = PagedKVArena(shape, config, context)
    seq_ids, filler = list(range(batch)), batch
    for blocks in range(1, blocks_per_seq + 1):  # one block each in turn, so no two of a sequence's blocks touch
        arena.reserve([*seq_ids, filler], blocks * BLOCK_SIZE)
    arena.free(filler)
    kv_shape = (batch, context, NUM_KV_HEADS, HEAD_DIM)
    arena.write(0, seq_ids, rng.standard_normal(kv_shape, np.float32), rng.standard_normal(kv_shape, np.float32))
    arena.commit(seq_ids, context - 1)  # the last position is the new token's

    q = rng.standard_normal((batch, NUM_HEADS, HEAD_DIM), np.float32)
    key_cache, value_cache = arena.k[0], arena.v[0]  # [N, S, K, E]
    tables = np.stack([arena.block_table(s) for s in seq_ids])  # [B, blocks] int32
    context_lens = np.full(batch, context, np.int64)
    position = np.array([context - 1])

    def gather(cache: np.ndarray, table: np.ndarray) -> np.ndarray:
        """[N, S, K, E] blocks -> [context, K, E] keys (or values) of one sequence, copied."""
        return cache[table].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:context]

    contiguous = [(gather(key_cache, table), gather(value_cache, table)) for table in tables]

    def numba_paged() -> np.ndarray:
        return paged_decode_attention(q, key_cache, value_cache, tables, context_lens, SCALE, 0, 0.0)

    def numpy_gather() -> list[np.ndarray]:
        return [
            attention(q[b][None], gather(key_cache, table), gather(value_cache, table), position, SCALE)
            for b, table in enumerate(tables)
        ]

    def numpy_contiguous() -> list[np.ndarray]:
        return [attention(q[b][None], keys, values, position, SCALE) for b, (keys, values) in enumerate(contiguous)]

    def arena_call() -> np.ndarray:
        return arena.attention(0, seq_ids, q[:, None], SCALE)

    expected = np.concatenate(numpy_contiguous())
    for method in (numba_paged, numpy_gather, arena_call):  # also warms the JIT up
        np.testing.assert_allclose(np.reshape(method(), expected.shape), expected, rtol=1e-5, atol=1e-6)
    return {
        "numba paged": numba_paged,
        "numpy gather": numpy_gather,
        "numpy contiguous": numpy_contiguous,
        "arena call": arena_call,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    kept = keep_freed_memory()
    rng = np.random.default_rng(0)
    setup(16, 1, rng)  # compiles the kernels, so the threading layer below is the one in use
    print(f"machine: {platform.platform()}; CPU: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'}")
    print(f"numba {numba.__version__} ({numba.threading_layer()} layer), numpy {np.__version__}; {thread_settings()}")
    print(f"glibc keeps freed memory: {'yes' if kept else 'no'}")
    print("load average (1, 5, 15 min) at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"decode, 1 query token: H={NUM_HEADS} K={NUM_KV_HEADS} E={HEAD_DIM} block size {BLOCK_SIZE};"
          f" median over {args.rounds} rounds of per-call times, ms")
    header = f"| batch | context | {' | '.join(['numba paged', 'numpy gather', 'numpy contiguous', 'arena call'])}"
    print(header + " | gather / paged | paged / contiguous |")
    print("|---" * (header.count("|") + 2) + "|")
    for batch in args.batches:
        for context in args.contexts:
            methods = setup(context, batch, rng)
            samples: dict[str, list[float]] = {name: [] for name in methods}
            for _ in range(args.rounds):
                for name, call in methods.items():
                    samples[name] += call_seconds(call)
            ms = {name: 1e3 * statistics.median(times) for name, times in samples.items()}
            cells = " | ".join(f"{ms[name]:.3f}" for name in methods)
            speedup = ms["numpy gather"] / ms["numba paged"]
            slowdown = ms["numba paged"] / ms["numpy contiguous"]
            print(f"| {batch} | {context} | {cells} | {speedup:.1f}x | {slowdown:.2f}x |", flush=True)
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
