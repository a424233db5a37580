"""Each path's logits against float64 truth, on the real catalog models: the table of docs/reference.md.

    python benchmarks/reference_error.py [--models smollm2-135m gemma3-270m]

Truth is ``load_model(name, dtype="float64")`` (every GGUF block dequantized in
float64, the spec ops, the contiguous cache). Every other path runs the same
prompts, and for each it prints, over every position of every prompt:

- max rel: the largest |logit - true logit| / max |true logits| of its position;
- mean rel: the mean of |logit - true logit| / max |true logits|;
- greedy: the share of positions whose top token is the true top token.

Paths: refllm float32 spec (contiguous), float32 fast (contiguous and paged),
quantized (the GGUF blocks in the quantized kernels), quantized with int8
activations (``activations="int8"``: its decode steps, one token at a time, since
prompts keep float32 activations), transformers float32
(eager attention, same GGUF file) and llama.cpp (llama-cpp-python), each where
installed. The prompts are the golden prompts below.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import numpy as np

import refllm
from refllm import catalog
from refllm.kv import CacheConfig

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The three primary colours are red, blue and",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain it boils at",
]


def refllm_path(name: str, cache: str, one_at_a_time: bool = False, **load) -> Callable[[list[int]], np.ndarray]:
    """All logits of a prompt in one prefill, or ``one_at_a_time``: each position a decode step of its own."""
    model = refllm.load_model(name, **load)

    def all_logits(ids: list[int]) -> np.ndarray:
        kv = model.create_kv_cache(CacheConfig(kind=cache))
        if not one_at_a_time:
            return model.prefill_all_logits(np.array([ids]), kv, range(len(ids)))[0]
        rows = [model.prefill(np.array([ids[:1]]), kv, range(1))[0]]
        return np.stack(rows + [model.decode(np.array([[token]]), kv)[0] for token in ids[1:]])

    return all_logits


def transformers_path(name: str) -> Callable[[list[int]], np.ndarray] | None:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    path = catalog.pull(name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )

    def all_logits(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].numpy()

    return all_logits


def llama_cpp_path(name: str) -> Callable[[list[int]], np.ndarray] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    model = Llama(str(catalog.pull(name)), logits_all=True, n_ctx=512, verbose=False)

    def all_logits(ids: list[int]) -> np.ndarray:
        model.reset()
        model.eval(ids)
        return np.array(model.scores[: len(ids)])

    return all_logits


def errors(logits: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: max and mean |Δ| over the largest true logit, and whether the top tokens agree."""
    scale = np.abs(truth).max(axis=-1)
    delta = np.abs(logits.astype(np.float64) - truth)
    return delta.max(axis=-1) / scale, delta.mean(axis=-1) / scale, logits.argmax(-1) == truth.argmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(catalog.CATALOG))
    args = parser.parse_args()
    print(f"# {platform.machine()}, numpy {np.__version__}, refllm {refllm.__version__}; {len(PROMPTS)} prompts")
    for name in args.models:
        truth_model = refllm.load_model(name, dtype="float64")
        prompts = [truth_model.tokenizer.encode(text) for text in PROMPTS]
        truth_path = refllm_path(name, "contiguous", dtype="float64")
        truths = [truth_path(ids) for ids in prompts]
        del truth_model, truth_path
        paths = {
            "refllm float32 spec (contiguous)": lambda: refllm_path(name, "contiguous", reference=True),
            "refllm float32 fast (contiguous)": lambda: refllm_path(name, "contiguous"),
            "refllm float32 fast (paged)": lambda: refllm_path(name, "paged"),
            "refllm quantized (paged)": lambda: refllm_path(name, "paged", quantized=True),
            "refllm quantized, int8 activations (paged, one token at a time)": lambda: refllm_path(
                name, "paged", one_at_a_time=True, quantized=True, activations="int8"
            ),
            "transformers float32": lambda: transformers_path(name),
            "llama.cpp": lambda: llama_cpp_path(name),
        }
        print(f"\n## {name}: {sum(map(len, prompts))} positions\n")
        print("| path | max rel | mean rel | greedy |")
        print("|---|---:|---:|---:|")
        for label, build in paths.items():
            path = build()
            if path is None:
                print(f"| {label} | not installed | | |")
                continue
            parts = [errors(path(ids), truth) for ids, truth in zip(prompts, truths)]
            worst, mean, agree = (np.concatenate(column) for column in zip(*parts))
            print(f"| {label} | {worst.max():.2e} | {mean.mean():.2e} | {agree.mean():.1%} |", flush=True)


if __name__ == "__main__":
    main()
