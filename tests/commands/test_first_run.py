"""A first run answers on the spec ops while the kernels compile in another process (refllm/commands/warm_start.py).

In-process: the compile-forbidding probe, and the model that moves from the
spec ops to the kernels between two forward passes of the same sequences. As a
user meets it (``slow``): a fresh kernel cache, a first ``refllm generate`` that
says what it does and answers without compiling, the next one on the kernels,
and after ``refllm warmup`` no flag's run compiling anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest
from numba.core import event

import refllm
from refllm.commands import warm_start
from refllm.kv import CacheConfig
from refllm.progress import COMPILE_NOTICE
from refllm.runtime.llm import LLM
from tests.helpers.model_directory import write_tiny_model
from tests.helpers.paths import ROOT


@pytest.fixture(scope="module")
def quantized_path(tmp_path_factory):
    from tests.helpers.gguf_convert import convert

    return convert("llama", tmp_path_factory.mktemp("first-run") / "llama.gguf", "Q8_0")


def test_the_probe_loads_cached_kernels_and_refuses_to_compile(quantized_path, monkeypatch):
    model = refllm.load_model(quantized_path, quantized=True)
    warm = LLM(model, CacheConfig(num_blocks=8))
    warm.warm_up()  # compiled (or loaded) here, so in Numba's cache from now on
    assert warm_start.kernels_cached(LLM(model, CacheConfig(num_blocks=8)))

    @numba.njit(cache=False)
    def never_compiled(x):
        return x + 1

    cold = LLM(model, CacheConfig(num_blocks=8))
    monkeypatch.setattr(cold, "warm_up", lambda: never_compiled(1))
    assert not warm_start.kernels_cached(cold)
    assert never_compiled.signatures == []  # stopped before it compiled
    assert cold.cache_ids() == []


def test_the_probe_forbids_compiling_in_its_own_thread_only():
    """A watcher thread probing the cache must not fail a compilation another thread runs meanwhile."""
    inside, release = threading.Event(), threading.Event()

    def probe() -> None:
        with event.install_listener("numba:compile", warm_start._Forbid()):
            inside.set()
            release.wait(60)

    watcher = threading.Thread(target=probe)
    watcher.start()
    try:
        assert inside.wait(60)
        assert numba.njit(lambda x: x + 1)(1) == 2  # compiles here, beside the probe
    finally:
        release.set()
        watcher.join()


def test_answers_move_from_the_spec_ops_to_the_kernels_between_forward_passes(quantized_path):
    fast = refllm.load_model(quantized_path, quantized=True)
    switched = []
    model = warm_start.SpecUntilKernels(warm_start.spec_twin(fast), fast, lambda: switched.append(True))
    spec = refllm.load_model(quantized_path, reference=True)
    llm = LLM(model, CacheConfig(num_blocks=8))
    assert llm.arena.use_kernels is False and model.ops.name == "spec"
    prompt = [1, 5, 9, 3, 7]
    first = llm.prefill("a", prompt)
    np.testing.assert_array_equal(first, spec.logits(spec.prefill_hidden(np.array([prompt]), spec.create_kv_cache(
        CacheConfig(kind="contiguous")), range(5))[0, -1]))  # the spec ops' answer
    model.ready()
    after = llm.decode("a", 2, 5)  # on the kernels, reading the keys the spec ops wrote
    assert switched == [True] and model.switched and model.current is fast and llm.arena.use_kernels
    reference = LLM(fast, CacheConfig(num_blocks=8))
    reference.prefill("a", prompt)
    np.testing.assert_allclose(after, reference.decode("a", 2, 5), rtol=1e-4, atol=1e-4)


def refllm_run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refllm", *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900
    )


@pytest.mark.slow
def test_a_fresh_kernel_cache_answers_at_once_then_runs_on_the_kernels(tmp_path):
    tiny = str(write_tiny_model(tmp_path / "tiny"))
    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path / "kernels"), "REFLLM_HOME": str(tmp_path / "home")}
    env.pop("REFLLM_COMPILE", None)
    first = refllm_run("generate", "hello", "-m", tiny, "-n", "4", env=env)
    assert first.returncode == 0 and first.stdout.startswith("hello"), first.stderr
    assert warm_start.NOTICE in first.stderr and COMPILE_NOTICE not in first.stderr  # nothing compiled here
    waited = subprocess.run(
        [sys.executable, "-c", "from refllm.commands.warm_start import wait_for_compiling; wait_for_compiling()"],
        cwd=ROOT, env=env, timeout=900,
    )  # fmt: skip
    assert waited.returncode == 0
    assert "compiled" in (tmp_path / "home" / warm_start.LOG_NAME).read_text()
    later = refllm_run("generate", "hello", "-m", tiny, "-n", "4", env=env)
    assert later.returncode == 0 and later.stdout == first.stdout  # greedy: the same tokens
    assert warm_start.NOTICE not in later.stderr and COMPILE_NOTICE not in later.stderr
    warmed = refllm_run("warmup", "-m", tiny, env=env)
    assert warmed.returncode == 0 and "--spec-ops and --dtype float64 need none" in warmed.stdout
    for flags in (["--dequantize"], ["--spec-ops"], ["--dtype", "float64"]):
        run = refllm_run("generate", "hello", "-m", tiny, "-n", "4", *flags, env=env)
        assert run.returncode == 0 and warm_start.NOTICE not in run.stderr and COMPILE_NOTICE not in run.stderr
    foreground = refllm_run("generate", "hello", "-m", tiny, "-n", "4", env=env | {"REFLLM_COMPILE": "foreground"})
    assert foreground.returncode == 0 and foreground.stdout == first.stdout


def test_the_background_process_imports_this_very_package():
    """It runs ``python -m`` from where this refllm is imported, so another checkout in the folder a run
    started from (the current folder comes first on ``-m``'s path) cannot stand in for it."""
    assert (warm_start.PACKAGE_HOME / "refllm" / "__init__.py").samefile(refllm.__file__)
