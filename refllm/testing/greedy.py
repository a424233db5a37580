"""Greedy-sequence comparison that forgives a divergence only at a near-tie.

Two correct backends may pick different tokens where the top candidates are
(nearly) tied, and from there on their continuations differ for good reason.
The rule (the one vLLM's model tests use): walk both greedy sequences; at the
first step where the tokens differ, the divergence is tolerated if each
side's token is among the other side's ``top_n`` candidates at that step, and
comparison stops there. Otherwise it is a real divergence, reported with both
sides' candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GreedyComparison:
    tokens_a: list[int]
    tokens_b: list[int]
    step: int | None  # first step where the tokens differ; None if they never do
    near_tie: bool  # whether that difference is forgiven
    top_a: list[int]  # each side's top candidates at ``step`` (empty if no difference)
    top_b: list[int]

    @property
    def ok(self) -> bool:
        return self.step is None or self.near_tie

    def describe(self, a: str = "backend", b: str = "reference") -> str:
        if self.step is None:
            return f"greedy: all {len(self.tokens_a)} tokens agree"
        where = f"step {self.step} ({a} {self.tokens_a[self.step]}, {b} {self.tokens_b[self.step]})"
        if self.near_tie:
            return f"greedy: {self.step} tokens agree, then a near-tie at {where}; compared no further"
        return (
            f"greedy: first real divergence at {where}, after {self.tokens_a[: self.step]};"
            f" {a}'s top {len(self.top_a)}: {self.top_a}, {b}'s top {len(self.top_b)}: {self.top_b}"
        )


def top_candidates(logits: np.ndarray, n: int) -> np.ndarray:
    """logits [..., V] -> ids of the n largest, best first, [..., n] (ties: lower id first)."""
    return np.argsort(-np.asarray(logits), axis=-1, kind="stable")[..., :n]


def greedy_tokens(
    backend, prompt: Sequence[int], new_tokens: int, top_n: int, cached: bool | None = None
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation of ``prompt`` -> (tokens [N], top candidates at each step [N, top_n]).

    ``cached``: decode through a cache id (the default where the backend has them), else run the whole
    sequence again at every step."""
    tokens, tops = [], []
    if backend.has_cache_ids if cached is None else cached:
        logits = backend.prefill(0, list(prompt))
        try:
            for step in range(new_tokens):
                tops.append(top_candidates(logits, top_n))
                tokens.append(int(tops[-1][0]))
                if step + 1 < new_tokens:
                    logits = backend.decode(0, tokens[-1])
        finally:
            backend.release(0)
    else:
        for _ in range(new_tokens):
            tops.append(top_candidates(backend.last_logits([*prompt, *tokens]), top_n))
            tokens.append(int(tops[-1][0]))
    return tokens, np.array(tops).reshape(new_tokens, top_n)


def compare_greedy_outputs(
    tokens_a: Sequence[int], top_a: np.ndarray, tokens_b: Sequence[int], top_b: np.ndarray, top_n: int
) -> GreedyComparison:
    """Apply the near-tie rule to two greedy sequences and their per-step candidates ([N, >= top_n])."""
    for step, (a, b) in enumerate(zip(tokens_a, tokens_b)):
        if a != b:
            cand_a, cand_b = [int(t) for t in top_a[step][:top_n]], [int(t) for t in top_b[step][:top_n]]
            near_tie = a in cand_b and b in cand_a
            return GreedyComparison(list(tokens_a), list(tokens_b), step, near_tie, cand_a, cand_b)
    return GreedyComparison(list(tokens_a), list(tokens_b), None, False, [], [])


def compare_greedy(a, b, prompt: Sequence[int], new_tokens: int, top_n: int) -> GreedyComparison:
    """Greedy-decode ``prompt`` on two backends and compare under the near-tie rule.

    ``b`` decodes the way ``a`` can: through a cache, or the whole sequence at every step (which on a
    dynamic-NTK model rotates every key anew, as a cache does not; ``history.py``)."""
    tokens_a, top_a = greedy_tokens(a, prompt, new_tokens, top_n)
    tokens_b, top_b = greedy_tokens(b, prompt, new_tokens, top_n, cached=a.has_cache_ids)
    return compare_greedy_outputs(tokens_a, top_a, tokens_b, top_b, top_n)
