"""Grouped routing: sigmoid scores, a bias that steers the choice only, group-limited top-k.

Letters beyond the legend: X routed experts, G groups of X / G experts, k experts
per token (``num_experts_per_tok``), g groups per token (``topk_group``). For a
token's router logits l = gate(x) [X]:

    score    s = sigmoid(l)                                   [X]   each expert judged alone
    choice   c = s + b                                        b: e_score_correction_bias
    groups   group_score[j] = sum of the 2 largest c in group j
             keep the g groups with the largest group_score; c = -inf elsewhere
    top-k    ids = the k largest c                            (the bias picks ...)
    weights  w = s[ids]                                       (... but never weighs)
             w = w / (sum(w) + 1e-20)                         if norm_topk_prob
             w = w * routed_scaling_factor

The correction bias balances the load across experts during training without
touching the weights the experts' outputs are mixed with. Ties (equal c) go to
the lower expert index, and to the lower group index for equal group scores.
"""

from __future__ import annotations

import numpy as np

from refllm.nn.moe import top_k

TOP_IN_GROUP = 2  # a group is scored by the sum of its two best experts


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, 0
        return 1.0 / (1.0 + np.exp(-x))


def grouped_topk_routing(
    router_logits: np.ndarray,
    correction_bias: np.ndarray,
    experts_per_token: int,
    num_groups: int,
    groups_per_token: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[np.ndarray, np.ndarray]:
    """router_logits: [T, X], correction_bias: [X] -> (expert_ids [T, k] int64, expert_weights [T, k])."""
    tokens, num_experts = router_logits.shape
    scores = sigmoid(router_logits)  # [T, X]
    choice = scores + correction_bias  # [T, X]
    by_group = choice.reshape(tokens, num_groups, num_experts // num_groups)  # [T, G, X / G]
    group_scores = np.sort(by_group, axis=-1)[..., -TOP_IN_GROUP:].sum(axis=-1)  # [T, G]
    kept_groups = top_k(group_scores, groups_per_token)  # [T, g]
    kept = np.zeros((tokens, num_groups), dtype=bool)
    np.put_along_axis(kept, kept_groups, True, axis=-1)
    choice = np.where(np.repeat(kept, num_experts // num_groups, axis=-1), choice, -np.inf)
    expert_ids = top_k(choice, experts_per_token)  # [T, k]
    weights = np.take_along_axis(scores, expert_ids, axis=-1)  # the bias chose; the scores weigh
    if norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return expert_ids, weights * routed_scaling_factor
