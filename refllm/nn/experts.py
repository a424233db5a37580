"""Running routed experts: each token through the experts its router chose, outputs mixed by weight.

    out[t] = sum_j  w[t, j] * expert[ids[t, j]](x[t])        j = 0 .. k-1

where every expert is a gated MLP (``refllm/nn/mlp.py``). The loop runs over
experts, not tokens: for expert e it gathers the tokens that chose it, runs
them through e once, and adds each weighted result back to its token. Experts
no token chose are never read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refllm.nn.mlp import gated_mlp


def experts_forward(
    x: np.ndarray,
    expert_ids: np.ndarray,
    expert_weights: np.ndarray,
    experts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    activation: str = "silu",
) -> np.ndarray:
    """x: [T, D], expert_ids / expert_weights: [T, k], experts: (gate_proj [F, D], up_proj [F, D],
    down_proj [D, F]) per expert -> [T, D]."""
    out = np.zeros_like(x)
    for expert, (gate_proj, up_proj, down_proj) in enumerate(experts):
        tokens, slots = np.nonzero(expert_ids == expert)  # a token picks an expert at most once
        if len(tokens):
            weight = expert_weights[tokens, slots].astype(x.dtype)[:, None]  # [n, 1]
            out[tokens] += weight * gated_mlp(x[tokens], gate_proj, up_proj, down_proj, activation)
    return out
