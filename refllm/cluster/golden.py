"""``refllm golden dump`` and ``golden check`` on a Ray cluster, a shard being a run of prompts.

A dump shard runs ``prompt_tensors`` for its prompts, the function the
single-process ``dump`` runs, and the driver stores each shard as it arrives
(in ``OUT.shards/`` unless told otherwise), then merges them into one golden
file and removes the folder: with the same metadata, the file is the
single-process one, byte for byte. A check shard runs ``check_golden_prompt``
for its prompts; the driver puts the reports back in prompt order, so the
report and its KL statistics are the single-process ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refllm.cluster import LOCAL
from refllm.cluster.pool import run_shards
from refllm.cluster.shards import Shard, ShardResult, ShardStore, file_identity, split
from refllm.testing.backends import as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import load_factory
from refllm.testing.golden import (
    DumpOptions,
    Golden,
    Prompt,
    PromptReport,
    check_golden_prompt,
    golden_metadata,
    golden_reference,
    prompt_tensors,
    write_golden,
)
from refllm.testing.tolerances import get_profile


@dataclass(frozen=True)
class GoldenDumpJob:
    model: str
    dtype: str
    options: DumpOptions
    prompts: list[Prompt]

    def load(self):
        checkpoint = Checkpoint.open(self.model, self.dtype)
        return golden_reference(checkpoint, self.dtype), checkpoint.config.context_length

    def run(self, state, shard: Shard) -> tuple[dict[str, np.ndarray], dict[str, str], int]:
        reference, context = state
        tensors = {}
        for i in shard.items:
            tensors |= prompt_tensors(reference, context, i, self.prompts[i], self.options)
        tokens = sum(len(self.prompts[i].token_ids) + self.options.new_tokens for i in shard.items)
        return tensors, {}, tokens


def dump_on_ray(
    checkpoint: Checkpoint,
    prompts: list[Prompt],
    out: str | Path,
    model: str,
    profile: str = "float32",
    options: DumpOptions = DumpOptions(),
    dtype: str = "float32",
    address: str = LOCAL,
    workers: int | None = None,
    shard_size: int = 1,
    shards: str | Path | None = None,
    on_result: Callable[[ShardResult], None] | None = None,
) -> tuple[dict[str, str], int]:
    """``golden.dump`` on a Ray cluster -> (the file's metadata, shards computed by this call, not resumed).

    Finished shards are kept in ``shards`` (default ``OUT.shards``) until the file is written.
    """
    metadata = golden_metadata(checkpoint, prompts, model, profile, options, dtype)
    listed = json.dumps([[p.text, p.token_ids] for p in prompts]).encode()
    manifest = {k: v for k, v in metadata.items() if k != "prompts"} | {
        "job": "golden dump",
        "positions": str(options.positions),
        "hidden_states": str(options.hidden_states),
        "prompts_sha256": hashlib.sha256(listed).hexdigest(),
        "shard_size": str(shard_size),
    }
    store = ShardStore(shards or f"{out}.shards", manifest)
    job = GoldenDumpJob(model, dtype, options, prompts)
    run = run_shards(job, split(len(prompts), shard_size), store, address, workers, "golden dump", on_result)
    tensors = {}
    for index in sorted(run.results):
        tensors |= run.results[index].tensors
    write_golden(tensors, metadata, out)
    store.remove()
    return metadata, run.computed


@dataclass(frozen=True)
class GoldenCheckJob:
    golden: str  # the golden file's path, readable on every node
    model: str
    backend: str  # module:factory
    profile: str

    def load(self):
        golden = Golden.load(self.golden)
        checkpoint = Checkpoint.open(self.model, golden.metadata.get("dtype", "float32"))
        return golden, as_backend(load_factory(self.backend)(checkpoint)), get_profile(self.profile)

    def run(self, state, shard: Shard) -> tuple[dict[str, np.ndarray], dict[str, str], int]:
        golden, backend, profile = state
        tensors, info, tokens = {}, {}, 0
        for i in shard.items:
            report = check_golden_prompt(golden, i, backend, profile)
            info |= {f"{i}.ok": "1" if report.ok else "", f"{i}.line": report.line}
            if report.logits is not None:
                tensors |= {f"{i}.logits": report.logits, f"{i}.expected": report.expected}
                tensors[f"{i}.next_tokens"] = report.next_tokens
            tokens += len(golden.require(i, "token_ids")) + len(golden.require(i, "greedy_ids"))
        return tensors, info, tokens


def check_on_ray(
    golden_path: str | Path,
    golden: Golden,
    model: str,
    backend: str,
    profile: str,
    address: str = LOCAL,
    workers: int | None = None,
    shard_size: int = 1,
    shards: str | Path | None = None,
    on_result: Callable[[ShardResult], None] | None = None,
) -> list[PromptReport]:
    """``golden.check`` on a Ray cluster: every prompt's report, in prompt order.

    With ``shards``, finished shards are kept there until the reports are made, so an interrupted
    check resumes; ``on_result`` is called with each shard computed by this call.
    """
    manifest = {"job": "golden check", "golden": str(Path(golden_path).resolve()), "model": model}
    manifest |= {"weights_sha256": golden.metadata["weights_sha256"], "backend": backend, "profile": profile}
    manifest["golden_identity"] = file_identity(golden_path)
    store = None if shards is None else ShardStore(shards, manifest | {"shard_size": str(shard_size)})
    job, shard_list = GoldenCheckJob(str(golden_path), model, backend, profile), split(golden.num_prompts, shard_size)
    run = run_shards(job, shard_list, store, address, workers, "golden check", on_result)
    reports = []
    for shard in shard_list:
        result = run.results[shard.index]
        for i in shard.items:
            arrays = [result.tensors.get(f"{i}.{name}") for name in ("logits", "expected", "next_tokens")]
            reports.append(PromptReport(i, bool(result.info[f"{i}.ok"]), result.info[f"{i}.line"], *arrays))
    if store is not None:
        store.remove()
    return reports
