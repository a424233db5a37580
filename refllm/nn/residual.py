"""Where a decoder block's norms sit around its attention and MLP sublayers, and how their outputs join the stream.

    pre-norm   x + f(norm(x))
    sandwich   x + norm_after(f(norm_before(x)))
    post-norm  x + norm(f(x))
    parallel   x + attention(norm(x)) + mlp(norm(x))

A post-norm normalises the sublayer's output before the residual add,
not the sum (the original Transformer's norm(x + f(x))): the residual stream
itself is never normalised until the final norm. The first three apply
``residual_block`` twice per layer, once around attention and once around the
MLP; a parallel layer feeds one normed copy of x to both sublayers and adds
both outputs at once (``parallel_residual_block``). A residual scale multiplies
each sublayer's output before the add (``scale``). Which placement a model uses
is its family's recipe (``refllm/families/``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Sublayer = Callable[[np.ndarray], np.ndarray]


def residual_block(
    x: np.ndarray,
    sublayer: Sublayer,
    norm_before: Sublayer | None,
    norm_after: Sublayer | None,
    scale: float | None = None,
) -> np.ndarray:
    """x: [B, T, D] -> x + scale * norm_after(sublayer(norm_before(x))), a missing norm or scale skipped."""
    h = sublayer(norm_before(x) if norm_before is not None else x)
    h = norm_after(h) if norm_after is not None else h
    return x + (h if scale is None else h * scale)


def parallel_residual_block(x: np.ndarray, sublayers: Sequence[Sublayer], norm: Sublayer) -> np.ndarray:
    """x: [B, T, D] -> x + f_1(norm(x)) + f_2(norm(x)) + ..., the sublayers added in order."""
    h = norm(x)
    for sublayer in sublayers:
        x = x + sublayer(h)
    return x
