"""Shards of a job, their results, and the folder that keeps finished ones so an interrupted job resumes.

A shard is a run of consecutive items (prompts or windows). Its result is a
set of named arrays and strings, stored as one safetensors file, written under
a temporary name and renamed, so a driver stopped mid-write leaves no partial
shard. Beside the shards, ``job.json`` records what the job was; a folder
written for another job is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refllm.errors import InvalidInputError

MANIFEST = "job.json"
SHARD_FILE = re.compile(r"shard-(\d{6})\.safetensors")


class ShardStoreMismatchError(InvalidInputError):
    """A shard folder written for a different job."""


@dataclass(frozen=True)
class Shard:
    index: int
    items: range  # prompt or window indices


def split(count: int, size: int) -> list[Shard]:
    """``count`` items in shards of ``size`` consecutive ones (the last may be shorter)."""
    if size < 1:
        raise InvalidInputError(f"a shard holds at least one item, not {size}")
    return [Shard(index, range(begin, min(begin + size, count))) for index, begin in enumerate(range(0, count, size))]


@dataclass
class ShardResult:
    index: int
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    tokens: int = 0  # tokens the shard ran through the model
    worker: str = ""  # node address and process id of the actor that ran it
    pid: int = 0
    error: str | None = None  # why the shard's data cannot be run; such a shard is not retried


class ShardStore:
    """Finished shards of one job as files in ``directory``, beside the job's manifest."""

    def __init__(self, directory: str | Path, manifest: dict[str, str]):
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        if path.is_file():
            written = json.loads(path.read_text())
            differ = sorted(key for key in manifest.keys() | written.keys() if manifest.get(key) != written.get(key))
            if differ:
                raise ShardStoreMismatchError(
                    f"{self.directory} holds shards of another job (its {differ[0]} is {written.get(differ[0])!r},"
                    f" this job's {manifest.get(differ[0])!r}); remove it or choose another folder"
                )
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            _write_atomically(path, json.dumps(manifest, indent=1, sort_keys=True).encode())

    def finished(self) -> set[int]:
        return {int(m.group(1)) for p in self.directory.iterdir() if (m := SHARD_FILE.fullmatch(p.name))}

    def save(self, result: ShardResult) -> None:
        from safetensors.numpy import save

        info = result.info | {"tokens": str(result.tokens), "worker": result.worker}
        tensors = {name: np.ascontiguousarray(array) for name, array in result.tensors.items()}
        _write_atomically(self._path(result.index), save(tensors, metadata=info))

    def load(self, index: int) -> ShardResult:
        from safetensors import safe_open

        with safe_open(str(self._path(index)), "np") as f:
            info = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        tokens, worker = int(info.pop("tokens")), info.pop("worker")
        return ShardResult(index, tensors, info, tokens, worker)

    def remove(self) -> None:
        shutil.rmtree(self.directory)

    def _path(self, index: int) -> Path:
        return self.directory / f"shard-{index:06d}.safetensors"


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)
