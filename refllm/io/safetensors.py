"""Hugging Face model directories: config.json, safetensors weights, tokenizer.

Weights are memory-mapped, not read: a float32 tensor is a read-only view of
the file, so loading a checkpoint does not hold it twice in memory. float16 and
bfloat16 tensors are upcast to float32 one tensor at a time.

safetensors' own numpy API copies every tensor and cannot read bfloat16, so
the file's documented layout (an 8-byte little-endian header length, a JSON
header of dtype/shape/offsets, then the raw bytes) is mapped here directly.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import WeightError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class CheckpointError(WeightError):
    """A model directory or safetensors file that cannot be read."""


@dataclass(frozen=True)
class _TensorEntry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def _read_header(path: Path) -> dict[str, _TensorEntry]:
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its header)")
        (header_len,) = struct.unpack("<Q", prefix)
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path} has a corrupt safetensors header ({e})") from None
    data_start = 8 + header_len
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise CheckpointError(f"tensor {name!r} in {path} has dtype {info['dtype']}; refllm reads F32, F16, BF16")
        begin, end = info["data_offsets"]
        entries[name] = _TensorEntry(path, info["dtype"], tuple(info["shape"]), data_start + begin, data_start + end)
    return entries


class SafetensorsCheckpoint:
    """Named float32 tensors from one safetensors file or a sharded set (``model.safetensors.index.json``)."""

    def __init__(self, directory: Path):
        index = directory / "model.safetensors.index.json"
        if index.exists():
            files = sorted({directory / f for f in json.loads(index.read_text())["weight_map"].values()})
        else:
            files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no safetensors weights in {directory}")
        self.entries: dict[str, _TensorEntry] = {}
        for file in files:
            if not file.exists():
                raise CheckpointError(f"{index.name} names {file.name}, which is not in {directory}")
            self.entries |= _read_header(file)
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
    """A ModelSource for a Hugging Face model directory."""

    def __init__(self, directory: str | Path):
        from refllm.io.tokenizer import Tokenizer

        directory = Path(directory)
        config_file = directory / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{directory} has no config.json")
        try:
            raw_config = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{config_file} is not valid JSON ({e})") from None
        self.directory = directory
        self.config = ModelConfig.from_hf(raw_config)
        self.checkpoint = SafetensorsCheckpoint(directory)
        self.tokenizer = Tokenizer.from_directory(directory)

    def tensor_names(self) -> list[str]:
        return self.checkpoint.names()

    def tensor(self, name: str) -> np.ndarray:
        return self.checkpoint.tensor(name)

    def where(self, name: str | None) -> str:
        return self.checkpoint.where(name)
