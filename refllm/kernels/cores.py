"""How many cores the kernels can count on now: those they may run on, less those other processes keep busy.

A parallel kernel splits its work evenly between its threads and ends when the
last thread ends. When another process keeps one of two cores busy (a browser,
a build, a busy loop), the thread on that core gets half of it or less, and
every kernel waits for it: decoding fell from about 90 to 15-24 tokens/s, below
one thread's speed on a quiet machine. So before each forward pass the fast op
set asks ``CoreWatch.threads()`` how many threads to use:

    others = (busy time of the allowed CPUs - this process's CPU time) / wall time

over the last quarter second or more, from /proc/stat and ``os.times()``, and
each core the others hold for a third of the time or more is left to them. (Two
threads sharing a core split it evenly, so a busy loop beside one of the
kernels' threads shows as about half a core; once the kernels leave it, a whole
one.) Steal time
(the hypervisor running someone else on our CPU) counts as busy. Once the other
work stops, the next look gives the cores back.

Where /proc/stat cannot be read (not Linux), the watch keeps every core. A
thread count the user chose (``NUMBA_NUM_THREADS``, or ``numba.set_num_threads``
before the forward pass) is kept as it is.
"""

from __future__ import annotations

import os
import time

LOOK_INTERVAL = 0.25  # seconds between looks at /proc/stat: ~25 scheduler ticks per CPU at 100 Hz
TAKEN_FROM = 1 / 3  # of a core busy with other work: the core is left to it
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (idle and iowait are free time)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return list(range(os.cpu_count() or 1))


def busy_ticks(cpus: list[int], stat_path: str = "/proc/stat") -> int | None:
    """Clock ticks the CPUs ``cpus`` have spent busy since boot, or None where /proc/stat is not there."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    try:
        with open(stat_path) as stat:
            lines = stat.readlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            total += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return total


def own_cpu_seconds() -> float:
    """CPU time of every thread of this process (user and system)."""
    times = os.times()
    return times.user + times.system


class CoreWatch:
    """Counts the cores other processes keep busy, and the threads left for the kernels."""

    def __init__(self, cpus: list[int] | None = None, stat_path: str = "/proc/stat"):
        self.cpus = allowed_cpus() if cpus is None else cpus
        self.stat_path = stat_path
        self.ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._sample()
        self.cores_taken = 0  # by other processes, at the last look

    def _sample(self) -> tuple[float, int | None, float]:
        return time.monotonic(), busy_ticks(self.cpus, self.stat_path), own_cpu_seconds()

    def look(self) -> int:
        """-> the whole cores other processes held since the last look (at most every LOOK_INTERVAL)."""
        now = self._sample()
        wall = now[0] - self._last[0]
        if wall < LOOK_INTERVAL or now[1] is None or self._last[1] is None:
            return self.cores_taken
        busy = (now[1] - self._last[1]) / self.ticks_per_second
        others = max(busy - (now[2] - self._last[2]), 0.0) / wall
        self._last = now
        self.cores_taken = min(int(others + 1 - TAKEN_FROM), len(self.cpus) - 1)
        return self.cores_taken

    def threads(self, most: int) -> int:
        """How many of ``most`` threads to run now: one per core the other processes leave free, at least one."""
        return max(1, min(most, len(self.cpus) - self.look()))
