"""Peak memory of loading a float32 checkpoint of the SmolLM2-135M shape.

Writes a random float32 safetensors checkpoint (about 540 MB) to a temporary
directory, then, in a fresh process for each run, measures the resident
memory after imports, the peak after ``refllm.load_model``, and the peak after
one forward pass (which touches every weight). Reports the growth above the
post-import footprint as a multiple of the weight bytes (target: <= 1.3x).

    python benchmarks/bench_load_memory.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import SMOLLM2_135M  # benchmarks/machine.py

from refllm.machine import cpu_name, vector_extensions

_CHILD = r"""
import json, sys, time
import numpy as np
import refllm
from refllm import CacheConfig

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
after_imports = status("VmRSS")
start = time.perf_counter()
model = refllm.load_model(sys.argv[1])
load_seconds = time.perf_counter() - start
peak_load = status("VmHWM")
cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
model.prefill(np.arange(8)[None], cache, range(8))
peak_forward = status("VmHWM")
print(json.dumps(dict(after_imports=after_imports, peak_load=peak_load, peak_forward=peak_forward,
                      load_seconds=load_seconds, weight_bytes=model.weights.nbytes())))
"""


def write_checkpoint(directory: Path) -> None:
    from safetensors.numpy import save_file

    from refllm.config import ModelConfig
    from refllm.models.random import random_tensors

    config = ModelConfig.from_hf(SMOLLM2_135M)
    save_file(random_tensors(config, seed=0, std=0.02), directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(SMOLLM2_135M))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_checkpoint(directory)
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", _CHILD, str(directory)], capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr)
            runs.append(json.loads(out.stdout))
    weight_bytes = runs[0]["weight_bytes"]
    load_ratio = statistics.median((r["peak_load"] - r["after_imports"]) / weight_bytes for r in runs)
    forward_ratio = statistics.median((r["peak_forward"] - r["after_imports"]) / weight_bytes for r in runs)
    load_seconds = statistics.median(r["load_seconds"] for r in runs)
    print(f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'}; cores: {os.cpu_count()}")
    print(f"float32 weights: {weight_bytes / 2**20:.0f} MiB, {args.runs} runs (medians)")
    print(f"load time: {load_seconds:.2f} s")
    print(f"peak RSS growth after load:            {load_ratio:.2f}x weight bytes (target <= 1.3x)")
    print(f"peak RSS growth after one forward pass: {forward_ratio:.2f}x weight bytes (target <= 1.3x)")


if __name__ == "__main__":
    main()
