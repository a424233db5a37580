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
    block_size = CacheConfig().block_size
    cache = model.create_kv_cache(
        CacheConfig(kind=cache_kind, num_blocks=blocks_for(window, block_size), prefix_caching=False)
    )
    ids = np.asarray(ids)
    nll, scored, scored_end = 0.0, 0, 0  # tokens before scored_end have been scored (or cannot be)
    for begin, end in sliding_windows(len(ids), window, stride):
        logits = model.prefill_all_logits(ids[None, begin:end], cache, range(end - begin))[0]  # [T, V]
        cache.free(0)
        targets = np.arange(max(scored_end, begin + 1), end)  # absolute positions scored in this window
        rows = logits[targets - 1 - begin]  # [n, V]: position t - 1 predicts token t
        top = rows.max(axis=1)
        log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
        nll += float(np.sum(log_z - rows[np.arange(len(targets)), ids[targets]], dtype=np.float64))
        scored, scored_end = scored + len(targets), end
        if advance is not None:
            advance()
    return math.exp(nll / scored), scored
