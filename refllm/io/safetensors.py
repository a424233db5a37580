"""Hugging Face model directories: config.json, safetensors weights, tokenizer.

Weights are memory-mapped, not read: a float32 tensor is a read-only view of
the file, so loading a checkpoint does not hold it twice in memory. float16 and
bfloat16 tensors are upcast to float32 one tensor at a time.

safetensors' own numpy API copies every tensor and cannot read bfloat16, so
the file's documented layout (an 8-byte little-endian header length, a JSON
header of dtype/shape/offsets, then the raw bytes) is mapped here directly.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from refllm.config import ConfigError, ModelConfig
from refllm.config_checks import check_layer_count
from refllm.errors import WeightError
from refllm.families import check_expert_count
from refllm.families.keys import expert_count_key
from refllm.families.vision import read_multimodal
from refllm.io.image_processing import load_image_processor
from refllm.io.json_file import parse_json_object, read_json_object
from refllm.models.weights import canonical_name

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own bound on its JSON header
MAX_DIMS = 8


class CheckpointError(WeightError):
    """A model directory or safetensors file that cannot be read."""


@dataclass(frozen=True)
class _TensorEntry:
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def _read_header(path: Path) -> dict[str, _TensorEntry]:
    """The tensor table of a safetensors file, every entry checked against the file before it is trusted."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its header)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(file_size - 8, MAX_HEADER_BYTES):
            raise CheckpointError(
                f"{path}: header length {header_len} is past the file's {file_size} bytes"
                f" or the format's {MAX_HEADER_BYTES}"
            )
        header = parse_json_object(f.read(header_len), f"the safetensors header of {path}", CheckpointError)
    data_start, data_size = 8 + header_len, file_size - 8 - header_len
    entries = {name: _entry(path, name, info, data_start, data_size) for name, info in header.items()
               if name != "__metadata__"}  # fmt: skip
    previous = None
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if previous is not None and entry.start < previous.end:
            raise CheckpointError(f"{path}: tensor {entry.name!r} overlaps tensor {previous.name!r}")
        previous = entry
    return entries


def _entry(path: Path, name: str, info: Any, data_start: int, data_size: int) -> _TensorEntry:
    """One tensor's entry of the header -> where its bytes are, refused unless they fit its dtype, shape and file."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where} has an entry that is not an object: {info!r:.60}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise CheckpointError(f"{where} has dtype {dtype!r:.30}; refllm reads F32, F16, BF16")
    if not _integers(shape, lambda n: n >= 0) or len(shape) > MAX_DIMS:
        raise CheckpointError(f"{where} has shape {shape!r:.60}, not a list of at most {MAX_DIMS} sizes >= 0")
    if not (_integers(offsets, lambda n: 0 <= n <= data_size) and len(offsets) == 2 and offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where} has data_offsets {offsets!r:.60}, not [begin, end] within its {data_size} bytes")
    nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise CheckpointError(
            f"{where} of dtype {dtype} and shape {shape} takes {nbytes} bytes; its data_offsets {offsets} hold"
            f" {offsets[1] - offsets[0]}"
        )
    return _TensorEntry(path, name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def _integers(value: Any, ok: Callable[[int], bool]) -> bool:
    """Whether ``value`` is a list of integers (not booleans), each ``ok``."""
    return isinstance(value, list) and all(type(n) is int and ok(n) for n in value)


class SafetensorsCheckpoint:
    """Named float32 tensors from one safetensors file or a sharded set (``model.safetensors.index.json``)."""

    def __init__(self, directory: Path):
        index = directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = read_json_object(index, CheckpointError).get("weight_map")
            names = list(weight_map.values()) if isinstance(weight_map, dict) else None
            if names is None or not all(isinstance(n, str) and n and Path(n).name == n for n in names):
                raise CheckpointError(f"{index}: weight_map must map tensor names to file names in {directory}")
            files = sorted({directory / n for n in names})
        else:
            files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no safetensors weights in {directory}")
        self.entries: dict[str, _TensorEntry] = {}
        for file in files:
            if not file.exists():
                raise CheckpointError(f"{index.name} names {file.name}, which is not in {directory}")
            entries = _read_header(file)
            twice = next(iter(entries.keys() & self.entries.keys()), None)
            if twice is not None:
                raise CheckpointError(f"tensor {twice!r} is in both {self.entries[twice].file} and {file}")
            self.entries |= entries
        self._maps: dict[Path, np.memmap] = {}

    def names(self) -> list[str]:
        return list(self.entries)

    def where(self, name: str | None) -> str:
        if name is None:
            files = sorted({e.file.name for e in self.entries.values()})
            return ", ".join(files)
        return str(self.entries[name].file)

    def tensor(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        raw = self._map(entry.file)[entry.start : entry.end].view(_DTYPES[entry.dtype]).reshape(entry.shape)
        if entry.dtype == "F32":
            return np.asarray(raw)  # a read-only view of the mapped file, no copy
        if entry.dtype == "F16":
            return raw.astype(np.float32)
        # bfloat16 is the top half of a float32: shift it back into place.
        return (raw.astype(np.uint32) << 16).view(np.float32)

    def _map(self, file: Path) -> np.memmap:
        if file not in self._maps:
            self._maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
        return self._maps[file]


class HFDirectorySource:
    """A ModelSource for a Hugging Face model directory; for a vision-language model (SmolVLM, Gemma 3 with
    vision) also ``multimodal`` (its image config) and ``image_processor``, else None."""

    def __init__(self, directory: str | Path):
        from refllm.io.tokenizer import Tokenizer

        directory = Path(directory)
        config_file = directory / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{directory} has no config.json")
        raw_config = read_json_object(config_file, CheckpointError)
        self.directory = directory
        try:
            self.config = ModelConfig.from_hf(raw_config)
        except ConfigError as e:
            raise ConfigError(f"{config_file}: {e}") from None
        self.checkpoint = SafetensorsCheckpoint(directory)
        unused_layers = self.config.unused_layers
        text_names = [n for n in map(canonical_name, self.checkpoint.names()) if n is not None]  # a VLM's text model
        check_layer_count(self.config.num_hidden_layers, text_names, str(config_file), unused_layers)
        check_expert_count(self.config, self.checkpoint.names(), f"{config_file} ({expert_count_key(raw_config)})")
        self.tokenizer = Tokenizer.from_directory(directory)
        # a vision-language checkpoint's image half: its tower's config, and the image processor beside it
        self.multimodal = read_multimodal(raw_config, self.config.hidden_size)
        self.image_processor = None
        if self.multimodal is not None:
            m = self.multimodal
            self.image_processor = load_image_processor(directory, m.model_type, m.tokens_per_image, m.vision.image_size)

    def tensor_names(self) -> list[str]:
        return self.checkpoint.names()

    def tensor(self, name: str) -> np.ndarray:
        return self.checkpoint.tensor(name)

    def where(self, name: str | None) -> str:
        return self.checkpoint.where(name)
