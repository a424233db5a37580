"""Llama-shaped GGUF files of laptop sizes, random weights and a real tokenizer, for benchmarks.

    python benchmarks/synthetic_gguf.py --size 1b --format Q4_1     # prints the file's path

Each file is a ``llama`` GGUF as llama.cpp's converter writes one: the shape of a published
model (Llama 3.2 1B and 3B; a 0.5B of the same proportions), SmolLM2-135M's tokenizer copied
from the catalog's file (49152 tokens; ``refllm pull smollm2-135m`` fetches it), every layer
matrix quantized with gguf-py (``gguf.quants.quantize``, llama.cpp's reference quantizers) to
``--format``, the tied embedding to ``--embedding-format`` (Q8_0, as in the catalog's SmolLM2
file), the norms in F32. Weights are drawn N(0, 0.02^2) with a fixed seed, so a file is the
same on every machine. Speed and memory do not depend on what the weights are, only on their
shapes and formats; the same file runs in refllm and llama.cpp.

Files are written once into ``$REFLLM_HOME/synthetic`` (``~/.cache/refllm/synthetic``) and
reused: writing the 3B one quantizes 3 billion weights in NumPy (minutes).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOKENIZER_MODEL = "smollm2-135m"
VOCAB = 49152  # SmolLM2's tokenizer
FORMATS = ("Q4_0", "Q4_1", "Q8_0")  # what gguf-py quantizes among the formats both engines read


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        D, F, E = self.hidden, self.intermediate, self.head_dim
        per_layer = D * self.heads * E * 2 + D * self.kv_heads * E * 2 + 3 * D * F + 2 * D
        return VOCAB * D + self.layers * per_layer + D


SHAPES = {
    "tiny": LlamaShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2),  # for checking the scripts
    "0.5b": LlamaShape(hidden=1024, intermediate=4096, layers=30, heads=16, kv_heads=4),
    "1b": LlamaShape(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8),  # Llama 3.2 1B
    "3b": LlamaShape(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8),  # Llama 3.2 3B
}


def synthetic_home() -> Path:
    home = os.environ.get("REFLLM_HOME") or Path.home() / ".cache" / "refllm"
    return Path(home).expanduser() / "synthetic"


def tensors(shape: LlamaShape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape [out, in] as NumPy holds it) of every tensor, in the converter's order."""
    D, F, E = shape.hidden, shape.intermediate, shape.head_dim
    found = [("token_embd.weight", (VOCAB, D))]
    for i in range(shape.layers):
        found += [
            (f"blk.{i}.attn_norm.weight", (D,)),
            (f"blk.{i}.attn_q.weight", (shape.heads * E, D)),
            (f"blk.{i}.attn_k.weight", (shape.kv_heads * E, D)),
            (f"blk.{i}.attn_v.weight", (shape.kv_heads * E, D)),
            (f"blk.{i}.attn_output.weight", (D, shape.heads * E)),
            (f"blk.{i}.ffn_norm.weight", (D,)),
            (f"blk.{i}.ffn_gate.weight", (F, D)),
            (f"blk.{i}.ffn_up.weight", (F, D)),
            (f"blk.{i}.ffn_down.weight", (D, F)),
        ]
    return found + [("output_norm.weight", (D,))]


def _kind(name: str, dims: tuple[int, ...], layer_format: str, embedding_format: str):
    """The GGML type a tensor is stored in."""
    import gguf

    if len(dims) == 1:
        return gguf.GGMLQuantizationType.F32
    return gguf.GGMLQuantizationType[embedding_format if name == "token_embd.weight" else layer_format]


def write(path: Path, shape: LlamaShape, layer_format: str, embedding_format: str = "Q8_0", seed: int = 0) -> None:
    """Write the file, tensor by tensor (at most one float matrix in memory at a time)."""
    import gguf

    from refllm import catalog

    tokenizer_file = catalog.pull(TOKENIZER_MODEL)
    writer = gguf.GGUFWriter(path.with_suffix(".partial"), "llama")
    writer.add_name(f"synthetic llama {shape.parameters() / 1e9:.2f}B {layer_format}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    for name, field in gguf.GGUFReader(tokenizer_file).fields.items():
        if name.startswith("tokenizer."):
            kind, *sub_type = (gguf.GGUFValueType(t) for t in field.types)
            writer.add_key_value(name, field.contents(), kind, sub_type[0] if sub_type else None)
    rng = np.random.default_rng(seed)
    layout = tensors(shape)
    for name, dims in layout:  # the infos first: sizes only
        kind = _kind(name, dims, layer_format, embedding_format)
        if kind.name == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * int(np.prod(dims)), kind)
        else:  # gguf-py takes a quantized tensor's shape in bytes
            block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
            row_bytes = dims[1] // block_size * type_size
            writer.add_tensor_info(name, (dims[0], row_bytes), np.dtype(np.uint8), dims[0] * row_bytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims in layout:
        kind = _kind(name, dims, layer_format, embedding_format)
        if len(dims) == 1:
            writer.write_tensor_data(np.ones(dims, np.float32))
        else:
            writer.write_tensor_data(gguf.quants.quantize(rng.standard_normal(dims, np.float32) * 0.02, kind))
    writer.close()
    path.with_suffix(".partial").rename(path)


def synthetic_gguf(size: str, layer_format: str, embedding_format: str = "Q8_0") -> Path:
    """The path of the file, written first if it is not there yet."""
    if size not in SHAPES or layer_format not in FORMATS:
        raise SystemExit(f"sizes: {', '.join(SHAPES)}; formats: {', '.join(FORMATS)}")
    path = synthetic_home() / f"llama-{size}-{layer_format}-embed-{embedding_format}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path.name} ({SHAPES[size].parameters() / 1e9:.2f}B parameters) ...", flush=True)
        write(path, SHAPES[size], layer_format, embedding_format)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SHAPES, default="tiny")
    parser.add_argument("--format", choices=FORMATS, default="Q4_1")
    parser.add_argument("--embedding-format", choices=FORMATS, default="Q8_0")
    args = parser.parse_args()
    print(synthetic_gguf(args.size, args.format, args.embedding_format))


if __name__ == "__main__":
    main()
