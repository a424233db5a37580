"""The LM head: the final hidden state against every token's row, then the family's scaling.

    logits = softcap( scale * (h W^T) )        W: [V, D], the embedding table when tied

``scale`` multiplies the logits (a config's ``logit_scale``, or 1 / ``logits_scaling``
where a config divides), ``softcap`` squashes them into (-cap, cap) (a final
soft-cap, ``refllm/nn/softcap.py``); either may be absent.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refllm.nn.linear import linear
from refllm.nn.softcap import soft_cap


def output_logits(
    hidden: np.ndarray,
    lm_head: np.ndarray,
    scale: float | None = None,
    softcap: float | None = None,
    linear: Callable = linear,
) -> np.ndarray:
    """hidden: [..., D] (after the final norm), lm_head: [V, D] -> logits [..., V]."""
    logits = linear(hidden, lm_head)
    if scale is not None:
        logits = logits * scale
    return logits if softcap is None else soft_cap(logits, softcap)
