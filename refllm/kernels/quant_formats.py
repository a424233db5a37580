"""The table of formats the quantized kernels read, and the dispatch on a format's code built from it.

A format is its module of small functions (``<format>_params``, ``_lane``, ``_lanes16`` and
its family's layout: ``quant_block32.py``, ``quant_kquants.py``) plus one row of ``FORMATS``.
``quant_walks.format_walks`` compiles the row into the format's decoder, decode product and
group sums; a format's code is its row's index, and ``by_code`` turns a column of the table
into one function that takes the code and calls that format's entry. The kernels
(``quant_matmul.py``, ``int8_matmul.py``) branch on nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from numba import njit

from refllm.kernels.quant_block32 import (
    block32_layout,
    q4_0_lane,
    q4_0_lanes16,
    q4_0_params,
    q4_1_lane,
    q4_1_lanes16,
    q4_1_params,
    q5_0_lane,
    q5_0_lanes16,
    q5_0_params,
    q5_1_lane,
    q5_1_lanes16,
    q5_1_params,
    q8_0_lane,
    q8_0_lanes16,
    q8_0_params,
)
from refllm.kernels.quant_kquants import (
    k_pairs_layout,
    k_quads_layout,
    q2_k_lane,
    q2_k_lanes16,
    q2_k_params,
    q3_k_lane,
    q3_k_lanes16,
    q3_k_params,
    q4_k_lane,
    q4_k_lanes16,
    q4_k_params,
    q5_k_lane,
    q5_k_lanes16,
    q5_k_params,
    q6_k_lane,
    q6_k_lanes16,
    q6_k_params,
)
from refllm.kernels.quant_walks import format_walks


class KernelFormat(NamedTuple):
    """One format's compiled walks (``quant_walks.py``)."""

    name: str
    decode: Callable  # (row [R_bytes] uint8, out [C] float32) -> None: the spec's weights, bit for bit
    dot4: Callable  # (four rows, four rows to prefetch, x [C], x_sums [G, 2]) -> four float32 dot products
    sums: Callable  # x [C] -> [G, 2]: per group, the x its first and its second weights meet


def _format(name: str, params, lane, layout, lanes16, shared_scale: bool = False, offset: bool = True) -> KernelFormat:
    return KernelFormat(name, *format_walks(params, lane, layout, lanes16, shared_scale, offset))


# Q4_0, Q5_0, Q8_0, Q3_K and Q6_K weights have no offset (w = a q); the 32-weight blocks share one
# scale between a lane's two weights.
FORMATS = (
    _format("Q4_0", q4_0_params, q4_0_lane, block32_layout, q4_0_lanes16, shared_scale=True, offset=False),
    _format("Q4_1", q4_1_params, q4_1_lane, block32_layout, q4_1_lanes16, shared_scale=True),
    _format("Q5_0", q5_0_params, q5_0_lane, block32_layout, q5_0_lanes16, shared_scale=True, offset=False),
    _format("Q5_1", q5_1_params, q5_1_lane, block32_layout, q5_1_lanes16, shared_scale=True),
    _format("Q8_0", q8_0_params, q8_0_lane, block32_layout, q8_0_lanes16, shared_scale=True, offset=False),
    _format("Q2_K", q2_k_params, q2_k_lane, k_quads_layout, q2_k_lanes16),
    _format("Q3_K", q3_k_params, q3_k_lane, k_quads_layout, q3_k_lanes16, offset=False),
    _format("Q4_K", q4_k_params, q4_k_lane, k_pairs_layout, q4_k_lanes16),
    _format("Q5_K", q5_k_params, q5_k_lane, k_pairs_layout, q5_k_lanes16),
    _format("Q6_K", q6_k_params, q6_k_lane, k_quads_layout, q6_k_lanes16, offset=False),
)
KERNEL_FORMATS = tuple(entry.name for entry in FORMATS)
FORMAT_CODES = {name: code for code, name in enumerate(KERNEL_FORMATS)}  # the small int the kernels branch on


def by_code(functions: tuple[Callable, ...]) -> Callable:
    """-> ``call(code, args)``, which returns ``functions[code](*args)`` (``args`` a tuple): a chain of
    comparisons inlined into the caller, each function a compile-time constant of its link, so the
    kernels call every format directly. A code past the table takes the last entry (the codes come
    from ``FORMAT_CODES`` only)."""

    def link(code: int) -> Callable:
        function = functions[code]
        if code == len(functions) - 1:

            @njit(inline="always")
            def last(wanted, args):
                return function(*args)

            return last
        rest = link(code + 1)

        @njit(inline="always")
        def call(wanted, args):
            if wanted == code:
                return function(*args)
            return rest(wanted, args)

        return call

    return link(0)


decode_row = by_code(tuple(entry.decode for entry in FORMATS))  # (code, (row, out))
x_sums = by_code(tuple(entry.sums for entry in FORMATS))  # (code, (x,)) -> [G, 2]
dot4_rows = by_code(tuple(entry.dot4 for entry in FORMATS))  # (code, (rows, ahead, x, x_sums)) -> 4 float32
