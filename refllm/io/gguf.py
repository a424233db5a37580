"""GGUF files as a ModelSource: llama.cpp's metadata, names and layouts turned back into Hugging Face's.

``refllm/io/gguf_header.py`` reads the container's header. This module maps what
it finds onto what ``refllm/models`` expects from any checkpoint:

- metadata (``llama.block_count``, ``tokenizer.ggml.bos_token_id``, ...) to the
  keys of a Hugging Face ``config.json``, read by ``ModelConfig.from_hf``;
- tensor names (``blk.3.attn_q.weight``) to Hugging Face names
  (``model.layers.3.self_attn.q_proj.weight``);
- every tensor, whatever its block format, to float32 (or float64 for ground
  truth: the blocks' arithmetic redone in float64) (``refllm/quant``);
- and back through the layout changes llama.cpp's converter
  (``convert_hf_to_gguf.py``) made on the way in, in ``GGUFSource.tensor``:
  the q/k row permutation of ``llama`` and ``smollm3`` files and Gemma's norm
  weights stored with 1 added. The other architectures here are stored as
  Hugging Face has them.

What differs by architecture (its model type, the hyper-parameters its files
leave out and llama.cpp fixes in code, its own tensor names, the converter's
changes) is its family module's ``GGUF`` entry (``refllm/families/``).

Tensors are dequantized when ``tensor(name)`` asks for them, one at a time;
with ``quantized=True`` a matrix in a format the quantized kernels read is
handed out as a ``QuantizedTensor`` over its blocks instead (the q/k row
permutation moves whole rows, so it is undone on the blocks as stored).
Every refusal is a ``GGUFFileError`` naming the file and the problem.

Dimension letters: H query heads, K KV heads, E head dim, D hidden size.
"""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from refllm.config import ConfigError, ModelConfig
from refllm.config_checks import check_layer_count, check_number, check_size, check_token_id
from refllm.errors import WeightError
from refllm.families import GGUF_ARCHITECTURES, check_expert_count
from refllm.families.family import GgufArchitecture, GgufFacts
from refllm.io.gguf_header import GGUFHeader, TensorInfo, map_file
from refllm.io.gguf_tokenizer import tokenizer_from_gguf, tokenizer_metadata
from refllm.quant.formats import FORMATS, dequantize
from refllm.quant.linear import QuantizedTensor, kernel_reads

SUPPORTED_GGUF_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)  # general.architecture (model types: refllm/config.py)

_BAND_BYTES = 8 << 20  # stored bytes dequantized at a time: bounds the file pages resident during a load


class GGUFFileError(WeightError):
    """A GGUF file refllm cannot load: unreadable, truncated or corrupt, or of an
    architecture, tensor or tensor type it does not support."""


# ---- the q/k row permutation of llama files -------------------------------------------------------


def permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """Hugging Face rows -> GGUF rows of a q or k projection, as llama.cpp's converter permutes them.

    weights: [n_heads * E, ...] (a projection [n_heads * E, D] or its bias [n_heads * E]);
    n_heads is H for q and K for k. Hugging Face's RoPE rotates row i of a head
    with row i + E/2 (rotate-half); llama.cpp's ``llama`` RoPE rotates rows 2i and
    2i + 1. The converter interleaves each head's halves so the pairs stay pairs
    (``LlamaModel.permute`` in ``convert_hf_to_gguf.py``).
    """
    E = weights.shape[0] // n_heads
    by_half = weights.reshape(n_heads, 2, E // 2, *weights.shape[1:])  # [heads, half, i, ...]
    return by_half.swapaxes(1, 2).reshape(weights.shape)


def reverse_permute(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF rows -> Hugging Face rows: undoes ``permute``. Shapes as there."""
    E = weights.shape[0] // n_heads
    by_pair = weights.reshape(n_heads, E // 2, 2, *weights.shape[1:])  # [heads, i, half, ...]
    return by_pair.swapaxes(1, 2).reshape(weights.shape)


# ---- tensor names ------------------------------------------------------------------------------------

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# blk.N.<gguf> -> model.layers.N.<hf>, after gguf-py's tensor_mapping.py; a family's GGUF entry
# names the tensors it names otherwise (refllm/families/).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",  # Llama's pre-MLP norm
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # a sparse layer's router and experts, stacked [X, ...] (refllm/families/experts.py)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str, architecture: str) -> str | None:
    """The Hugging Face name of GGUF tensor ``gguf_name`` in a file of ``architecture``, or None if refllm
    has no such tensor."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None:
        return None
    layer, short, kind = match.groups()
    names = _LAYER_NAMES | GGUF_ARCHITECTURES[architecture].layer_names
    return f"model.layers.{layer}.{names[short]}.{kind}" if short in names else None


# ---- the source ------------------------------------------------------------------------------------


class GGUFSource:
    """A ModelSource for one GGUF file."""

    def __init__(self, path: str | Path, quantized: bool = False, dtype: str = "float32"):
        self.path = Path(path)
        self.quantized = quantized
        self.dtype = np.dtype(dtype)  # of the dequantized tensors
        self._map, self.header = self._open()
        self.architecture = self._architecture()
        self.family: GgufArchitecture = GGUF_ARCHITECTURES[self.architecture]
        self._tensors = self._map_tensors()  # Hugging Face name -> TensorInfo
        try:
            self.config = ModelConfig.from_hf(self._hf_config())
            check_expert_count(self.config, self._tensors, f"metadata {self.architecture}.expert_count")
        except ConfigError as e:
            raise GGUFFileError(f"{self.path}: {e}") from None
        self.tokenizer = self._tokenizer()
        self.release(0, self.header.data_offset)  # the header's pages: read, and done with

    def release(self, offset: int, size: int) -> None:
        """Drop the file pages of ``size`` bytes from ``offset``, already read, from this process's resident set.

        They would otherwise stay counted until the file is closed, adding the
        whole file to the peak memory of a load. The map is read-only and
        file-backed, so a later read simply faults the pages back in.
        """
        start = offset - offset % mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, start, offset + size - start)

    # ---- ModelSource ----

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor(self, name: str) -> np.ndarray | QuantizedTensor:
        """The named tensor in Hugging Face layout, [out, in] for a projection: in ``dtype``, or its blocks
        (``QuantizedTensor``) when the source is ``quantized`` and a kernel reads the format."""
        stored = self._tensors[name]
        kind = stored.type.name
        if self.quantized and kernel_reads(kind, stored.shape):
            rows = QuantizedTensor.from_raw(self._bytes(stored), kind, stored.shape).blocks  # [out, row bytes]
            kept = self._undo_conversion(name, rows)
            if kept is not rows:  # reordered into a copy: the file's rows are read and done with
                self.release(stored.offset, rows.nbytes)
            return QuantizedTensor(kept, kind, stored.shape)
        return self._undo_conversion(name, self._dequantize(stored))

    def where(self, name: str | None) -> str:
        if name is None:
            return str(self.path)
        return f"{self.path} (GGUF tensor {self._tensors[name].name!r})"

    def _bytes(self, stored: TensorInfo) -> np.ndarray:
        """A tensor's stored bytes, [nbytes] uint8: a read-only view of the map."""
        return np.frombuffer(self._map, np.uint8, stored.nbytes, stored.offset)

    def _dequantize(self, stored: TensorInfo) -> np.ndarray:
        """The tensor in ``dtype``, dequantized a band of rows at a time, each band's file pages released once read."""
        out = np.empty(stored.shape, dtype=self.dtype)
        rows = out.reshape(-1, stored.shape[-1])  # [R, C], a view
        raw = self._bytes(stored)
        row_bytes = raw.size // rows.shape[0]
        band = max(1, _BAND_BYTES // row_bytes)
        for start in range(0, rows.shape[0], band):
            stop = min(start + band, rows.shape[0])
            band_shape = (stop - start, stored.shape[-1])
            band_bytes = raw[start * row_bytes : stop * row_bytes]
            rows[start:stop] = dequantize(band_bytes, stored.type.name, band_shape, self.dtype)
            self.release(stored.offset + start * row_bytes, (stop - start) * row_bytes)
        return out

    # ---- what llama.cpp's converter changed ----

    def _undo_conversion(self, name: str, weights: np.ndarray) -> np.ndarray:
        attention = self.config.attention
        if self.family.permuted_qk:
            # LlamaModel.modify_tensors permutes q_proj (weight and bias) with H heads and k_proj with K.
            if ".self_attn.q_proj." in name:
                return self._unpermuted(name, weights, attention.num_heads)
            if ".self_attn.k_proj." in name:
                return self._unpermuted(name, weights, attention.num_kv_heads)
        if self.family.norms_plus_one and name.endswith("norm.weight"):
            # Gemma3Model.modify_tensors (and Gemma2Model's) adds 1 to every tensor named *norm.weight (the layer norms,
            # q_norm, k_norm and the final norm) so llama.cpp can multiply by w; refllm applies (1 + w).
            return weights - 1.0
        return weights

    def _unpermuted(self, name: str, weights: np.ndarray, n_heads: int) -> np.ndarray:
        head_dim = self.config.attention.head_dim
        rows = n_heads * head_dim
        if weights.shape[0] != rows or head_dim % 2:
            raise GGUFFileError(
                f"{self.where(name)} has shape {weights.shape}; {n_heads} heads of an even head dim"
                f" ({head_dim}) need {rows} rows"
            )
        return reverse_permute(weights, n_heads)

    # ---- reading the file ----

    def _open(self) -> tuple[mmap.mmap, GGUFHeader]:
        if not self.path.is_file():
            raise GGUFFileError(f"{self.path}: no such file")
        try:
            mapped, header = map_file(self.path)
        except (ValueError, IndexError, KeyError, OverflowError, struct.error) as e:
            # A truncated or corrupt header trips the reader wherever its bytes stop making sense:
            # a short read, an unknown type code, undecodable text.
            raise GGUFFileError(f"{self.path} is not a readable GGUF file (truncated or corrupt?): {e}") from None
        except OSError as e:
            raise GGUFFileError(f"{self.path} cannot be read: {e}") from None
        if not header.little_endian:  # the dequantizers read little-endian blocks, as llama.cpp writes them
            raise GGUFFileError(f"{self.path} is a big-endian GGUF file; refllm reads little-endian ones")
        return mapped, header

    def _value(self, key: str, default: Any = None) -> Any:
        return self.header.metadata.get(key, default)

    def _require(self, key: str) -> Any:
        value = self._value(key)
        if value is None:
            raise GGUFFileError(f"{self.path} has no metadata key {key!r}, which a {self.architecture} model needs")
        return value

    def _size(self, key: str, default: int | None = None) -> int:
        """A positive integer of the metadata (required unless ``default`` is given), refused by name otherwise."""
        return check_size(self._require(key) if default is None else self._value(key, default), key)

    def _number(self, key: str, default: float | None = None) -> float:
        return check_number(self._require(key) if default is None else self._value(key, default), key)

    def _layer_count(self, key: str) -> int:
        """The block count, refused unless the file holds tensors for exactly that many layers."""
        layers = self._size(key)
        check_layer_count(layers, self._tensors, f"metadata {key}")
        return layers

    def _architecture(self) -> str:
        architecture = self._value("general.architecture")
        if architecture is None:
            raise GGUFFileError(f"{self.path} has no metadata key 'general.architecture'")
        if architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise GGUFFileError(
                f"{self.path}: architecture {architecture!r} is not supported;"
                f" supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
            )
        return architecture

    def _map_tensors(self) -> dict[str, TensorInfo]:
        tensors = {}
        for stored in self.header.tensors:
            name = hf_name(stored.name, self.architecture)
            if name is None:
                raise GGUFFileError(
                    f"{self.path}: tensor {stored.name!r} has no counterpart in refllm's {self.architecture} model"
                )
            if stored.type.name not in FORMATS:
                raise GGUFFileError(
                    f"{self.path}: tensor {stored.name!r} has type {stored.type.name}, which refllm cannot"
                    f" dequantize; supported: {', '.join(FORMATS)}"
                )
            tensors[name] = stored
        if "model.embed_tokens.weight" not in tensors or len(tensors["model.embed_tokens.weight"].shape) != 2:
            raise GGUFFileError(f"{self.path} has no 2-D tensor 'token_embd.weight'")
        return tensors

    def _tokenizer(self):
        if "tokenizer.ggml.model" not in self.header.metadata:
            return None
        try:
            return tokenizer_from_gguf(tokenizer_metadata(self.header.metadata))
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 (tokenizers raises bare Exceptions; corrupt values raise TypeErrors)
            raise GGUFFileError(f"{self.path}: its tokenizer (tokenizer.ggml.*) cannot be built: {e}") from None

    # ---- metadata -> config.json ----

    def _hf_config(self) -> dict[str, Any]:
        """The file's hyper-parameters under Hugging Face ``config.json`` keys.

        The GGUF keys are llama.cpp's (``src/llama-arch.cpp``), prefixed with the architecture.
        """
        arch = self.architecture

        def key(name: str) -> str:
            return f"{arch}.{name}"

        hidden_size = self._size(key("embedding_length"))
        num_heads = self._size(key("attention.head_count"))
        head_dim = self._size(key("attention.key_length"), max(hidden_size // num_heads, 1))
        value_dim = self._size(key("attention.value_length"), head_dim)
        if value_dim != head_dim:
            raise GGUFFileError(f"{self.path}: key length {head_dim} and value length {value_dim} differ")
        config: dict[str, Any] = dict(
            vocab_size=int(self._tensors["model.embed_tokens.weight"].shape[0]),  # [V, D]
            hidden_size=hidden_size,
            intermediate_size=self._size(key("feed_forward_length")),
            num_hidden_layers=self._layer_count(key("block_count")),
            num_attention_heads=num_heads,
            num_key_value_heads=self._size(key("attention.head_count_kv"), num_heads),
            head_dim=head_dim,
            max_position_embeddings=self._size(key("context_length")),
            rms_norm_eps=self._number(key("attention.layer_norm_rms_epsilon")),
            rope_theta=self._number(key("rope.freq_base"), 10_000.0),  # llama.cpp's default
            rope_scaling=self._rope_scaling(key),
            tie_word_embeddings="lm_head.weight" not in self._tensors,  # llama.cpp reuses token_embd
            attention_bias="model.layers.0.self_attn.q_proj.bias" in self._tensors,
            mlp_bias="model.layers.0.mlp.up_proj.bias" in self._tensors,
            bos_token_id=check_token_id(self._value("tokenizer.ggml.bos_token_id"), "tokenizer.ggml.bos_token_id"),
            eos_token_id=self._end_of_generation_ids(),
        )
        if self._value(key("rope.scaling.original_context_length")) is not None:
            config["original_max_position_embeddings"] = self._size(key("rope.scaling.original_context_length"))
        if self._value(key("rope.dimension_count")) is not None:
            config["partial_rotary_factor"] = self._size(key("rope.dimension_count")) / head_dim
        window = None  # 0 or absent means none (Phi-4 writes 0)
        if self._value(key("attention.sliding_window")):
            window = self._size(key("attention.sliding_window"))
        facts = GgufFacts(
            arch, config["num_hidden_layers"], window, hidden_size, num_heads, head_dim, tuple(self._tensors),
            self._value, self._number, self._size,
        )
        return config | self.family.config(facts)

    def _rope_scaling(self, key) -> dict[str, Any] | None:
        kind = self._value(key("rope.scaling.type"), "none")
        if kind == "none":
            return None
        if kind not in ("linear", "yarn"):
            raise GGUFFileError(f"{self.path}: rope scaling type {kind!r} is not supported; supported: linear, yarn")
        return {"rope_type": kind, "factor": self._number(key("rope.scaling.factor"))}

    def _end_of_generation_ids(self) -> list[int]:
        """EOS, then the end-of-turn/-message tokens llama.cpp also stops on, when the file names them."""
        keys = [f"tokenizer.ggml.{kind}_token_id" for kind in ("eos", "eot", "eom")]
        ids = [check_token_id(self._value(key), key) for key in keys]
        return list(dict.fromkeys(i for i in ids if i is not None))
