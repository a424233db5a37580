"""Mixture of experts: a router picks k of X expert MLPs per token and mixes their outputs.

For a token x (one row of [T, D]) and a sparse layer with router W_r [X, D] (and bias b_r):

    logits   = W_r x + b_r                                     [X]  one score per expert
    ids, w   = route(logits)                                   [k], [k]  which experts, with what weight
    moe(x)   = sum_i  w[i] * expert_{ids[i]}(x)                each expert a gated MLP (refllm/nn/mlp.py)

``mixture_of_experts`` is that, for every token of a batch; the forward pass runs
it with its op set's projections and the routing its family names (the softmax
routings below, or the grouped one of ``refllm/nn/moe_grouped.py``).

Routings:

    softmax_then_topk
        p   = softmax(logits)                   over all X experts
        ids = top_k(p);  w = p[ids]
        w   = w / sum(w)                        only when renormalising (norm_topk_prob)
    topk_then_softmax
        ids = top_k(logits);  w = softmax(logits[ids])       over the k chosen only: the weights sum to 1

Both give the same experts (softmax keeps the order); the weights differ unless renormalised.

Tie rule, part of the spec: ``top_k`` orders experts by descending score and
breaks an exact tie towards the lower expert index (a stable sort), whether a
token runs alone or in a batch. Exact ties are real: sparse upcycling copies
one router row into several experts, and a sigmoid router's scores saturate to
1 (``moe_grouped.py``); the oracle kit draws both and holds backends to this
rule. transformers uses torch.topk, which orders distinct scores the same way
but promises nothing among exact ties (on CPU its pick comes from
std::nth_element); docs/layers/moe.md shows what each side does then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from refllm.nn.attention import softmax
from refllm.nn.linear import linear
from refllm.nn.mlp import MLPWeights, gated_mlp


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """scores: [T, X] -> ids [T, k] int64: the k highest scores per row, highest first, ties to the lower id."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k].astype(np.int64)


def softmax_then_topk(router_logits: np.ndarray, k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: [T, X] -> (expert_ids [T, k] int64, expert_weights [T, k]).

    p = softmax(logits); ids = top_k(p); w = p[ids], divided by sum(w) if ``renormalize``.
    """
    probs = softmax(router_logits)  # [T, X]
    ids = top_k(probs, k)
    weights = np.take_along_axis(probs, ids, axis=-1)  # [T, k]
    if renormalize:
        weights = weights / np.sum(weights, axis=-1, keepdims=True)
    return ids, weights


def topk_then_softmax(router_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: [T, X] -> (expert_ids [T, k] int64, expert_weights [T, k]).

    ids = top_k(logits); w = softmax(logits[ids]).
    """
    ids = top_k(router_logits, k)
    return ids, softmax(np.take_along_axis(router_logits, ids, axis=-1))


def experts_forward(
    x: np.ndarray,
    expert_ids: np.ndarray,
    expert_weights: np.ndarray,
    experts: Sequence[MLPWeights],
    expert_mlp: Callable[[np.ndarray, MLPWeights], np.ndarray] = gated_mlp,
) -> np.ndarray:
    """x: [T, D], expert_ids / expert_weights: [T, k] (from a routing) -> [T, D].

    out[t] = sum_i expert_weights[t, i] * expert_mlp(x[t], experts[expert_ids[t, i]]).
    Expert by expert: gather the tokens routed to it, run its MLP once on them,
    add each result, scaled by its weight, back to its token's row. An expert no
    token chose is never read.
    """
    out = np.zeros_like(x)
    for e, expert in enumerate(experts):
        tokens, slots = np.nonzero(expert_ids == e)  # token t chose expert e as its slots-th pick
        if tokens.size == 0:
            continue
        y = expert_mlp(x[tokens], expert)  # [N, D]
        out[tokens] += expert_weights[tokens, slots, None].astype(x.dtype) * y  # a token picks e at most once
    return out


def mixture_of_experts(
    x: np.ndarray,
    router: np.ndarray,
    router_bias: np.ndarray | None,
    experts: Sequence[MLPWeights],
    route: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    expert_mlp: Callable[[np.ndarray, MLPWeights], np.ndarray] = gated_mlp,
    linear: Callable = linear,
    shared: MLPWeights | None = None,
) -> np.ndarray:
    """x: [..., D] (normed) -> [..., D]: each token routed to its experts, their outputs mixed.

    router: [X, D] (and router_bias [X]); route: router logits [T, X] -> (expert_ids [T, k],
    expert_weights [T, k]), a routing above with its settings bound; expert_mlp: as ``experts_forward``'s;
    linear: the router's projection; shared: shared experts, one MLP every token runs, added to the
    mixture.
    """
    rows = x.reshape(-1, x.shape[-1])  # [T, D]: routing is per token
    expert_ids, expert_weights = route(linear(rows, router, router_bias))
    mixed = experts_forward(rows, expert_ids, expert_weights, experts, expert_mlp).reshape(x.shape)
    return mixed if shared is None else mixed + expert_mlp(x, shared)
