"""One format's walks over a row of its blocks (decode, the four-row product, x's group sums),
compiled from the format's own small functions.

How a row is walked. A row splits into *groups* read by L *lanes* in lockstep
(SIMD lanes once vectorised). Lane j of group g holds two weights,
w[base + j] and w[base + gap + j] with (base, gap, L) = ``<family>_layout(g)``,
each of the form w = a q + c: a scale a and offset c per group (or per
sub-block), an integer q per weight. Per format,

    <format>_params(row, g)        -> (a_first, c_first, a_second, c_second, bits), read once a group
    <format>_lane(row, g, j, bits) -> (q_first, q_second), integers as float32

and ``format_walks`` builds the format's decoder from them. The ``_params`` are inlined by
Numba (``inline="always"``): as calls, their five-field tuple went through memory every
group, and Q4_K's product ran at a third of its speed. With
``<format>_lanes16(row, g, lane, bits)``, 16 lanes at once as vectors of
``refllm/kernels/intrinsics.py``, it builds the format's decode product
(``_vector_dot4``): 16 lane sums per row kept across the groups and added up once
per row. The families (``quant_block32.py``, ``quant_kquants.py``):

    32-weight blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0)  group = block g; L = 16, gap 16
    Q4_K, Q5_K                                    group = a pair of 32-weight sub-blocks
                                                  (low and high nibbles of the same 32 bytes); L = 32, gap 32
    Q2_K, Q3_K, Q6_K                              group = two 16-weight sub-blocks 64 apart
                                                  that share their bytes; L = 16, gap 64

a, c and q are the spec's numbers, and ``decode`` computes a q + c with the spec's float32
operations, in functions compiled without fast-math (a caller's flags do not reach into them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from refllm.kernels.intrinsics import (
    CACHE_LINE,
    LANES,
    broadcast16,
    load16,
    mul16,
    multiply_add16,
    prefetch,
    sum16,
    zeros16,
)


def _walks(params, lane, layout):
    """-> (decode, sums) of one format. The functions are compile-time constants here
    (closure variables), so each walk is compiled with direct calls into them, which LLVM inlines.
    """

    @njit
    def decode(row: np.ndarray, out: np.ndarray) -> None:
        """row [R_bytes] uint8 -> out [C] float32, the spec's weights bit for bit."""
        _, _, lanes = layout(0)
        # The same number, but one LLVM cannot fold to a constant: a constant 16 or 32 gets the
        # lane loop fully unrolled into scalar code before the loop vectoriser sees it.
        opaque_lanes = min(lanes, out.shape[0])
        for g in range(out.shape[0] // (2 * lanes)):
            base, gap, lanes = layout(g)
            a_first, c_first, a_second, c_second, bits = params(row, g)
            for j in range(opaque_lanes):
                q_first, q_second = lane(row, g, j, bits)
                out[np.uint64(base + j)] = a_first * q_first + c_first  # see quant_fields.byte_at
                out[np.uint64(base + gap + j)] = a_second * q_second + c_second

    @njit
    def sums(x: np.ndarray) -> np.ndarray:
        """x [C] -> [G, 2]: per group, the sum of the x its first and its second weights meet."""
        _, _, lanes = layout(0)
        out = np.zeros((x.shape[0] // (2 * lanes), 2), np.float32)
        for g in range(out.shape[0]):
            base, gap, lanes = layout(g)
            for j in range(lanes):
                out[g, 0] += x[base + j]
                out[g, 1] += x[base + gap + j]
        return out

    return decode, sums


def _vector_dot4(params, lanes16, layout, shared_scale: bool, offset: bool):
    """-> dot4 of one format, its lanes as 16-wide vectors (``refllm/kernels/intrinsics.py``).

    Per group, sum_j (a q_j + c) x_j = a (sum_j q_j x_j) + c (sum_j x_j). Each row keeps 16 lane
    sums of a (q x) across its groups and one scalar sum of c (sum x), and adds its lanes once at
    the end. ``shared_scale``: both weights of a lane have the same a (the 32-weight blocks,
    16 lanes a group), so a multiplies their two products at once. Otherwise each sub-block's
    products are summed over its lanes before its a multiplies them (Q4_K and Q5_K have 32):
    scaling each product apart put Gemma 3's decode logits 1.5x further from float64 truth. ``offset``: the format's weights have an offset c;
    without one, c = -0.0 adds nothing, and skipping its sums took 7% off the Q8_0 LM head's time.

    Left to LLVM, a lane loop added up its lanes in every group: spelled out, the product streams
    1.4 to 1.7x the weights per second of that one for the 32-weight formats (one core and two,
    1536 x 576 matrices from DRAM; Q4_1 from 13.6 to 21.9 G/s on two), 1.6x for Q2_K and Q3_K,
    1.9x for Q6_K (1536 x 1024), and 2.6x for Q4_K once its params were inlined.

    Each row also prefetches, as it goes, the bytes of a row ``ahead`` at the same place: one
    cache line's worth of groups a prefetch. The hints then trickle out at the pace the weights are
    read, where four whole rows asked for at once waited on each other (Q8_0 from DRAM: 1.5 to
    1.8x the bytes per second, on one core and on two).
    """

    @njit(inline="always")
    def add_group(row: np.ndarray, g: int, x: np.ndarray, x_sums: np.ndarray, lanes, offsets: float) -> tuple:
        """A row's 16 lane sums and its offset sum, with group g added."""
        base, gap, num_lanes = layout(g)
        a_first, c_first, a_second, c_second, bits = params(row, g)
        q_first, q_second = lanes16(row, g, 0, bits)
        x_first, x_second = load16(x, base), load16(x, base + gap)
        if shared_scale:
            products = multiply_add16(q_second, x_second, mul16(q_first, x_first))
            lanes = multiply_add16(broadcast16(a_first), products, lanes)
        else:
            first, second = mul16(q_first, x_first), mul16(q_second, x_second)
            for lane in range(LANES, num_lanes, LANES):  # Q4_K and Q5_K: a second vector of lanes
                q_first, q_second = lanes16(row, g, lane, bits)
                first = multiply_add16(q_first, load16(x, base + lane), first)
                second = multiply_add16(q_second, load16(x, base + gap + lane), second)
            lanes = multiply_add16(broadcast16(a_second), second, lanes)
            lanes = multiply_add16(broadcast16(a_first), first, lanes)
        if offset:
            offsets += c_first * x_sums[g, 0] + c_second * x_sums[g, 1]
        return lanes, offsets

    @njit
    def dot4(
        rows: tuple, ahead: tuple, x: np.ndarray, x_sums: np.ndarray
    ) -> tuple[np.float32, np.float32, np.float32, np.float32]:
        """Four rows [R_bytes] uint8 . x [C] float32 -> four float32, prefetching the four rows ``ahead``."""
        row0, row1, row2, row3 = rows
        ahead0, ahead1, ahead2, ahead3 = ahead
        num_groups, num_bytes = x_sums.shape[0], row0.shape[0]
        groups_per_line, to_next_line = max(1, CACHE_LINE * num_groups // max(num_bytes, 1)), 0
        lanes0 = lanes1 = lanes2 = lanes3 = zeros16()
        offsets0 = offsets1 = offsets2 = offsets3 = np.float32(0.0)
        for g in range(num_groups):
            if to_next_line == 0:  # a countdown, not g % groups_per_line: no division a group
                at, to_next_line = g * num_bytes // num_groups, groups_per_line
                prefetch(ahead0, at)
                prefetch(ahead1, at)
                prefetch(ahead2, at)
                prefetch(ahead3, at)
            to_next_line -= 1
            lanes0, offsets0 = add_group(row0, g, x, x_sums, lanes0, offsets0)
            lanes1, offsets1 = add_group(row1, g, x, x_sums, lanes1, offsets1)
            lanes2, offsets2 = add_group(row2, g, x, x_sums, lanes2, offsets2)
            lanes3, offsets3 = add_group(row3, g, x, x_sums, lanes3, offsets3)
        return sum16(lanes0) + offsets0, sum16(lanes1) + offsets1, sum16(lanes2) + offsets2, sum16(lanes3) + offsets3

    return dot4


def format_walks(params, lane, layout, lanes16, shared_scale: bool = False, offset: bool = True):
    """-> (decode, dot4, sums) of one format."""
    decode, sums = _walks(params, lane, layout)
    return decode, _vector_dot4(params, lanes16, layout, shared_scale, offset), sums
