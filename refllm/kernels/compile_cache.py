"""Numba's on-disk cache, keyed to every kernel source at once.

Numba stamps a cached function with the hash of its own file only. A kernel
that compiles in a function from another file (every kernel uses
``intrinsics.py``; the activation kernel uses ``exp.py``'s exponential)
would keep returning its old results after that other file changed, until the
``.nbc`` files were deleted. Here every kernel's cache entry is stamped with the
hash of all the source files of this package together, so a change to any of
them recompiles every kernel on its next use.

Numba's cache is also not safe for two processes compiling at once (a first
``refllm generate`` beside its background compile, two Ray workers): each reads
the index of a function's compiled signatures, gives its new one the first free
data file, and writes the index back, so two new signatures can get the same
file and one of them then loads the other's machine code. ``one_process_at_a_time``
makes each write of an index and its data file hold a lock on that index, and
each read wait for a write under way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from numba.core import caching

KERNEL_SOURCES = Path(__file__).resolve().parent
# Numba's list of cache locators (CacheImpl since 0.61, _CacheImpl before).
_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl


def kernel_sources_stamp() -> bytes:
    """SHA-256 of every .py file of this package, re-read whenever one's size or mtime changes."""
    files = sorted(KERNEL_SOURCES.glob("*.py"))
    return _hash_sources(tuple((file.name, file.stat().st_mtime_ns, file.stat().st_size) for file in files))


@functools.lru_cache(maxsize=8)
def _hash_sources(stats: tuple[tuple[str, int, int], ...]) -> bytes:
    digest = hashlib.sha256()
    for name, _, _ in stats:
        digest.update(name.encode() + b"\0" + (KERNEL_SOURCES / name).read_bytes())
    return digest.digest()


class KernelSourcesLocator(caching._CacheLocator):
    """Numba's own locator for a kernel of this package (same cache folder), stamped with every kernel source."""

    def __init__(self, base: caching._CacheLocator, py_file: str):
        self._base = base
        self._py_file = py_file  # Numba names it in its warnings

    def ensure_cache_path(self) -> None:
        self._base.ensure_cache_path()

    def get_cache_path(self) -> str:
        return self._base.get_cache_path()

    def get_disambiguator(self) -> str:
        return self._base.get_disambiguator()

    def get_source_stamp(self) -> bytes:
        return kernel_sources_stamp()

    @classmethod
    def from_function(cls, py_func, py_file: str) -> KernelSourcesLocator | None:
        if Path(py_file).resolve().parent != KERNEL_SOURCES:
            return None
        for locator_class in _CACHE_IMPL._locator_classes:
            if locator_class is not cls:
                base = locator_class.from_function(py_func, py_file)
                if base is not None:
                    return cls(base, py_file)
        return None


def key_cache_to_every_kernel_source() -> None:
    """Put ``KernelSourcesLocator`` first in Numba's locators: before any kernel of this package is decorated."""
    if KernelSourcesLocator not in _CACHE_IMPL._locator_classes:
        _CACHE_IMPL._locator_classes.insert(0, KernelSourcesLocator)


@contextlib.contextmanager
def _index_lock(index_path: str, mode: int) -> Iterator[None]:
    """Hold ``flock(mode)`` on ``index_path``.lock; without it where the folder refuses a new file."""
    try:
        descriptor = os.open(index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(descriptor, mode)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def one_process_at_a_time() -> None:
    """Make Numba's cache entries written under an exclusive lock on their index, and read under a shared one."""
    cache_file = caching.IndexDataCacheFile
    if getattr(cache_file.save, "locked", False):
        return
    numba_save, numba_load = cache_file.save, cache_file.load

    def save(self, key, data):
        with _index_lock(self._index_path, fcntl.LOCK_EX):
            numba_save(self, key, data)

    def load(self, key):
        with _index_lock(self._index_path, fcntl.LOCK_SH):
            return numba_load(self, key)

    save.locked = load.locked = True
    cache_file.save, cache_file.load = save, load
