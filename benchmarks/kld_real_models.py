"""KL divergence against float64 truth on the real models, as ``llama-perplexity --kl-divergence`` reports it.

    python benchmarks/kld_real_models.py [--tokens 128] [--models smollm2-135m path/to/file.gguf]

For SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M), the truth is refllm's
float64 spec over the GGUF file's weights dequantized in float64; compared
with it: refllm float32 (every weight dequantized), refllm quantized (float32
activations multiplying from the blocks: the default), refllm quantized with int8
activations (``activations="int8"``, each position a decode step: prompts keep float32
activations) and, where llama-cpp-python is installed,
llama.cpp on the same file. The int8 path and llama.cpp are also compared with the
default quantized path, the distance the opt-in adds. The text is this
repository's README, its first ``--tokens`` tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import refllm
from refllm import catalog
from refllm.testing.kld import kl_statistics

MODELS = ("smollm2-135m", "gemma3-270m")
TEXT = Path(__file__).resolve().parents[1] / "README.md"


def all_logits(model, tokens: list[int]) -> np.ndarray:
    return model.prefill_all_logits(np.array([tokens]), model.create_kv_cache(), range(len(tokens)))[0]


def decoded_logits(model, tokens: list[int]) -> np.ndarray:
    """Each position's logits from a decode step of its own (int8 activations serve decode steps)."""
    cache = model.create_kv_cache()
    rows = [model.prefill(np.array([tokens[:1]]), cache, range(1))[0]]
    return np.stack(rows + [model.decode(np.array([[token]]), cache)[0] for token in tokens[1:]])


def llama_cpp_logits(path: Path, tokens: list[int]) -> np.ndarray | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(str(path), n_ctx=len(tokens) + 8, logits_all=True, n_threads=2, verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="positions per model (default 128)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="catalog names or .gguf paths")
    args = parser.parse_args()
    for name in args.models:
        path = catalog.pull(name, progress=False) if name in catalog.CATALOG else Path(name)
        truth_model = refllm.load_model(path, dtype="float64")
        tokens = truth_model.tokenizer.encode(TEXT.read_text())[: args.tokens]
        truth = all_logits(truth_model, tokens)[:-1]
        del truth_model
        following = tokens[1:]
        candidates = {
            "refllm float32 path": all_logits(refllm.load_model(path), tokens)[:-1],
            "refllm quantized path": all_logits(refllm.load_model(path, quantized=True), tokens)[:-1],
            "refllm quantized, int8 activations": decoded_logits(
                refllm.load_model(path, quantized=True, activations="int8"), tokens
            )[:-1],
        }
        llama = llama_cpp_logits(path, tokens)
        if llama is not None:
            candidates["llama.cpp"] = llama[:-1]
        default = candidates["refllm quantized path"]
        for backend, logits in candidates.items():
            print(f"{name} ({path.name}), {backend} vs float64 truth:")
            for line in kl_statistics(logits, truth, following).lines():
                print(f"  {line}")
            if backend in ("refllm quantized, int8 activations", "llama.cpp"):
                print(f"{name} ({path.name}), {backend} vs refllm quantized (float32 activations):")
                for line in kl_statistics(logits, default, following).lines():
                    print(f"  {line}")


if __name__ == "__main__":
    main()
