"""A first run answers at once: on the spec ops while the kernels compile in another process.

The Numba kernels compile on their first use, once (Numba's on-disk cache keeps
them): about a minute on a small machine. A run whose kernels are not in the
cache yet does not wait for them. It answers on the spec ops (``refllm/nn``,
plain NumPy: nothing to compile, a few times slower), starts a process that
compiles exactly the kernels this run needs into the cache, and moves over to
them, between two forward passes, as soon as that process is done:

    the Numba kernels are not compiled yet: answering on the spec ops (NumPy, slower) while they compile ...

A kernel found in the cache loads in a fraction of a second, so a later run
starts on the kernels at once (``kernels_cached`` tries them with compilation
forbidden). One compiling process at a time, whichever run started it: a file
lock says one is under way. Where the spec ops' float32 copy of the weights
would not fit in memory, or with REFLLM_COMPILE=foreground in the environment,
the run compiles in the foreground as before, with its notice
(``refllm.commands.common.warm_llm`` decides).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
from numba.core import event

from refllm import catalog
from refllm.kv import CacheConfig
from refllm.memory import available_memory
from refllm.models.ops import SPEC_OPS
from refllm.models.weights import weight_leaves
from refllm.quant.linear import QuantizedTensor
from refllm.runtime.llm import LLM

NOTICE = (
    "the Numba kernels are not compiled yet: answering on the spec ops (NumPy, slower) while they compile in the"
    " background; answers move to them when they are ready (`refllm warmup` compiles them ahead)"
)
SWITCHED = "the Numba kernels are compiled: answering on them from here"
LOG_NAME = "kernel-compile.log"  # in $REFLLM_HOME: what the background process printed
BACKGROUND_MODULE = "refllm.commands.background_compile"  # what the background process runs
# Where this refllm is imported from: the background process starts there, so that ``-m`` (which puts the
# current folder first on the path) finds this very package, not another in the folder the run was started from.
PACKAGE_HOME = Path(__file__).resolve().parents[2]


class _CompileStarted(Exception):
    """Raised by ``_Forbid`` as Numba starts a compilation: the kernel was not in the cache."""


class _Forbid(event.Listener):
    """Numba's listeners are global: this one trips only on compilations of the thread that installed it,
    so a watcher thread never fails another thread's compilation."""

    def __init__(self):
        self.tripped = False
        self.thread = threading.get_ident()

    def on_start(self, ev: event.Event) -> None:
        if threading.get_ident() != self.thread:
            return
        self.tripped = True
        raise _CompileStarted()

    def on_end(self, ev: event.Event) -> None:
        pass


def kernels_cached(llm: LLM) -> bool:
    """Warm ``llm`` up with compilation forbidden: True if every kernel it runs loaded from Numba's cache
    (the LLM is then warm); False at the first that would compile (the LLM is left empty)."""
    forbid = _Forbid()
    try:
        with event.install_listener("numba:compile", forbid):
            llm.warm_up()
        return True
    except Exception:  # Numba may wrap the listener's exception in its own errors
        if not forbid.tripped:
            raise
        llm.reset()
        return False


def compile_lock_path() -> Path:
    """The lock a compiling process holds: one per kernel cache (the package's folder, or NUMBA_CACHE_DIR)."""
    kernels = Path(__file__).resolve().parents[1] / "kernels"
    key = f"{kernels}|{os.environ.get('NUMBA_CACHE_DIR', '')}|{sys.version_info[:2]}"
    return Path(tempfile.gettempdir()) / f"refllm-compile-{hashlib.sha256(key.encode()).hexdigest()[:16]}.lock"


def start_compiling(name: str, quantized: bool) -> None:
    """Start the process that compiles ``name``'s kernels into the cache, unless one is compiling already;
    it holds the lock until it exits (its output goes to $REFLLM_HOME/kernel-compile.log)."""
    lock = os.open(compile_lock_path(), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another run's process is compiling; the watcher waits for it
        log_path = catalog.refllm_home() / LOG_NAME
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", BACKGROUND_MODULE, name, "quantized" if quantized else "dequantized"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(lock,), start_new_session=True,
                cwd=PACKAGE_HOME,
            )  # fmt: skip
    finally:
        os.close(lock)  # the child's inherited descriptor keeps the lock until it exits


def wait_for_compiling() -> None:
    """Block until no process holds the compile lock."""
    lock = os.open(compile_lock_path(), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
    finally:
        os.close(lock)


def spec_twin(model: Any) -> Any:
    """The model on the spec ops, its quantized matrices dequantized (the arrays it already has are shared)."""
    return model.with_ops(SPEC_OPS, _dequantized(model.weights))  # the same config, tokenizer (and tower)


def spec_twin_fits(model: Any) -> bool:
    """Whether the spec twin's dequantized copies fit in the memory available now."""
    extra = sum(4 * int(np.prod(w.shape)) for w in weight_leaves(model.weights) if isinstance(w, QuantizedTensor))
    available = available_memory()
    return available is None or extra < available


class SpecUntilKernels:
    """A model that answers with the spec ops until ``ready`` hands it the kernels' model, then with those.

    It moves over at the start of a forward pass, so a sequence's keys and values written by one are read
    by the other (both hold float32 keys in the same arena layout). Arenas it creates run in NumPy until
    then. Everything else is the current model's (``current``).
    """

    def __init__(self, spec: Any, fast: Any, on_switch=None):
        self.current, self._fast, self._on_switch = spec, fast, on_switch
        self._ready = self.switched = self.announced = False
        self._arenas: list = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)

    def ready(self) -> None:
        """The kernels are in the cache and loaded: the next forward pass runs them."""
        self._ready = True

    def create_kv_cache(self, config: CacheConfig | None = None):
        cache = self.current.create_kv_cache(config)
        if self.current is not self._fast and getattr(cache, "use_kernels", False):
            cache.use_kernels = False
            self._arenas.append(cache)
        return cache

    def forward_step(self, x: np.ndarray, cache, seq_ids) -> np.ndarray:
        if self._ready and self.current is not self._fast:
            for arena in self._arenas:
                arena.use_kernels = True
            self.current, self._arenas, self.switched = self._fast, [], True
            if self._on_switch is not None:
                self._on_switch()
        return self.current.forward_step(x, cache, seq_ids)


def watch(model: SpecUntilKernels, fast: Any, say) -> threading.Thread:
    """A thread that waits for the compiling process, tries the kernels from the cache and hands them over."""

    def run() -> None:
        wait_for_compiling()
        probe = LLM(fast, CacheConfig(num_blocks=4, prefix_caching=False))
        if kernels_cached(probe):
            model.ready()
        else:
            say(f"the kernels did not compile (see {catalog.refllm_home() / LOG_NAME}); staying on the spec ops")

    thread = threading.Thread(target=run, name="refllm-kernels", daemon=True)
    thread.start()
    return thread


def _dequantized(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A copy of a weights tree with every QuantizedTensor dequantized (a tied one once); arrays shared."""
    memo = {} if memo is None else memo
    if isinstance(value, QuantizedTensor):
        if id(value) not in memo:
            memo[id(value)] = value.dequantize()
        return memo[id(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _dequantized(getattr(value, f.name), memo) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, (list, tuple)):
        return type(value)(_dequantized(item, memo) for item in value)
    return value
