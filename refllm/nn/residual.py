"""Where a decoder block's RMSNorms sit around its attention or MLP sublayer f.

    pre-norm  (Llama, Qwen, Mistral, Phi-3, SmolLM3):  x + f(norm(x))
    sandwich  (Gemma 2, Gemma 3):                       x + norm_after(f(norm_before(x)))
    post-norm (OLMo 2):                                 x + norm(f(x))

OLMo 2's post-norm normalises the sublayer's output before the residual add,
not the sum (the original Transformer's norm(x + f(x))): the residual stream
itself is never normalised until the final norm. Each layer applies this twice,
once around attention and once around the MLP.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Sublayer = Callable[[np.ndarray], np.ndarray]


def residual_block(
    x: np.ndarray, sublayer: Sublayer, norm_before: Sublayer | None, norm_after: Sublayer | None
) -> np.ndarray:
    """x: [B, T, D] -> x + norm_after(sublayer(norm_before(x))), a missing norm skipped: [B, T, D]."""
    h = sublayer(norm_before(x) if norm_before is not None else x)
    return x + (norm_after(h) if norm_after is not None else h)
