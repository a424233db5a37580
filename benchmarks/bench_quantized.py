"""Decode and prefill speed on one GGUF file: refllm float32, refllm quantized, transformers, llama.cpp.

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

Both refllm engines run with refllm's thread policy (refllm/kernels/threads.py);
the other engines get the environment the benchmark was started with.

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
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ENGINES = ("refllm-float32", "refllm-quantized", "transformers-float32", "llama.cpp")
# What each engine imports: imported before the footprint "after imports" is taken.
IMPORTS = {
    "refllm-float32": ("refllm",),
    "refllm-quantized": ("refllm",),
    "transformers-float32": ("torch", "transformers"),
    "llama.cpp": ("llama_cpp",),
}
CONTEXT = 512  # tokens each engine's KV storage is sized for
# The environment as the user started the benchmark: importing refllm sets OMP_WAIT_POLICY for its own
# process (refllm/kernels/__init__.py), which must not leak into the other engines' processes
# (llama.cpp and torch run OpenMP pools of their own).
USER_ENVIRONMENT = dict(os.environ)


def memory(key: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key + ":"))


# ---- one engine in one process -------------------------------------------------------------------------


class RefllmEngine:
    def __init__(self, path: Path, quantized: bool):
        import numpy as np

        import refllm
        from refllm import CacheConfig

        self.np, self.CacheConfig = np, CacheConfig
        self.model = refllm.load_model(path, quantized=quantized)
        self.cache = None

    def prefill(self, ids: list[int]) -> int:
        shape = self.model.cache_shape
        budget = CONTEXT * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2 * 4  # K and V, float32
        self.cache = self.model.create_kv_cache(self.CacheConfig(max_bytes=budget))
        logits = self.model.prefill(self.np.array([ids]), self.cache, range(len(ids)))
        return int(self.np.argmax(logits[0]))

    def decode(self, token: int) -> int:
        return int(self.np.argmax(self.model.decode(self.np.array([[token]]), self.cache)[0]))

    def kv_bytes(self) -> int:
        return self.cache.k.nbytes + self.cache.v.nbytes


class TransformersEngine:
    def __init__(self, path: Path, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        self.model.eval()
        self.past = None

    def prefill(self, ids: list[int]) -> int:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([ids]), use_cache=True)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def decode(self, token: int) -> int:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([[token]]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def kv_bytes(self) -> int:
        return 0  # grown as it goes, inside the measured peak


class LlamaCppEngine:
    def __init__(self, path: Path, threads: int):
        import llama_cpp
        import numpy as np

        self.np = np
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=CONTEXT, n_batch=CONTEXT, n_threads=threads, n_threads_batch=threads,
            verbose=False,
        )

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return int(self.np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def decode(self, token: int) -> int:
        self.llm.eval([token])
        return int(self.np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def kv_bytes(self) -> int:
        return 0  # allocated at load, inside the measured peak


def start_numba() -> None:
    """refllm's first kernel call, on a one-row input: it starts Numba.

    Numba does not finish importing at ``import``: the first call of any compiled
    function imports its typing and lowering registries and compiles the functions
    of its runtime (NRT) with LLVM, which pages in LLVM's code. That costs some
    45 MB in any process that calls a Numba function, whatever the model, so the
    model's own memory is read above the footprint after it.
    """
    import numpy as np

    from refllm.kernels.norm import rms_norm

    rms_norm(np.ones((1, 8), np.float32), np.ones(8, np.float32), 1e-6)


def run_engine(engine: str, path: Path, prompt_tokens: int, decode_tokens: int, threads: int) -> dict:
    for module in IMPORTS[engine]:
        importlib.import_module(module)
    after_imports = memory("VmRSS")
    if engine.startswith("refllm"):
        start_numba()
    after_start = memory("VmRSS")
    start = time.perf_counter()
    if engine.startswith("refllm"):
        runner = RefllmEngine(path, quantized=engine == "refllm-quantized")
    elif engine == "transformers-float32":
        runner = TransformersEngine(path, threads)
    else:
        runner = LlamaCppEngine(path, threads)
    load_seconds = time.perf_counter() - start

    token = runner.prefill(list(range(100, 108)))  # warm-up: compile, allocate, touch every weight
    for _ in range(2):
        token = runner.decode(token)

    prompt = [100 + (7919 * i) % 20000 for i in range(prompt_tokens)]  # any ids: speed does not depend on them
    start = time.perf_counter()
    token = runner.prefill(prompt)
    prefill_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(decode_tokens):
        token = runner.decode(token)
    decode_seconds = time.perf_counter() - start
    return dict(
        load_s=round(load_seconds, 2),
        prefill_tokens_per_s=prompt_tokens / prefill_seconds,
        decode_tokens_per_s=decode_tokens / decode_seconds,
        peak_above_imports=memory("VmHWM") - after_imports,
        peak_above_start=memory("VmHWM") - after_start,
        kv_bytes=runner.kv_bytes(),
    )


# ---- the driver ----------------------------------------------------------------------------------------


def child_environment(engine: str, threads: int) -> dict[str, str]:
    """The user's environment with the thread count set. refllm on every core gets its default, which
    leaves a core that another program keeps busy (refllm/kernels/cores.py); on fewer, a fixed count."""
    env = dict(USER_ENVIRONMENT)
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    if engine.startswith("refllm") and threads == os.cpu_count():
        del env["NUMBA_NUM_THREADS"]
    return env


@contextlib.contextmanager
def busy_core(busy: bool) -> Iterator[None]:
    """Another process keeping one core busy (a plain busy loop) inside the block, if ``busy``."""
    if not busy:
        yield
        return
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running before the engine starts
        yield
    finally:
        loop.kill()
        loop.wait()


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("numpy", "numba", "torch", "transformers", "llama-cpp-python"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


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
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the parent passes a path; importing refllm here would set OpenMP's policy for every engine
        figures = run_engine(args.child, Path(args.model), args.prompt_tokens, args.decode_tokens, args.threads)
        print(json.dumps(figures))
        return

    from refllm import catalog
    from refllm.machine import cpu_name, vector_extensions

    path = Path(catalog.pull(args.model) if args.model in catalog.CATALOG else args.model)

    print(f"model: {path.name} ({path.stat().st_size / 1e6:.1f} MB)")
    print(
        f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'};"
        f" cores: {os.cpu_count()}; threads per engine: {args.threads}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    engines = []
    for engine in args.engines:
        missing = [m for m in IMPORTS[engine] if importlib.util.find_spec(m) is None]
        if missing:
            print(f"skipping {engine}: {', '.join(missing)} not installed")
        else:
            engines.append(engine)

    def run(engine: str, prompt_tokens: int, decode_tokens: int, threads: int = args.threads) -> dict:
        command = [sys.executable, __file__, "--child", engine, "--model", str(path), "--threads", str(threads),
                   "--prompt-tokens", str(prompt_tokens), "--decode-tokens", str(decode_tokens)]  # fmt: skip
        done = subprocess.run(command, env=child_environment(engine, threads), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    for engine in engines:
        if engine.startswith("refllm"):
            run(engine, 8, 2)  # fill Numba's cache

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
    pairs = [("refllm-quantized", "llama.cpp"), ("refllm-quantized", "refllm-float32"),
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
