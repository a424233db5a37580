"""ggml's CPU arithmetic, spec against the installed llama.cpp library: kernel by kernel, then op by op in the
catalog's models. Needs llama-cpp-python.

Prints the machine and the library's build (version, the instruction sets compiled in); per quantizer and per
dot product, how many of the drawn rows or outputs the spec (refllm/testing/ggml) gives bit for bit; how
many the spec variants one step away give (fewer: the check tells them apart); then, for each catalog model
pulled here, every quantized matrix product of a prompt (``--tokens`` tokens) and of one token, recomputed
from the inputs llama.cpp gave it, with repacking on (llama.cpp's default) and off, counted per weight type
and kernel (dispatch.py names the kernel; vec_dot and llamafile's are specified: ``GGML_CPU_TILED_MM=0`` in
the environment sends a prompt's K-quant products to vec_dot too).

    python benchmarks/ggml_kernels.py [--rows 512] [--tokens 8] [--models smollm2-135m gemma3-270m]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from refllm import catalog
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.testing.ggml.agreement import FORMATS, VARIANTS, dot_agreement, quantizer_agreement
from refllm.testing.ggml.graph_trace import check_products, run_graph
from refllm.testing.ggml.library import installed_library
from refllm.testing.ggml.quantizers import QUANTIZERS


def kernels(library, rows: int) -> None:
    print(f"\n{'kernel':34} {'identical':>18}")
    for name in QUANTIZERS:
        a = quantizer_agreement(library, name, rows)
        print(f"{a.kernel:34} {a.identical:>8} of {a.compared:<7} rows")
    for name in FORMATS:
        a = dot_agreement(library, name, rows // 4)
        print(f"{a.kernel:34} {a.identical:>8} of {a.compared:<7} outputs")
    print("\nspec variants one step away (identical outputs: fewer is the check telling them apart)")
    for description, (name, variant) in VARIANTS.items():
        a = (quantizer_agreement(library, name, rows, spec=variant) if name in QUANTIZERS
             else dot_agreement(library, name, rows // 4, spec=variant))  # fmt: skip
        print(f"  {description:50} {a.identical:>6} of {a.compared}")


def model_products(name: str, tokens: int) -> None:
    path = catalog.model_path(name)
    for prompt in (list(range(100, 100 + tokens)), [100]):
        for repack in (True, False):
            start = time.perf_counter()
            checks = check_products(run_graph(path, prompt, repack=repack)[0], repack=repack)
            seconds = time.perf_counter() - start
            counts = Counter((c.weight_type, c.kernel, c.identical) for c in checks)
            print(f"\n{name}, {len(prompt)} token(s), repacking {'on' if repack else 'off'} ({seconds:.1f} s):")
            for (weight_type, kernel, identical), n in sorted(counts.items(), key=str):
                verdict = {True: "bit-identical", False: "DIFFERENT", None: "not specified here"}[identical]
                print(f"  {weight_type:5} {kernel:9} {n:4} products  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--models", nargs="*", default=list(catalog.CATALOG))
    args = parser.parse_args()
    library = installed_library()
    if library is None:
        raise SystemExit("llama-cpp-python is not installed")
    print(f"machine: {cpu_name()}; {' '.join(vector_extensions())}; {thread_settings()}")
    print(f"library: {library.build()}")
    kernels(library, args.rows)
    for name in args.models:
        if name in catalog.pulled():
            model_products(name, args.tokens)
        else:
            print(f"\n{name}: not pulled here (refllm pull {name})")


if __name__ == "__main__":
    main()
