"""Measure the logit error of each arithmetic against float64 truth, relative to the logits' spread.

    python benchmarks/calibrate_profiles.py [--seeds 8]

For every architecture's tiny config, several weight seeds and weight scales
(std 0.02, 0.1, 0.5: logits from near-uniform to peaked), and a prompt of 24
token ids over the whole vocabulary, it runs refllm's spec forward in
float64 (the truth) and in each arithmetic a backend may use:

    float32   the float32 spec ops, and the fast ops over the paged arena
    float16   weights and every projection's input rounded to float16 (and attention's q, k, v)
    bfloat16  the same, rounded to bfloat16 (8 significant bits)
    int8      weights in blocks of 32 (or the row) quantized to 8 bits (Q8_0's absmax scale), float32 math
    q4        the same with 4 bits (Q4_0's 16 levels)

and records, per position, max |logits - truth| / std(truth) over the
vocabulary. It prints the percentiles of that ratio per arithmetic; each
profile in ``refllm/testing/tolerances.py`` is the worst ratio observed
times a margin, both stated in its reason (docs/oracle.md has the table).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from refllm.kv.base import CacheConfig
from refllm.models.decoder import DecoderModel
from refllm.models.ops import SPEC_OPS
from refllm.nn.attention import attention
from refllm.nn.linear import linear
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.configs import ARCHITECTURES, tiny_config_json

WEIGHT_STDS = (0.02, 0.1, 0.5)
PROMPT_LENGTH = 24


def bfloat16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), kept in float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def float16_round(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def rounded_ops(round_to):
    """The spec ops with each projection's input and weight, and attention's inputs, rounded by ``round_to``."""

    def rounded_linear(x, weight, bias=None):
        return linear(round_to(x), round_to(weight), bias)

    def rounded_attention(q, k, v, *args, **options):
        return attention(round_to(q), round_to(k), round_to(v), *args, **options)

    return replace(SPEC_OPS, name="rounded", linear=rounded_linear, attention=rounded_attention)


def block_quantized(weight: np.ndarray, bits: int) -> np.ndarray:
    """Symmetric absmax block quantization (Q8_0 / Q4_0 style) along the input dim, dequantized to float32."""
    rows, cols = weight.shape
    block = 32 if cols % 32 == 0 else cols
    blocks = weight.reshape(rows, cols // block, block).astype(np.float64)
    if bits == 8:
        scale = np.abs(blocks).max(-1, keepdims=True) / 127
        levels = np.round(blocks / np.where(scale == 0, 1, scale))
    else:  # Q4_0: d = max / -8 over the signed extreme, levels -8..7
        extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)
        scale = extreme / -8
        levels = np.clip(np.round(blocks / np.where(scale == 0, 1, scale)), -8, 7)
    return (levels * scale).reshape(rows, cols).astype(np.float32)


def quantized_checkpoint(checkpoint: Checkpoint, bits: int) -> Checkpoint:
    from refllm.models.contract import InMemorySource

    tensors = {
        name: block_quantized(array, bits) if array.ndim == 2 and "embed" not in name else array
        for name, array in checkpoint.tensors.items()
    }
    source = InMemorySource(checkpoint.config, tensors)
    return Checkpoint(checkpoint.config_json, source, f"{checkpoint.description}, {bits}-bit weights")


def spread_errors(logits: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """[T, V] each -> max |Δ| / std(truth) per position, [T]."""
    return np.abs(np.asarray(logits, np.float64) - truth).max(-1) / truth.std(-1)


def arithmetics(checkpoint: Checkpoint) -> dict:
    """Name -> a function tokens -> all-position logits [T, V]."""

    def run(model, cache_config=None):
        def all_logits(tokens):
            cache = model.create_kv_cache(cache_config)
            return model.prefill_all_logits(np.array([tokens]), cache, range(len(tokens)))[0]

        return all_logits

    def rounded(round_to):
        model = DecoderModel.load(checkpoint, ops=rounded_ops(round_to))
        return run(model, CacheConfig(kind="contiguous"))

    return {
        "float32 spec": run(checkpoint.reference(), CacheConfig(kind="contiguous")),
        "float32 fast paged": run(DecoderModel.load(checkpoint), CacheConfig(kind="paged", block_size=4)),
        "float16": rounded(float16_round),
        "bfloat16": rounded(bfloat16_round),
        "int8": run(quantized_checkpoint(checkpoint, 8).reference(), CacheConfig(kind="contiguous")),
        "q4": run(quantized_checkpoint(checkpoint, 4).reference(), CacheConfig(kind="contiguous")),
    }


def measure(seeds: int) -> dict[str, np.ndarray]:
    errors: dict[str, list[np.ndarray]] = {}
    rng = np.random.default_rng(0)
    for arch in ARCHITECTURES:
        for seed in range(seeds):
            for std in WEIGHT_STDS:
                checkpoint = Checkpoint.random(tiny_config_json(arch), seed, std=std)
                tokens = rng.integers(0, checkpoint.config.vocab_size, PROMPT_LENGTH).tolist()
                truth = checkpoint.reference("float64")
                expected = truth.prefill_all_logits(np.array([tokens]), truth.create_kv_cache(), range(len(tokens)))[0]
                for name, all_logits in arithmetics(checkpoint).items():
                    errors.setdefault(name, []).append(spread_errors(all_logits(tokens), expected))
    return {name: np.concatenate(values) for name, values in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="weight seeds per architecture and scale (default 8)")
    args = parser.parse_args()
    measured = measure(args.seeds)
    print("max |Δ| / std(truth logits) per position, against float64 truth")
    print(f"{'arithmetic':20} {'positions':>9} {'median':>9} {'p99':>9} {'p99.9':>9} {'max':>9}")
    for name, ratios in measured.items():
        p50, p99, p999 = np.percentile(ratios, [50, 99, 99.9])
        print(f"{name:20} {len(ratios):9} {p50:9.2e} {p99:9.2e} {p999:9.2e} {ratios.max():9.2e}")


if __name__ == "__main__":
    main()
