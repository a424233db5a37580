"""Shards of a job, their results, and the folder that keeps finished ones so an interrupted job resumes.

A shard is a run of consecutive items (prompts or windows). Its result is a
set of named arrays and strings, stored as one safetensors file, written under
a temporary name, flushed to disk and renamed, so a driver stopped mid-write
leaves no partial shard. Beside the shards, ``job.json`` records what the job
was; a folder written for another job is refused rather than mixed in.

A shard file cannot lie: its metadata carries the sha256 of the job's manifest
(the model's identity, the job's kind and parameters), its own index and items,
and a sha256 of all of that and of every tensor's name, dtype, shape and bytes.
On resume each file is verified; one that cannot be read (truncated, garbage),
whose checksum does not match (a byte changed) or that belongs to another job or
another shard is named on stderr and computed again, its file replaced then.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refllm.errors import InvalidInputError

MANIFEST = "job.json"
SHARD_FILE = re.compile(r"shard-(\d{6})\.safetensors")
JOB, ITEMS, CHECKSUM = "shard.job_sha256", "shard.items", "shard.sha256"  # every shard's own metadata


class ShardStoreMismatchError(InvalidInputError):
    """A shard folder written for a different job, or whose manifest is damaged."""


class DamagedShardError(ValueError):
    """A shard file that does not verify (why, in the message); its shard is computed again."""


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


def file_identity(path: str | Path) -> str:
    """A digest of a file's, or a folder's files', names, sizes and modification times: what changes when a
    model is replaced or edited, read without reading gigabytes of weights."""
    path = Path(path).resolve()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    stats = [(str(p.relative_to(path.parent)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()


class ShardStore:
    """Finished shards of one job as files in ``directory``, beside the job's manifest."""

    def __init__(self, directory: str | Path, manifest: dict[str, str]):
        self.directory = Path(directory)
        self.job_sha256 = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        path = self.directory / MANIFEST
        if path.is_file():
            written = _read_manifest(path)
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
        """Indices of the shard files present, verified or not."""
        return {int(m.group(1)) for p in self.directory.iterdir() if (m := SHARD_FILE.fullmatch(p.name))}

    def resume(self, shards: list[Shard]) -> dict[int, ShardResult]:
        """The results of ``shards`` already here that verify; each file that does not is named on stderr."""
        results, present = {}, self.finished()
        for shard in shards:
            if shard.index in present:
                try:
                    results[shard.index] = self.load(shard)
                except DamagedShardError as error:
                    print(f"{self._path(shard.index)} {error}; computing shard {shard.index} again", file=sys.stderr)
        return results

    def save(self, result: ShardResult, shard: Shard) -> None:
        from safetensors.numpy import save

        tensors = {name: np.ascontiguousarray(array) for name, array in result.tensors.items()}
        metadata = result.info | {"tokens": str(result.tokens), "worker": result.worker}
        metadata |= {JOB: self.job_sha256, ITEMS: _items(shard)}
        metadata[CHECKSUM] = _checksum(tensors, metadata)
        _write_atomically(self._path(shard.index), save(tensors, metadata=metadata))

    def load(self, shard: Shard) -> ShardResult:
        """The stored result of ``shard``, or a DamagedShardError saying why its file does not verify."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(self._path(shard.index)), "np") as f:
                info = dict(f.metadata() or {})
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except (SafetensorError, OSError, ValueError, TypeError) as error:
            raise DamagedShardError(f"cannot be read (truncated, or not a shard file: {error})") from None
        written = info.pop(CHECKSUM, None)
        if written is None:
            raise DamagedShardError("carries no checksum (written before shards had one)")
        if written != _checksum(tensors, info):
            raise DamagedShardError("does not match its checksum (its bytes changed after it was written)")
        if info.get(JOB) != self.job_sha256:
            raise DamagedShardError("was written for another job (another model, data or parameters)")
        if info.get(ITEMS) != _items(shard):
            raise DamagedShardError(f"holds shard {info.get(ITEMS)!r:.40}, not {_items(shard)!r}")
        for key in (JOB, ITEMS):
            del info[key]
        tokens, worker = int(info.pop("tokens")), info.pop("worker")
        return ShardResult(shard.index, tensors, info, tokens, worker)

    def remove(self) -> None:
        shutil.rmtree(self.directory)

    def _path(self, index: int) -> Path:
        return self.directory / f"shard-{index:06d}.safetensors"


def _items(shard: Shard) -> str:
    """A shard's index and its items' range, as its file records them: "index:begin:end"."""
    return f"{shard.index}:{shard.items.start}:{shard.items.stop}"


def _checksum(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """sha256 over the metadata (keys sorted) and each tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode())
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.data)
    return digest.hexdigest()


def _read_manifest(path: Path) -> dict:
    try:
        written = json.loads(path.read_bytes())
        problem = None if isinstance(written, dict) else f"a JSON {type(written).__name__}, not an object"
    except (OSError, ValueError) as error:
        problem = str(error)
    if problem is not None:
        raise ShardStoreMismatchError(
            f"{path} is damaged ({problem}); delete it to resume from the shards beside it (each is checked"
            f" against this job), or delete {path.parent} to start over"
        )
    return written


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
