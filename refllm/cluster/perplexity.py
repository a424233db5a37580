"""``refllm perplexity`` on a Ray cluster, a shard being a run of windows.

Each window carries its overlap (the tokens before the first it scores), so a
shard needs nothing from another. A shard runs ``window_nll`` for its windows,
the function the single-process ``perplexity`` runs; the driver sums the
windows' NLLs in window order with ``combine``, so the perplexity is the
single-process float, not just close to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refllm import catalog
from refllm.cluster import LOCAL
from refllm.cluster.pool import run_shards
from refllm.cluster.shards import Shard, ShardResult, ShardStore, file_identity, split
from refllm.loading import open_source
from refllm.models.decoder import DecoderModel
from refllm.runtime.perplexity import combine, first_scored, sliding_windows, window_cache, window_nll


@dataclass(frozen=True)
class PerplexityJob:
    model: str  # a catalog name (pulled on each node) or a path readable on every node
    precision: dict  # open_source's ``quantized`` and ``dtype``, DecoderModel.load's ``reference``
    ids: np.ndarray  # [T]
    window: int
    stride: int
    cache_kind: str

    def load(self):
        quantized, dtype, reference = (self.precision[k] for k in ("quantized", "dtype", "reference"))
        path = catalog.pull(self.model) if self.model in catalog.CATALOG else self.model
        model = DecoderModel.load(open_source(path, quantized=quantized, dtype=dtype), dtype, reference)
        spans = sliding_windows(len(self.ids), self.window, self.stride)
        return model, window_cache(model, self.window, self.cache_kind), spans, first_scored(spans)

    def run(self, state, shard: Shard) -> tuple[dict[str, np.ndarray], dict[str, str], int]:
        model, cache, spans, firsts = state
        windows = [window_nll(model, cache, self.ids, *spans[j], firsts[j]) for j in shard.items]
        nll, scored = np.array([w[0] for w in windows], np.float64), np.array([w[1] for w in windows], np.int64)
        return {"nll": nll, "scored": scored}, {}, int(scored.sum())


def perplexity_on_ray(
    model: str,
    precision: dict,
    ids: list[int],
    window: int,
    stride: int,
    cache_kind: str = "paged",
    address: str = LOCAL,
    workers: int | None = None,
    shard_size: int = 1,
    shards: str | Path | None = None,
    on_result: Callable[[ShardResult], None] | None = None,
) -> tuple[float, int]:
    """``perplexity`` on a Ray cluster -> (perplexity, tokens scored); ``shards`` keeps finished ones to resume."""
    ids = np.asarray(ids)
    manifest = {"job": "perplexity", "model": model, "window": str(window), "stride": str(stride)}
    # a catalog model is its pinned sha256; a path, its files' names, sizes and modification times
    manifest["model_identity"] = catalog.entry(model).sha256 if model in catalog.CATALOG else file_identity(model)
    manifest |= {k: str(v) for k, v in precision.items()} | {"cache": cache_kind, "shard_size": str(shard_size)}
    manifest["ids_sha256"] = hashlib.sha256(ids.astype("<i8").tobytes()).hexdigest()
    store = None if shards is None else ShardStore(shards, manifest)
    job = PerplexityJob(model, precision, ids, window, stride, cache_kind)
    windows = split(len(sliding_windows(len(ids), window, stride)), shard_size)
    run = run_shards(job, windows, store, address, workers, "perplexity", on_result)
    in_order = []
    for i in sorted(run.results):
        in_order += zip(run.results[i].tensors["nll"].tolist(), run.results[i].tensors["scored"].tolist())
    if store is not None:
        store.remove()
    return combine(in_order)
