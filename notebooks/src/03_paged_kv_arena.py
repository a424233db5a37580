# %% [markdown]
# # 03 · The paged KV arena
#
# During generation every layer keeps the keys and values of all earlier tokens: the
# KV cache. `PagedKVArena` (`refllm/kv/paged.py`, `docs/kv-cache.md`) stores them for
# many sequences in two flat arrays cut into fixed-size **blocks**:
#
# $$\texttt{k}, \texttt{v} : [L, N, S, K, E] \qquad \text{(layers, blocks, slots per block, KV heads, head dim)}$$
#
# A sequence is a **block table** (block ids in position order) and a length.
# Position $p$ lives in block $\text{table}[\lfloor p / S \rfloor]$ at offset
# $p \bmod S$, so sequences grow a block at a time and never move.
#
# Here a tiny arena of 8 blocks of 4 slots. Instead of a model's keys, each slot stores
# two numbers we can read back: which sequence wrote it, and at which position.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from refllm.kv import CacheConfig, CacheShape
from refllm.kv.paged import PagedKVArena
from refllm.nn.attention import attention

shape = CacheShape(num_layers=1, num_kv_heads=1, head_dim=2)
arena = PagedKVArena(shape, CacheConfig(block_size=4, num_blocks=8), max_context=32)
print("arena.k", arena.k.shape, "  [L, N, S, K, E]")
NAMES = {1: "a", 2: "b", 3: "c"}  # sequence ids are ints


def append(seq, n):
    """Feed n tokens to sequence seq as a forward pass does: reserve, write every layer, commit."""
    start = arena.length(seq) if seq in arena else 0
    arena.reserve([seq], n)  # takes blocks (and copies shared ones); all or nothing
    kv = np.zeros((1, n, 1, 2), np.float32)  # [B, T, K, E]
    kv[0, :, 0, 0] = seq  # who wrote the slot ...
    kv[0, :, 0, 1] = np.arange(start, start + n)  # ... and for which position
    for layer in range(shape.num_layers):
        arena.write(layer, [seq], kv, kv)
    arena.commit([seq], n)  # the n tokens now count in the length

# %% [markdown]
# A picture helps: on the left the block tables (one row per sequence, one cell per
# table entry, the block id inside), on the right the blocks themselves, each slot
# labelled with what `arena.k` holds there (`a9` = sequence a, position 9), each block
# with its reference count: how many tables hold it (held blocks have a bold outline).

