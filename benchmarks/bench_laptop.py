"""refllm against llama.cpp on Llama-shaped GGUF files of laptop sizes, and both against the memory bandwidth.

    python benchmarks/bench_laptop.py --runs 5                       # 0.5B, 1B and 3B; Q4_0, Q4_1, Q8_0
    python benchmarks/bench_laptop.py --sizes tiny --formats Q4_1 --runs 1 --prompt-tokens 16 --decode-tokens 4

Each file comes from ``synthetic_gguf.py`` (random weights, SmolLM2's tokenizer, the shapes of
Llama 3.2 1B and 3B and a 0.5B of the same proportions), the same file for both engines. A
run of a file is a STREAM-like read measurement (``bandwidth.py``) and then each engine in a
fresh process (``engines.py``: load, warm up, prefill ``--prompt-tokens``, decode
``--decode-tokens`` greedy tokens at batch 1); the runs repeat ``--runs`` times, so the
engines and the bandwidth measurement take turns, and a noisy neighbour slows them alike.

Reported per file and engine, medians of the runs with their range: decode and prefill
tokens/s, load time, peak resident memory (absolute, and above the footprint after the
engine's imports), and decode's bytes per second: the weight bytes one token reads (every
tensor of the file once: the tied embedding is the LM head) times tokens/s, and that as a
share of the read bandwidth measured in the same run. The memory target is read as peak RSS
above imports <= the file + the KV arena + 100 MB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from engines import available_engines, print_machine, run_in_process
from synthetic_gguf import FORMATS, SHAPES, synthetic_gguf

LAPTOP_ENGINES = ("refllm-quantized", "refllm-int8", "llama.cpp")
MEMORY_ALLOWANCE = 100e6  # bytes over the file and the KV arena
BANDWIDTH = Path(__file__).with_name("bandwidth.py")


def weight_bytes(path: Path) -> int:
    """Bytes of every tensor in the file: what one decoded token reads."""
    from refllm.io.gguf_header import map_file

    mapped, header = map_file(path)
    try:
        return sum(tensor.nbytes for tensor in header.tensors)
    finally:
        mapped.close()


def measure_bandwidth(threads: int) -> float:
    """The best read GB/s of one ``bandwidth.py`` process on ``threads`` threads."""
    command = [sys.executable, str(BANDWIDTH), "--threads", str(threads), "--megabytes", "512", "--sweeps", "5"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["best"]


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def bench_file(path: Path, engines: list[str], args: argparse.Namespace) -> dict:
    for engine in engines:  # untimed: fill Numba's cache, measure the prompt products' kernels, page the file in
        run_in_process(engine, path, args.prompt_tokens, 2, args.threads)
    runs: dict[str, list[dict]] = {engine: [] for engine in engines}
    bandwidths = []
    for number in range(args.runs):
        bandwidths.append(measure_bandwidth(args.threads))
        for engine in engines:
            figures = run_in_process(engine, path, args.prompt_tokens, args.decode_tokens, args.threads)
            runs[engine].append(figures)
            print(f"  run {number + 1} {engine}: prefill {figures['prefill_tokens_per_s']:.1f} tok/s,"
                  f" decode {figures['decode_tokens_per_s']:.1f} tok/s; read bandwidth {bandwidths[-1]:.1f} GB/s",
                  flush=True)  # fmt: skip
    return {"runs": runs, "bandwidth": bandwidths}


def report(path: Path, result: dict, args: argparse.Namespace) -> None:
    file_bytes, read = path.stat().st_size, weight_bytes(path)
    bandwidth = statistics.median(result["bandwidth"])
    print(f"\n{path.name}: {file_bytes / 1e6:.0f} MB, {read / 1e6:.0f} MB of weights read a token;"
          f" read bandwidth {spread(result['bandwidth'])} GB/s\n")  # fmt: skip
    print("| engine | decode tok/s | prefill tok/s | load s | decode GB/s | of bandwidth | peak RSS | above imports"
          " | file + arena + 100 MB |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    decode = {}
    for engine, runs in result["runs"].items():
        rates = [r["decode_tokens_per_s"] for r in runs]
        decode[engine] = statistics.median(rates)
        streamed = [rate * read / 1e9 for rate in rates]
        above = statistics.median(r["peak_above_imports"] for r in runs)
        budget = file_bytes + runs[0]["kv_bytes"] + MEMORY_ALLOWANCE
        print(f"| {engine} | {spread(rates)} | {spread([r['prefill_tokens_per_s'] for r in runs])}"
              f" | {statistics.median(r['load_s'] for r in runs):.2f} | {spread(streamed)}"
              f" | {statistics.median(streamed) / bandwidth:.0%}"
              f" | {statistics.median(r['peak_rss'] for r in runs) / 1e6:.0f} MB"
              f" | {above / 1e6:.0f} MB | {budget / 1e6:.0f} MB{'' if above <= budget else ' (over)'} |")  # fmt: skip
    if "llama.cpp" in decode:
        for engine in decode:
            if engine != "llama.cpp":
                prefill = [statistics.median(r["prefill_tokens_per_s"] for r in result["runs"][name])
                           for name in (engine, "llama.cpp")]  # fmt: skip
                print(f"{engine} / llama.cpp: decode {decode[engine] / decode['llama.cpp']:.2f}x,"
                      f" prefill {prefill[0] / prefill[1]:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=SHAPES, default=["0.5b", "1b", "3b"])
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--engines", nargs="+", choices=LAPTOP_ENGINES, default=list(LAPTOP_ENGINES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=128)
    args = parser.parse_args()

    print_machine(args.threads)
    engines = available_engines(args.engines)
    results = {}
    for size in args.sizes:
        for layer_format in args.formats:
            path = synthetic_gguf(size, layer_format)
            print(f"{path.name}:", flush=True)
            results[path.name] = bench_file(path, engines, args)
            report(path, results[path.name], args)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
