"""Numba's compiler out of the resident set once the kernels it built are loaded.

Numba compiles, and loads compiled kernels from its cache, through LLVM, whose
library (llvmlite's, some 180 MB on disk) the process maps at import. LLVM's
start-up touches most of its code: about 100 MB of it stays resident for the
rest of the process, although a process that has loaded its kernels never runs
it again. A model of a few hundred megabytes then peaked at a third more than
its file.

Those pages are clean pages of a file (code and read-only data, never written),
so dropping them from the process loses nothing: ``madvise(MADV_DONTNEED)`` takes
them out of the resident set, and should LLVM run again (a kernel compiled or
loaded later) they are read back from the page cache or the file. A listener on
Numba's compiler lock notes each compilation or cache load; ``release`` drops the
pages if there was one since the last release, and costs a few microseconds
otherwise. Mappings with written (private) pages, such as the relocated tables,
are left alone: dropping those would lose the relocations.

Linux only (``/proc/self/smaps``); elsewhere ``release`` does nothing.
"""

from __future__ import annotations

import ctypes
import mmap

from numba.core import event

COMPILER_LIBRARY = "libllvmlite"
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


class _CompilerUse(event.Listener):
    """Notes that Numba's compiler ran (a compilation, or a kernel loaded from the cache)."""

    used = True  # since the last release; LLVM's start-up itself touched its pages
    runs = 0  # in this process

    def on_start(self, event_):
        pass

    def on_end(self, event_):
        _CompilerUse.used = True
        _CompilerUse.runs += 1


event.register("numba:compiler_lock", _CompilerUse())


def compiler_mappings(smaps_path: str = "/proc/self/smaps") -> list[tuple[int, int]]:
    """(start, end) of every read-only mapping of LLVM's library whose pages are all clean file pages."""
    try:
        with open(smaps_path) as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return []
    mappings = []  # [start, end, whether it is LLVM's and read-only, whether every page is clean]
    for line in lines:
        fields = line.split()
        if len(fields) >= 5 and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
            start, end = (int(part, 16) for part in fields[0].split("-"))
            ours = len(fields) > 5 and COMPILER_LIBRARY in fields[5] and "w" not in fields[1]
            mappings.append([start, end, ours, True])
        elif mappings and fields[:1] in (["Private_Dirty:"], ["Anonymous:"]) and int(fields[1]) > 0:
            mappings[-1][3] = False
    return [(start, end) for start, end, ours, clean in mappings if ours and clean]


def release() -> int:
    """Drop LLVM's clean pages from the resident set if the compiler ran since the last call -> bytes advised."""
    if not _CompilerUse.used:
        return 0
    _CompilerUse.used = False
    libc = ctypes.CDLL(None, use_errno=True)
    advised = 0
    for start, end in compiler_mappings():
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) == 0:
            advised += end - start
    return advised
