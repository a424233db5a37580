"""Sliding-window perplexity, as transformers' recipe computes it, over any GenerativeModel."""

from __future__ import annotations

import math

import numpy as np

from refllm.kv import CacheConfig
from refllm.kv.base import blocks_for
from refllm.models.contract import GenerativeModel


def sliding_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """[begin, end) of each window: starts ``stride`` apart, until one reaches the last token."""
    spans = []
    for begin in range(0, num_tokens, stride):
        spans.append((begin, min(begin + window, num_tokens)))
        if spans[-1][1] == num_tokens:
            break
    return spans


def first_scored(spans: list[tuple[int, int]]) -> list[int]:
    """The first position each window scores: none an earlier window scored, never the window's own first token."""
    ends = [0] + [end for _, end in spans[:-1]]
    return [max(scored_end, begin + 1) for (begin, _), scored_end in zip(spans, ends)]


def window_cache(model: GenerativeModel, window: int, cache_kind: str = "paged"):
    """A KV cache for one window at a time, reused by every window."""
    block_size = CacheConfig().block_size
    return model.create_kv_cache(
        CacheConfig(kind=cache_kind, num_blocks=blocks_for(window, block_size), prefix_caching=False)
    )


def window_nll(model: GenerativeModel, cache, ids: np.ndarray, begin: int, end: int, first: int) -> tuple[float, int]:
    """Negative log-likelihood of tokens [first, end) of ``ids`` [T], each from the logits of the position
    before it, with context from ``begin`` on -> (summed NLL, tokens scored)."""
    logits = model.prefill_all_logits(ids[None, begin:end], cache, range(end - begin))[0]  # [end - begin, V]
    cache.free(0)
    targets = np.arange(first, end)  # absolute positions scored in this window
    rows = logits[targets - 1 - begin]  # [n, V]: position t - 1 predicts token t
    top = rows.max(axis=1)
    log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return float(np.sum(log_z - rows[np.arange(len(targets)), ids[targets]], dtype=np.float64)), len(targets)


def combine(windows: list[tuple[float, int]]) -> tuple[float, int]:
    """Each window's (NLL, tokens scored), in window order -> (perplexity, tokens scored).

    The sum runs in window order, so windows computed anywhere give the same float.
    """
    nll, scored = 0.0, 0
    for window_sum, window_scored in windows:
        nll, scored = nll + window_sum, scored + window_scored
    return math.exp(nll / scored), scored


def perplexity(
    model: GenerativeModel, ids: list[int], window: int, stride: int, cache_kind: str = "paged", advance=None
) -> tuple[float, int]:
    """Sliding-window perplexity of ``ids`` [T] -> (perplexity, tokens scored).

    transformers' recipe: each window scores only the tokens no earlier window
    scored (after the first, at most its last ``stride``), each from the logits
    of the position before it, so a token is scored once, with up to
    ``window - 1`` tokens of context; a window's first token is never scored.
    ``advance`` is called once per window (a progress bar's ``update``).
    """
    cache = window_cache(model, window, cache_kind)
    ids = np.asarray(ids)
    spans = sliding_windows(len(ids), window, stride)
    windows = []
    for (begin, end), first in zip(spans, first_scored(spans)):
        windows.append(window_nll(model, cache, ids, begin, end, first))
        if advance is not None:
            advance()
    return combine(windows)
