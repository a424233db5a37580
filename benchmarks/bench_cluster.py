"""Throughput of a golden dump and of perplexity on a local Ray cluster, against the single-process run.

Tokens/s counts the tokens run through the model (prompts and new tokens for the dump).

Over a corpus of ``--tokens`` tokens (default 100,000: the repository's own
text, tokenized and repeated, for SmolLM2-135M if it is pulled, otherwise
random ids for a generated model of its shape):

- perplexity in windows of ``--window`` tokens (stride ``--window``, so every
  token is run once), float32 fast path, as ``refllm perplexity`` runs it;
- a golden dump of the corpus cut into prompts of ``--prompt-tokens`` tokens,
  each with ``--new-tokens`` greedy tokens, float32 spec path, as ``refllm
  golden dump`` runs it.

Each job runs single-process in this process with 1 thread (what one worker
gets: one Numba thread, one BLAS thread) and with all threads, then on a new local cluster of each ``--workers``
count (one CPU and one thread per worker). A job's time includes loading the
model (each worker loads its own) and writing the result, not starting the
cluster, which is timed apart. The overhead of a cluster of 1 worker is its
time over the 1-thread single-process time. The cluster's perplexity must
equal the single-process float, and is checked.

    python benchmarks/bench_cluster.py [--tokens 100000] [--workers 1,2] [--window 512]
        [--prompt-tokens 256] [--new-tokens 8] [--model smollm2-135m|generated]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import ray
from machine import SMOLLM2_135M  # benchmarks/machine.py
from safetensors import safe_open
from safetensors.numpy import save_file
from threadpoolctl import threadpool_limits

from refllm import catalog
from refllm.cluster.golden import dump_on_ray
from refllm.cluster.perplexity import perplexity_on_ray
from refllm.config import ModelConfig
from refllm.loading import open_source
from refllm.machine import cpu_name, thread_settings
from refllm.models.decoder import DecoderModel
from refllm.models.random import random_tensors
from refllm.runtime.perplexity import perplexity
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.golden import DumpOptions, Prompt, dump

ROOT = Path(__file__).resolve().parents[1]
PRECISION = {"quantized": False, "dtype": "float32", "reference": None}  # refllm perplexity's default


def model_and_corpus(name: str, tokens: int, folder: Path) -> tuple[str, np.ndarray, str]:
    """-> (the model's name or path, ``tokens`` token ids, what the model is)."""
    if name == "smollm2-135m" and catalog.is_pulled(name):
        text = "\n".join(p.read_text() for p in sorted(ROOT.glob("**/*.md")) + sorted(ROOT.glob("refllm/**/*.py")))
        ids = open_source(catalog.model_path(name)).tokenizer.encode(text)
        return name, np.resize(np.asarray(ids), tokens), "SmolLM2-135M-Instruct Q4_1 (catalog), the repository's text"
    directory = folder / "generated"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(SMOLLM2_135M))
    save_file(random_tensors(ModelConfig.from_hf(SMOLLM2_135M)), str(directory / "model.safetensors"))
    ids = np.random.default_rng(0).integers(0, SMOLLM2_135M["vocab_size"], tokens)
    return str(directory), ids, "random weights of the SmolLM2-135M shape, random token ids"


def single_perplexity(model: str, ids: np.ndarray, window: int) -> float:
    path = catalog.model_path(model) if model in catalog.CATALOG else model
    loaded = DecoderModel.load(open_source(path, quantized=False, dtype="float32"), "float32")
    return perplexity(loaded, ids.tolist(), window, window)[0]


def single_golden(model: str, prompts: list[Prompt], options: DumpOptions, out: Path) -> None:
    dump(Checkpoint.open(model), prompts, out, model, **vars(options))


def same_tensors(path: Path, other: Path) -> bool:
    """Every tensor of the two safetensors files has the same name, dtype, shape and bytes."""
    with safe_open(str(path), "np") as f, safe_open(str(other), "np") as g:
        if sorted(f.keys()) != sorted(g.keys()):
            return False
        return all(f.get_tensor(name).tobytes() == g.get_tensor(name).tobytes() for name in f.keys())


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--workers", default="1,2", help="cluster sizes, comma-separated")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "generated"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    model, ids, described = model_and_corpus(args.model, args.tokens, folder)
    prompts = [Prompt(None, ids[i : i + args.prompt_tokens].tolist()) for i in range(0, len(ids), args.prompt_tokens)]
    options = DumpOptions(new_tokens=args.new_tokens)
    golden_tokens = sum(len(p.token_ids) + args.new_tokens for p in prompts)
    print(f"machine   {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    print(
        f"software  Python {platform.python_version()}, NumPy {np.__version__}, Numba {numba.__version__}, Ray {ray.__version__}"
    )
    print(f"threads   {thread_settings()} (single-process runs at 1 and at {numba.get_num_threads()})")
    print(f"model     {model}: {described}")
    print(f"corpus    {len(ids)} tokens; perplexity windows of {args.window} (stride {args.window});")
    print(f"          golden dump: {len(prompts)} prompts of up to {args.prompt_tokens} tokens + {args.new_tokens} new")
    rows, all_threads, single = [], numba.get_num_threads(), {}
    for threads in (1, all_threads):
        numba.set_num_threads(threads)
        with threadpool_limits(threads):  # NumPy's BLAS too, as Ray's OMP_NUM_THREADS limits a worker's
            seconds, single[threads] = timed(lambda: single_perplexity(model, ids, args.window))
            rows.append(("perplexity", f"single process, {threads} thread(s)", seconds, len(ids)))
            seconds, _ = timed(lambda: single_golden(model, prompts, options, folder / "single.safetensors"))
            rows.append(("golden dump", f"single process, {threads} thread(s)", seconds, golden_tokens))
    numba.set_num_threads(all_threads)
    same = {}  # workers -> whether the cluster's golden file holds the single-process tensors, bit for bit
    for workers in map(int, args.workers.split(",")):
        started, _ = timed(lambda: ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                                           logging_level=logging.WARNING))  # fmt: skip
        seconds, on_ray = timed(lambda: perplexity_on_ray(model, PRECISION, ids, args.window, args.window))
        assert on_ray[0] == single[1], (
            f"the cluster's perplexity {on_ray[0]!r} is not the single process' {single[1]!r}"
        )
        rows.append(("perplexity", f"Ray, {workers} worker(s) (cluster start {started:.1f} s)", seconds, len(ids)))
        out = folder / f"ray-{workers}.safetensors"
        seconds, _ = timed(lambda: dump_on_ray(Checkpoint.open(model), prompts, out, model, options=options))
        same[workers] = same_tensors(out, folder / "single.safetensors")
        rows.append(
            ("golden dump", f"Ray, {workers} worker(s) (cluster start {started:.1f} s)", seconds, golden_tokens)
        )
        ray.shutdown()
    print(f"perplexity {single[1]!r} at 1 thread, {single[all_threads]!r} at {all_threads}; equal on every cluster")
    print(f"golden dump: the cluster's tensors are the single process' ({all_threads} threads), bit for bit: {same}")
    print(f"\n{'job':<12}  {'run':<40}  {'seconds':>8}  {'tokens/s':>9}  {'vs 1 thread':>11}")
    for job, run, seconds, tokens in rows:
        base = next(s for j, r, s, _ in rows if j == job and r == "single process, 1 thread(s)")
        print(f"{job:<12}  {run:<40}  {seconds:>8.1f}  {tokens / seconds:>9.1f}  {base / seconds:>10.2f}x")


if __name__ == "__main__":
    main()
