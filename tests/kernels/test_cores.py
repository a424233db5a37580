"""The watch on the cores (refllm/kernels/cores.py) and the thread count each forward pass gets from it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pytest

from refllm.kernels import cores, threads
from refllm.kernels.cores import LOOK_INTERVAL, CoreWatch
from refllm.kernels.threads import computing, threads_now


class FakeMachine:
    """A /proc/stat file for two CPUs, a clock and this process's CPU time, each moved by hand."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch):
        self.path, self.now, self.own = path, 100.0, 0.0
        self.busy = [0, 0]  # ticks per CPU (100 per second)
        self.write()
        monkeypatch.setattr(cores.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(cores, "own_cpu_seconds", lambda: self.own)

    def write(self) -> None:
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]  # the total line: not a CPU the watch counts
        lines += [f"cpu{i} {busy // 2} 0 {busy - busy // 2} 5000 0 0 0 0 0 0" for i, busy in enumerate(self.busy)]
        self.path.write_text("\n".join(lines + ["intr 1 2 3", "ctxt 42"]) + "\n")

    def run(self, seconds: float, cpu0_busy: float, cpu1_busy: float, own: float) -> None:
        """``seconds`` pass with the CPUs busy for those fractions of them, ``own`` CPU seconds ours."""
        self.now += seconds
        self.busy = [self.busy[0] + round(100 * seconds * cpu0_busy), self.busy[1] + round(100 * seconds * cpu1_busy)]
        self.own += own
        self.write()


@pytest.fixture
def machine(tmp_path, monkeypatch):
    return FakeMachine(tmp_path / "stat", monkeypatch)


def watch_on(machine: FakeMachine) -> CoreWatch:
    watch = CoreWatch(cpus=[0, 1], stat_path=str(machine.path))
    watch.ticks_per_second = 100
    return watch


def test_a_core_that_another_process_keeps_busy_is_left_to_it(machine):
    watch = watch_on(machine)
    machine.run(1.0, 1.0, 0.5, own=1.0)  # ours: one core and half the other; the other half someone else's
    assert watch.threads(2) == 1 and watch.cores_taken == 1
    machine.run(1.0, 1.0, 1.0, own=1.0)  # left alone, the other process takes its whole core
    assert watch.threads(2) == 1
    machine.run(1.0, 1.0, 0.05, own=1.0)  # it stopped: a little background noise is no reason to leave a core
    assert watch.threads(2) == 2 and watch.cores_taken == 0


def test_under_a_third_of_a_core_busy_keeps_every_thread_and_one_thread_always_remains(machine):
    watch = watch_on(machine)
    machine.run(1.0, 1.0, 1.0, own=1.7)  # others: 0.3 of a core
    assert watch.threads(2) == 2
    machine.run(1.0, 1.0, 1.0, own=0.0)  # others hold both cores
    assert watch.threads(2) == 1
    assert watch.threads(1) == 1


def test_the_watch_looks_at_most_every_interval_and_keeps_its_answer_between(machine):
    watch = watch_on(machine)
    machine.run(LOOK_INTERVAL / 2, 1.0, 1.0, own=LOOK_INTERVAL / 2)
    assert watch.threads(2) == 2  # too soon to tell: nothing measured yet
    machine.run(LOOK_INTERVAL, 1.0, 1.0, own=LOOK_INTERVAL)
    assert watch.threads(2) == 1
    machine.run(LOOK_INTERVAL / 4, 0.0, 0.0, own=0.0)
    assert watch.threads(2) == 1


def test_without_proc_stat_every_core_is_used(tmp_path):
    watch = CoreWatch(cpus=[0, 1], stat_path=str(tmp_path / "missing"))
    time.sleep(LOOK_INTERVAL)
    assert watch.threads(2) == 2


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_a_real_busy_loop_is_seen_as_a_core_taken():
    watch = CoreWatch()
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        watch.look()  # start measuring once the loop runs
        time.sleep(2 * LOOK_INTERVAL)
        taken = watch.look()
    finally:
        loop.kill()
        loop.wait()
    assert taken >= 1


class OneCoreFree:
    def threads(self, most: int) -> int:
        return 1


def test_a_forward_pass_runs_on_the_threads_the_watch_leaves_and_the_count_is_restored(monkeypatch):
    monkeypatch.setattr(threads, "_watch", OneCoreFree())
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    before = numba.get_num_threads()
    with computing():
        inside = numba.get_num_threads()
    assert inside == 1 and numba.get_num_threads() == before


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two cores to choose between")
def test_a_thread_count_the_user_chose_wins_over_the_watch(monkeypatch):
    monkeypatch.setattr(threads, "_watch", OneCoreFree())
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    assert threads_now() == 1  # the default count: the watch decides
    monkeypatch.setenv("NUMBA_NUM_THREADS", str(numba.config.NUMBA_NUM_THREADS))
    assert threads_now() == numba.config.NUMBA_NUM_THREADS  # chosen in the environment: kept


def test_computing_restores_blas_threads():
    from threadpoolctl import threadpool_info

    def blas() -> list[int]:
        return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]

    before = blas()
    with computing():
        assert set(blas()) == {1}
        np.ones((4, 4)) @ np.ones((4, 4))
    assert blas() == before
