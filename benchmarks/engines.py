"""The engines the speed benchmarks run, each in a process of its own, and how that process is set up.

``run_engine`` runs one engine on one GGUF file in this process: it loads the file, warms up
(Numba compiles or loads its cache, llama.cpp and torch allocate), prefills a prompt, decodes
greedy tokens one at a time, and reports prefill and decode tokens/s, the load time and the
peak resident memory above the footprint after imports (for refllm also above the footprint
after Numba's start-up, ``start_numba``). The drivers (``bench_quantized.py``,
``bench_laptop.py``) start one process per engine and run, so that the engines take turns
and none inherits another's threads or memory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ENGINES = ("refllm-float32", "refllm-quantized", "refllm-int8", "transformers-float32", "llama.cpp")
# What each engine imports: imported before the footprint "after imports" is taken.
IMPORTS = {
    "refllm-float32": ("refllm",),
    "refllm-quantized": ("refllm",),
    "refllm-int8": ("refllm",),  # quantized, with int8 activations
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
    def __init__(self, path: Path, quantized: bool, activations: str = "float32"):
        import numpy as np

        import refllm
        from refllm import CacheConfig

        self.np, self.CacheConfig = np, CacheConfig
        self.model = refllm.load_model(path, quantized=quantized, activations=activations)
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
        quantized = engine in ("refllm-quantized", "refllm-int8")
        runner = RefllmEngine(path, quantized, "int8" if engine == "refllm-int8" else "float32")
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
        peak_rss=memory("VmHWM"),
        kv_bytes=runner.kv_bytes(),
    )


# ---- the processes ------------------------------------------------------------------------------------


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


def run_in_process(
    engine: str, path: Path, prompt_tokens: int, decode_tokens: int, threads: int, environment: dict | None = None
) -> dict:
    """``run_engine`` in a fresh process with ``child_environment`` (plus ``environment``) -> its figures."""
    command = [sys.executable, __file__, "--engine", engine, "--model", str(path), "--threads", str(threads),
               "--prompt-tokens", str(prompt_tokens), "--decode-tokens", str(decode_tokens)]  # fmt: skip
    env = child_environment(engine, threads) | (environment or {})
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def available_engines(wanted: list[str]) -> list[str]:
    """The engines of ``wanted`` whose packages are installed; a note for each one that is skipped."""
    engines = []
    for engine in wanted:
        missing = [m for m in IMPORTS[engine] if importlib.util.find_spec(m) is None]
        if missing:
            print(f"skipping {engine}: {', '.join(missing)} not installed")
        else:
            engines.append(engine)
    return engines


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("numpy", "numba", "torch", "transformers", "llama-cpp-python"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def print_machine(threads: int) -> None:
    """The benchmark's header: the CPU, its vector extensions, the cores, the threads, the versions."""
    from refllm.machine import cpu_name, vector_extensions

    print(
        f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'};"
        f" cores: {os.cpu_count()}; threads per engine: {threads}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))


def main() -> None:
    """One engine on one file in this process; prints its figures as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--model", required=True, help="a .gguf path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=128)
    args = parser.parse_args()
    print(json.dumps(run_engine(args.engine, Path(args.model), args.prompt_tokens, args.decode_tokens, args.threads)))


if __name__ == "__main__":
    main()
