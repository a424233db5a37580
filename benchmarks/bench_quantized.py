"""Decode and prefill speed on one GGUF file: refllm float32, quantized and int8, transformers, llama.cpp.

Each engine runs in a fresh process per run, and the runs take turns
(engine A, B, C, D, then A, B, C, D again), so a noisy neighbour slows them
alike. In each process the engine loads the file, warms up (Numba compiles or
loads its cache, llama.cpp and torch allocate), then

- prefills a ``--prompt-tokens`` prompt (batch 1): prefill tokens/s;
- decodes ``--decode-tokens`` greedy tokens after it, one at a time (batch 1):
  decode tokens/s, logits computed and argmax taken at every step;
- reports the peak resident memory above its footprint after imports, and for
  refllm also above its footprint after imports and Numba's start-up
  (``start_numba``), the baseline the memory target is read against.

Figures are medians over ``--runs``. Engines that are not installed
(transformers + torch, llama-cpp-python) are skipped with a note. Every
engine gets ``--threads`` threads: Numba's and OpenBLAS's pools, torch's
intra-op pool, llama.cpp's n_threads and n_threads_batch.

refllm-int8 is refllm quantized with ``activations="int8"``. The refllm engines run with
refllm's thread policy (refllm/kernels/threads.py); the other engines get the environment
the benchmark was started with.

Before the timed runs, each refllm configuration runs once untimed, so that
Numba's cache is filled and no timed process (or its peak memory) includes a
compilation.

    python benchmarks/bench_quantized.py [--model smollm2-135m] [--runs 5] [--threads 2]
    python benchmarks/bench_quantized.py --busy-check --engines refllm-quantized llama.cpp

``--busy-check`` measures what a busy laptop does to decoding: refllm quantized
alone on one thread (the quiet single-thread speed), then each engine while
another process keeps one core busy (a plain Python busy loop started before
the engine and killed after it). refllm on every core runs with its default
thread count, which leaves a busy core alone (refllm/kernels/cores.py).

Ratios printed at the end: refllm quantized against llama.cpp and refllm
float32 (docs/quantization.md), and refllm float32 against transformers
(docs/performance.md), each from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from engines import ENGINES, available_engines, busy_core, print_machine, run_in_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a catalog name or a .gguf path")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument(
        "--busy-check",
        action="store_true",
        help="instead: refllm quantized quiet on 1 thread, then each engine with another process keeping a core busy",
    )
    args = parser.parse_args()

    from refllm import catalog

    path = Path(catalog.pull(args.model) if args.model in catalog.CATALOG else args.model)

    print(f"model: {path.name} ({path.stat().st_size / 1e6:.1f} MB)")
    print_machine(args.threads)
    engines = available_engines(args.engines)

    def run(engine: str, prompt_tokens: int, decode_tokens: int, threads: int = args.threads) -> dict:
        return run_in_process(engine, path, prompt_tokens, decode_tokens, threads)

    for engine in engines:
        if engine.startswith("refllm"):
            run(engine, args.prompt_tokens, 2)  # fill Numba's cache; the prompt products' kernels measured

    # (label, engine, threads, busy): the plain runs, or with --busy-check the busy-core comparison
    plan = [(engine, engine, args.threads, False) for engine in engines]
    if args.busy_check:
        plan = [("refllm-quantized, quiet, 1 thread", "refllm-quantized", 1, False)] + [
            (f"{engine}, one core busy", engine, args.threads, True) for engine in engines
        ]
    results: dict[str, list[dict]] = {label: [] for label, *_ in plan}
    for number in range(args.runs):
        for label, engine, threads, busy in plan:
            with busy_core(busy):
                figures = run(engine, args.prompt_tokens, args.decode_tokens, threads)
            results[label].append(figures)
            print(f"run {number + 1} {label}: prefill {figures['prefill_tokens_per_s']:.1f} tok/s,"
                  f" decode {figures['decode_tokens_per_s']:.1f} tok/s", flush=True)  # fmt: skip

    file_bytes = path.stat().st_size
    print(f"\n| engine | decode tok/s ({args.decode_tokens} tokens, batch 1)"
          f" | prefill tok/s ({args.prompt_tokens}-token prompt) | load s | peak RSS above imports (median)"
          " | above imports and Numba's start-up |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    summary = {}
    for engine, runs in results.items():
        decode = statistics.median(r["decode_tokens_per_s"] for r in runs)
        prefill = statistics.median(r["prefill_tokens_per_s"] for r in runs)
        spread = {key: f"{min(r[key] for r in runs):.1f}-{max(r[key] for r in runs):.1f}"
                  for key in ("decode_tokens_per_s", "prefill_tokens_per_s")}  # fmt: skip
        peak = statistics.median(r["peak_above_imports"] for r in runs)
        peak_above_start = statistics.median(r["peak_above_start"] for r in runs)
        load = statistics.median(r["load_s"] for r in runs)
        summary[engine] = dict(
            decode=decode, prefill=prefill, peak=peak, peak_above_start=peak_above_start, kv_bytes=runs[0]["kv_bytes"]
        )
        above_start = f"{peak_above_start / 1e6:.0f} MB" if engine.startswith("refllm") else "-"
        print(f"| {engine} | {decode:.1f} ({spread['decode_tokens_per_s']}) | {prefill:.1f}"
              f" ({spread['prefill_tokens_per_s']}) | {load:.2f} | {peak / 1e6:.0f} MB | {above_start} |")  # fmt: skip
    quantized = summary.get("refllm-quantized")
    if quantized is not None:
        budget = 1.5 * file_bytes + quantized["kv_bytes"]
        print(f"\nrefllm quantized: peak {quantized['peak_above_start'] / 1e6:.0f} MB above imports and Numba's"
              f" start-up ({quantized['peak'] / 1e6:.0f} MB above imports alone)"
              f" vs 1.5 x file + KV arena = {budget / 1e6:.0f} MB")  # fmt: skip
    pairs = [("refllm-quantized", "llama.cpp"), ("refllm-int8", "llama.cpp"), ("refllm-quantized", "refllm-float32"),
             ("refllm-float32", "transformers-float32")]  # fmt: skip
    if args.busy_check:
        quiet = "refllm-quantized, quiet, 1 thread"
        pairs = [("refllm-quantized, one core busy", quiet), ("llama.cpp, one core busy", quiet),
                 ("refllm-quantized, one core busy", "llama.cpp, one core busy")]  # fmt: skip
    for engine, other in pairs:
        if engine in summary and other in summary:
            print(f"{engine} / {other}: decode {summary[engine]['decode'] / summary[other]['decode']:.2f}x,"
                  f" prefill {summary[engine]['prefill'] / summary[other]['prefill']:.2f}x")  # fmt: skip
    print(json.dumps(dict(model=path.name, threads=args.threads, runs=results), indent=None))


if __name__ == "__main__":
    main()