# %%
def draw(arena, title):
    seqs = arena.sequence_ids()
    N, S = arena.num_blocks, arena.block_size
    colors = plt.get_cmap("tab10")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw=dict(width_ratios=[1, 2]))
    width = max(len(arena.block_table(s)) for s in seqs)
    for row, seq in enumerate(seqs):
        for col, block in enumerate(arena.block_table(seq)):
            left.add_patch(plt.Rectangle((col, row), 1, 1, color=colors(block), alpha=0.5))
            left.text(col + 0.5, row + 0.5, str(block), ha="center", va="center", fontsize=12)
    left.set(xlim=(0, width), ylim=(len(seqs), 0), title="block tables", xlabel="table index  (position // S)")
    left.set_xticks(np.arange(width) + 0.5, range(width))
    left.set_yticks(np.arange(len(seqs)) + 0.5, [f"{NAMES[s]} (length {arena.length(s)})" for s in seqs])
    filled = np.zeros((N, S), bool)  # slots below some holder's length
    for seq in seqs:
        for p in range(arena.length(seq)):
            filled[arena.block_table(seq)[p // S], p % S] = True
    for block in range(N):
        held = arena.refcounts[block] > 0
        right.add_patch(plt.Rectangle((0, block), S, 1, fill=False, linewidth=2 if held else 0.5))
        for slot in range(S):
            writer, position = arena.k[0, block, slot, 0]
            if filled[block, slot]:
                right.add_patch(plt.Rectangle((slot, block), 1, 1, color=colors(block), alpha=0.5))
                label = f"{NAMES[int(writer)]}{int(position)}"
                right.text(slot + 0.5, block + 0.5, label, ha="center", va="center")
        right.text(S + 0.2, block + 0.5, f"refs {arena.refcounts[block]}", va="center")
    right.set(xlim=(0, S + 1.2), ylim=(N, 0), title="arena.k[0]: blocks x slots", xlabel="slot (position % S)")
    right.set_xticks(np.arange(S) + 0.5, range(S))
    right.set_yticks(np.arange(N) + 0.5, [f"block {b}" for b in range(N)])
    fig.suptitle(title)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ## Two sequences grow side by side
#
# Sequence a takes 4 tokens, then b takes 4, then a 6 more and b 2 more. Blocks are
# taken from the free list as they are needed, so the two interleave in the arena;
# the block tables keep each one in order.

# %%
append(1, 4); append(2, 4); append(1, 6); append(2, 2)
print("a:", arena.block_table(1), " b:", arena.block_table(2))
draw(arena, "a (10 tokens) and b (6 tokens)")

# %% [markdown]
# The attention kernels find position $p$ through the table, at
# $\text{slot}(p) = \text{table}[\lfloor p / S \rfloor] \cdot S + p \bmod S$. Gathering a's
# blocks in table order gives its keys in position order:

# %%
table, length = arena.block_table(1), arena.length(1)
keys = arena.k[0, table].reshape(-1, 1, 2)  # [blocks, S, K, E] -> [blocks * S, K, E]
print("positions of a's keys, gathered in table order:", keys[:length, 0, 1].astype(int))
assert np.array_equal(keys[:length, 0, 1], np.arange(length))

# %% [markdown]
# The kernel never gathers: it reads the blocks in place. A forward pass reserves room
# for the new token, writes its key and value, and asks for attention *before* it
# commits. Doing the same for one query (two heads sharing the KV head) at position 10
# gives what the NumPy spec attention gives over the gathered keys. Without a
# `commit` the token never counts: a still holds 10 tokens afterwards.

# %%
q = np.array([[[[0.3, -0.2], [0.1, 0.4]]]], np.float32)  # [B, T, H, E]: one token, 2 query heads
kv = np.array([[[[1, length]]]], np.float32)  # [B, T, K, E]: its key and value
arena.reserve([1], 1)
arena.write(0, [1], kv, kv)
paged = arena.attention(0, [1], q, scale=0.5)  # [B, T, H, E]: keys 0..10 read through the table

table = arena.block_table(1)
gathered_k = arena.k[0, table].reshape(-1, 1, 2)[: length + 1]  # [11, K, E]
gathered_v = arena.v[0, table].reshape(-1, 1, 2)[: length + 1]
spec = attention(q[0], gathered_k, gathered_v, query_positions=np.array([length]), scale=0.5)
np.testing.assert_allclose(paged[0], spec, rtol=1e-5, atol=1e-6)
assert arena.length(1) == 10
print("paged kernel:", paged.ravel().round(4), " spec:", spec.ravel().round(4))

# %% [markdown]
# ## Block by block, as the kernel does
#
# The paged decode kernel (`paged_decode_attention` in `refllm/kernels/attention.py`)
# does not gather either. It walks the sequence's block table and reads each block's
# slots in place, folding them into a running softmax: the largest score so far $m$,
# the sum $l$ of $e^{s - m}$ so far, and the weighted sum of values so far, each
# rescaled by $e^{m_\text{old} - m_\text{new}}$ when a block brings a larger score. At
# the end, out $= \text{acc} / l$: the softmax, without ever holding all the scores.
# The same walk in NumPy, for the query above:

# %%
def attend_block_by_block(arena, seq, q, scale, num_keys):
    """One query q [H, E] over positions 0 .. num_keys-1 of seq, one block of its table at a time."""
    S = arena.block_size
    m = np.full(len(q), -np.inf)  # [H]: the largest score so far
    l = np.zeros(len(q))  # [H]: sum of exp(score - m) so far
    acc = np.zeros(q.shape)  # [H, E]: sum of exp(score - m) * value so far
    steps = []
    for index, block in enumerate(arena.block_table(seq)):
        first = index * S  # the position of the block's slot 0
        n = min(S, num_keys - first)  # slots in use in this block
        if n <= 0:
            break
        k, v = arena.k[0, block, :n, 0], arena.v[0, block, :n, 0]  # [n, E], read in place (one KV head)
        scores = (q @ k.T) * scale  # [H, n]
        new_m = np.maximum(m, scores.max(axis=1))
        rescale = np.exp(m - new_m)  # what the sums so far are worth against the new maximum
        e = np.exp(scores - new_m[:, None])
        l, acc, m = l * rescale + e.sum(axis=1), acc * rescale[:, None] + e @ v, new_m
        steps.append(dict(block=int(block), positions=(first, first + n - 1), m=m.copy(), l=l.copy()))
    return acc / l[:, None], steps


walked, steps = attend_block_by_block(arena, 1, q[0, 0], 0.5, length + 1)
for step in steps:
    print(f"block {step['block']}: positions {step['positions']}, running max {step['m'].round(3)},"
          f" running sum {step['l'].round(3)}")
np.testing.assert_allclose(walked, paged[0, 0], rtol=1e-5, atol=1e-6)

# %% [markdown]
# Where each key's weight comes from: the bars are the final softmax weights of head 0
# over a's 11 positions, coloured by the block the kernel read them from; the line is the
# running sum $l$ after each block (it drops when a block brings a larger maximum, since
# everything before is rescaled down).

# %%
weights = np.exp((q[0, 0] @ gathered_k[:, 0].T) * 0.5)  # [H, 11], softmax numerators
weights /= weights.sum(axis=1, keepdims=True)
colors = plt.get_cmap("tab10")
fig, (bars, running) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw=dict(width_ratios=[2, 1]))
for step in steps:
    first, last = step["positions"]
    span = np.arange(first, last + 1)
    bars.bar(span, weights[0, span], color=colors(step["block"]), label=f"block {step['block']}")
bars.set(xlabel="key position", ylabel="weight (head 0)", title="softmax weights, by the block they came from")
bars.set_xticks(range(length + 1))
bars.legend(fontsize=8)
running.plot(range(len(steps)), [step["l"][0] for step in steps], "o-")
running.set_xticks(range(len(steps)), [f"block {step['block']}" for step in steps])
running.set(title="running sum l after each block (head 0)", ylabel="l")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Fork: share, don't copy
#
# `fork(a, c)` gives c a's whole history without copying a byte: c's table is a's
# table, and every block's reference count goes up.

# %%
arena.fork(1, 3)
print("c:", arena.block_table(3), " refcounts:", arena.refcounts)
assert list(arena.block_table(3)) == list(arena.block_table(1))
draw(arena, "after fork(a, c): blocks 0, 2 and 3 are held twice")

# %% [markdown]
# ## Copy-on-write
#
# Now c takes 2 tokens of its own. They belong in block 3 (slots 2 and 3), but block 3
# is shared with a, whose tokens must not change. So `reserve` first copies the shared
# block into a free one and puts the copy in c's table; a keeps the original. Full
# blocks 0 and 2 stay shared.

# %%
before = arena.k[:, 3].copy()
append(3, 2)
print("a:", arena.block_table(1), " c:", arena.block_table(3), " refcounts:", arena.refcounts)
assert arena.block_table(3)[2] != 3 and arena.refcounts[3] == 1
assert np.array_equal(arena.k[:, 3], before)  # a's block is untouched
draw(arena, "c appended 2 tokens: its part of block 3 was copied first")

# %% [markdown]
# `stats()` summarises the arena. `unused_slots` counts reserved-but-empty slots in
# used blocks (the last block of each sequence is usually part-filled);
# `fragmentation` is their share.

# %%
stats = arena.stats()
print(stats)
assert stats.blocks_used + stats.blocks_free == stats.blocks_total
assert stats.blocks_shared == 2 and stats.tokens == 10 + 6 + 12

# %% [markdown]
# ## Prefix caching
#
# Chats and few-shot prompts repeat long prefixes. A full block whose token ids are
# known gets a key that names the whole prefix up to its end,
#
# $$\text{key}_i = \text{sha256}(\text{key}_{i-1} \,\|\, \text{tokens of block } i),$$
#
# and `match_prefix(seq, prompt)` starts a new sequence on the cached blocks its
# prompt begins with, returning how many tokens need no computing.

# %%
arena.reset()
shared = list(range(100, 112))  # a 12-token prefix: 3 full blocks
prompt_a, prompt_b = shared + [7, 8], shared + [9]

cached = arena.match_prefix(1, prompt_a)  # nothing cached yet
append(1, len(prompt_a) - cached)
print("a: cached", cached, "of", len(prompt_a), "tokens; table", arena.block_table(1))

cached = arena.match_prefix(2, prompt_b)  # a's first 3 blocks match
append(2, len(prompt_b) - cached)
print("b: cached", cached, "of", len(prompt_b), "tokens; table", arena.block_table(2))
assert cached == 12 and list(arena.block_table(2)[:3]) == list(arena.block_table(1)[:3])
draw(arena, "b starts on a's cached prefix: 12 tokens it never computes")
print(arena.stats())

# %% [markdown]
# Freeing a sequence does not forget its keyed blocks: with no holder they are
# *cached and unreferenced*, counted as free, and reused by a later prompt with the
# same prefix until a reservation needs the space.

# %%
arena.free(1); arena.free(2)
stats = arena.stats()
print(f"blocks used {stats.blocks_used}, free {stats.blocks_free} (of which cached {stats.blocks_cached}),"
      f" prefix hit tokens so far {stats.prefix_hit_tokens}")
assert stats.blocks_used == 0 and stats.blocks_cached == 3
print("a third prompt with the same prefix: cached", arena.match_prefix(3, shared + [1]), "tokens")
