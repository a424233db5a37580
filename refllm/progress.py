"""Progress on stderr for the long steps of the command line (loading, compiling, reading a prompt,
scoring, benchmarking).

On a terminal a step shows a live bar; either way it ends with one line saying
how long it took, so logs of non-interactive runs show it too. A prompt shows
its bar only if reading it takes longer than a second (``PromptProgress``). The Numba
kernels compile on their first use only (``cache=True`` keeps them on disk),
and ``compiling_kernels`` says so while it happens, so a first run never waits
in silence.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from numba.core import event
from tqdm import tqdm


@contextmanager
def task(description: str, total: int | None = None, unit: str = "it") -> Iterator[tqdm]:
    """A long step: yields a bar to ``update``; prints "description ... done in 1.2 s" when it ends."""
    live = sys.stderr.isatty()
    if not live:
        print(f"{description} ...", end=" ", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False, disable=not live) as bar:
        try:
            yield bar
        except BaseException:
            if not live:
                print("failed", file=sys.stderr)
            raise
    seconds = time.perf_counter() - start
    print(f"{description + ' ... ' if live else ''}done in {seconds:.1f} s", file=sys.stderr)


class _CompileCounter(event.Listener):
    """Counts Numba compilations; the first one starts a live count on stderr (a cache hit fires no event)."""

    def __init__(self, live: bool):
        self.live, self.depth, self.compiled = live, 0, 0
        self.start: float | None = None
        self.bar: tqdm | None = None
        self.ticker: threading.Thread | None = None
        self.done = threading.Event()

    def on_start(self, ev: event.Event) -> None:
        self.depth += 1
        if self.start is not None:
            return
        self.start = time.perf_counter()
        print(COMPILE_NOTICE, file=sys.stderr, end="\n" if self.live else " ... ", flush=True)
        if self.live:
            counting = "{desc}: {n} kernels so far [{elapsed}]"
            self.bar = tqdm(desc="compiling", bar_format=counting, file=sys.stderr, leave=False)
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()

    def on_end(self, ev: event.Event) -> None:
        self.depth -= 1
        if self.depth == 0:  # a kernel and the kernels it calls count once
            self.compiled += 1
            if self.bar is not None:
                self.bar.update()

    def _tick(self) -> None:
        """Redraw the elapsed time while one long compilation runs without updates."""
        while not self.done.wait(0.5):
            self.bar.refresh()

    def finish(self) -> None:
        if self.start is None:
            return
        self.done.set()
        if self.bar is not None:
            self.ticker.join()
            self.bar.close()  # the summary line below takes its place
        seconds = time.perf_counter() - self.start
        print(
            f"compiled {self.compiled} kernels in {seconds:.1f} s; later runs load them from the cache", file=sys.stderr
        )


COMPILE_NOTICE = "compiling the Numba kernels: once, on first use (`refllm warmup` does it ahead of time)"


@contextmanager
def compiling_kernels() -> Iterator[None]:
    """Whatever Numba compiles inside is announced on stderr with a live count; nothing shows when all is cached."""
    counter = _CompileCounter(live=sys.stderr.isatty())
    with event.install_listener("numba:compile", counter):
        try:
            yield
        finally:
            counter.finish()


class PromptProgress:
    """The prefill's bar: called with (tokens computed, tokens to compute) before and after each chunk
    (``LLM.prefill_progress``). A prompt read within ``delay`` seconds shows nothing, nor does one of
    ``chunk`` tokens or fewer (its bar could not move); a longer one shows ``task``'s bar (tokens done /
    total, tokens/s) from then on, or off a terminal one line and its end."""

    def __init__(self, chunk: int = 0, description: str = "reading the prompt", delay: float = 1.0):
        self.description, self.delay, self.chunk = description, delay, chunk
        self._step = None  # the running ``task`` and its bar, once shown
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._done = self._total = 0

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total
            if done == 0 and total > self.chunk:
                self._timer = threading.Timer(self.delay, self._show)
                self._timer.daemon = True
                self._timer.start()
            elif self._step is not None:
                self._step[1].update(done - self._step[1].n)
            if done == total:
                self._finish()

    def _show(self) -> None:
        with self._lock:
            if self._done == self._total or self._step is not None:
                return
            context = task(f"{self.description} ({self._total:,} tokens)", total=self._total, unit="token")
            bar = context.__enter__()
            bar.update(self._done)
            bar.refresh()
            self._step = (context, bar)

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._step is not None:
            self._step[0].__exit__(None, None, None)
        self._step = self._timer = None

    def close(self) -> None:
        """End a bar left open (a prefill that failed half-way)."""
        with self._lock:
            self._finish()
