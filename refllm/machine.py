"""What machine this is, for benchmark headers and ``refllm bench``: the CPU, its vector extensions,
and the thread settings the kernels run under."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The environment variables that decide how refllm uses the cores, as benchmarks report them.
THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS")

# The vector extensions LLVM can compile the kernels' loops to, in /proc/cpuinfo's spelling (x86, then Arm).
VECTOR_EXTENSIONS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni",
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "sve", "sve2",
)  # fmt: skip


def refllm_home() -> Path:
    """Where refllm keeps what it fetches and learns: $REFLLM_HOME, by default ~/.cache/refllm."""
    return Path(os.environ.get("REFLLM_HOME") or Path.home() / ".cache" / "refllm").expanduser()


def machine_key() -> str:
    """This machine as far as kernel speeds go: the CPU, its vector extensions and its cores."""
    return f"{cpu_name()} | {' '.join(vector_extensions())} | {os.cpu_count()} cores"


def _cpuinfo(key: str) -> str | None:
    """The value of the first ``key`` line of /proc/cpuinfo, or None (no such line, or no such file)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            lines = cpuinfo.readlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, or what the platform module knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def vector_extensions() -> tuple[str, ...]:
    """The VECTOR_EXTENSIONS this CPU has, from /proc/cpuinfo's flags (x86) or features (Arm); () where unknown."""
    flags = set((_cpuinfo("flags") or _cpuinfo("Features") or "").split())
    return tuple(name for name in VECTOR_EXTENSIONS if name in flags)


def seconds_since_start() -> float | None:
    """Wall time since this process started (Linux: /proc), or None where it cannot be read."""
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return now - started_ticks / os.sysconf("SC_CLK_TCK")


def thread_settings() -> str:
    """One line: Numba's thread count and THREAD_VARIABLES ('-' where unset), as the kernels run under them."""
    import numba

    from refllm.kernels.threads import apply_thread_policy

    apply_thread_policy()  # the defaults the kernels set on their first use
    variables = ", ".join(f"{name}={os.environ.get(name, '-')}" for name in THREAD_VARIABLES)
    return (
        f"{numba.get_num_threads()} Numba threads, fewer while other programs keep cores busy; {variables};"
        " BLAS on the pass's threads in prompt-sized products, on one thread otherwise"
    )
