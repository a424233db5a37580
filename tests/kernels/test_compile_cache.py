"""Numba's on-disk cache cannot go stale: a kernel recompiles when a function it uses from another file changes.

``refllm/kernels/activation.py`` compiles in ``exp_nonpositive`` from
``refllm/kernels/exp.py``. Numba stamps a cache entry with its own file's
hash only, so after an edit to exp.py the activation kernel kept its old
machine code. Each test runs the kernel in a fresh process over a temporary copy
of the package, edits the other file, and runs it again in another fresh process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from numba.core.caching import IndexDataCacheFile

import refllm

pytestmark = pytest.mark.slow

SILU_OF_MINUS_ONE = (
    "import numpy as np; from refllm.kernels.activation import gated;"
    " print(float(gated(np.array([-1.0], np.float32), np.array([1.0], np.float32))[0]))"
)
# exp_nonpositive returning 0 makes SiLU(g) = g * e / (1 + e) zero for g < 0.
EXP_LINE = "    return p * float32_from_bits((np.int32(n) + np.int32(127)) << 23)"
EXP_ZERO = "    return np.float32(0.0)"


def copy_of_refllm(tmp_path: Path) -> Path:
    shutil.copytree(Path(refllm.__file__).parent, tmp_path / "refllm", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "refllm"


def run_kernel(root: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", SILU_OF_MINUS_ONE], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def edit(file: Path, old: str, new: str) -> None:
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new))


def test_editing_a_function_in_another_kernel_file_recompiles_the_kernel(tmp_path):
    package = copy_of_refllm(tmp_path)
    assert run_kernel(tmp_path) == pytest.approx(-0.26894142, rel=1e-6)  # -1 * sigmoid(-1), compiled and cached
    edit(package / "kernels" / "exp.py", EXP_LINE, EXP_ZERO)
    assert run_kernel(tmp_path) == 0.0


def test_without_the_cache_key_the_kernel_goes_stale(tmp_path):
    """The failure the key prevents: Numba's own stamp misses the edit."""
    package = copy_of_refllm(tmp_path)
    edit(package / "kernels" / "__init__.py", "key_cache_to_every_kernel_source()  #", "#")
    cached = run_kernel(tmp_path)
    edit(package / "kernels" / "exp.py", EXP_LINE, EXP_ZERO)
    assert run_kernel(tmp_path) == cached != 0.0


def test_writers_racing_on_one_cache_keep_every_entry_its_own(tmp_path):
    """Numba gives a new signature the first data file free in the index it read: racing writers (a first run beside
    its background compile, two Ray workers) must not share one, or a signature loads another's machine code."""
    import refllm.kernels  # noqa: F401  (installs the lock)

    def entry(writer: int, signature: int) -> bytes:
        return f"{writer}-{signature}".encode() * 100

    def write(writer: int) -> None:
        cache = IndexDataCacheFile(str(tmp_path), "kernel", b"stamp")  # each writer reads the index anew
        for signature in range(20):
            cache.save((writer, signature), entry(writer, signature))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    cache = IndexDataCacheFile(str(tmp_path), "kernel", b"stamp")
    assert all(cache.load((w, s)) == entry(w, s) for w in range(8) for s in range(20))
