"""Progress on stderr for the long steps of the command line (loading, scoring, benchmarking).

On a terminal a step shows a live bar; either way it ends with one line saying
how long it took, so logs of non-interactive runs show it too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

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
