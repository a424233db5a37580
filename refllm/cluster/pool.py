"""A pool of Ray actors that run a job's shards, each actor holding the job's model, loaded once.

The driver keeps two shards in flight per actor, so an actor starts its next
shard while the driver stores the last. An actor that dies (killed, out of
memory, its node lost) is restarted by Ray, which runs its unfinished shards
again: up to ``RETRIES`` times. A shard whose data cannot run (a prompt longer
than the context) comes back as an error, once, and is reported with the others
when the job ends. Progress on stderr counts shards done and tokens/s.

A job is any picklable object with ``load()`` -> the state an actor keeps (the
model), and ``run(state, shard)`` -> (tensors, info, tokens); an
``InvalidInputError`` from ``run`` is an error in the shard's data.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from refllm import progress
from refllm.cluster import LOCAL, ClusterUnreachableError, check_reachable, import_ray
from refllm.cluster.shards import Shard, ShardResult, ShardStore
from refllm.errors import InvalidInputError

RETRIES = 3  # restarts of a dead actor, and runs of a shard beyond its first


class ShardsFailedError(InvalidInputError):
    """Some shards cannot run on their data; the others finished and are kept."""


class WorkerLostError(ConnectionError):
    """An actor could not start, or died more often than Ray restarts it."""


@dataclass
class JobRun:
    results: dict[int, ShardResult]  # by shard index: every shard, resumed or computed
    computed: int  # shards run by this call (the others were resumed from the store)
    workers: int
    tokens: int  # through the model in this call
    seconds: float


class ShardWorker:
    """A Ray actor: loads the job's model once, then runs shard after shard."""

    def __init__(self, job):
        import numba
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        numba.set_num_threads(max(1, min(int(cpus), numba.config.NUMBA_NUM_THREADS)))
        self.job, self.state = job, job.load()
        self.worker = f"{ray.util.get_node_ip_address()}:{os.getpid()}"

    def run(self, shard: Shard) -> ShardResult:
        try:
            tensors, info, tokens = self.job.run(self.state, shard)
        except InvalidInputError as error:
            return ShardResult(shard.index, worker=self.worker, pid=os.getpid(), error=str(error))
        return ShardResult(shard.index, tensors, info, tokens, self.worker, os.getpid())


@contextmanager
def connected(address: str) -> Iterator[object]:
    """Ray, joined to ``address`` ("auto", host:port, ray://...) or to a new local cluster (``LOCAL``).

    A Ray already initialized in this process is used as it is, and left running.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    check_reachable(address)
    try:
        if address == LOCAL:
            ray.init(**quiet)
        else:
            ray.init(address=address, **quiet)
    except ConnectionError as error:  # "auto" with no cluster on this machine
        raise ClusterUnreachableError(f"cannot join a Ray cluster at {address}: {error}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def run_shards(
    job,
    shards: list[Shard],
    store: ShardStore | None,
    address: str = LOCAL,
    workers: int | None = None,
    description: str = "shards",
    on_result: Callable[[ShardResult], None] | None = None,
) -> JobRun:
    """Run every shard not already in ``store`` on a pool of ``workers`` actors (default: one per CPU).

    ``on_result`` is called with each shard computed here, after it is stored.
    """
    results = store.resume(shards) if store is not None else {}
    by_index = {shard.index: shard for shard in shards}
    todo = deque(shard for shard in shards if shard.index not in results)
    if results:
        print(f"resuming: {len(results)} of {len(shards)} shards are already in {store.directory}", file=sys.stderr)
    with connected(address) as ray:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if workers is not None and workers > cpus:  # an actor waits for its CPU, and its shards with it
            raise InvalidInputError(f"--workers {workers} is more than the {cpus} CPUs of the cluster")
        count = min(workers or cpus, len(todo))
        options = dict(num_cpus=1, max_restarts=RETRIES, max_task_retries=RETRIES)
        actors = [ray.remote(**options)(ShardWorker).remote(job) for _ in range(count)]
        computed, failures, tokens, start = 0, [], 0, time.perf_counter()
        pending = {}  # a shard's future -> the actor running it

        def submit(actor) -> None:
            if todo:
                pending[actor.run.remote(todo.popleft())] = actor

        try:
            with progress.task(description, total=len(shards), unit="shard") as bar:
                bar.update(len(results))
                for actor in actors * 2:  # two in flight per actor
                    submit(actor)
                while pending:
                    (ready,), _ = ray.wait(list(pending), num_returns=1)
                    actor = pending.pop(ready)
                    result = _result(ray, ready)
                    computed += 1
                    if result.error is not None:
                        failures.append(result)
                    else:
                        if store is not None:
                            store.save(result, by_index[result.index])
                        results[result.index], tokens = result, tokens + result.tokens
                    bar.update()
                    bar.set_postfix_str(f"{tokens / (time.perf_counter() - start):.1f} tokens/s")
                    if on_result is not None:
                        on_result(result)
                    submit(actor)
        finally:
            for actor in actors:
                ray.kill(actor)
    seconds = time.perf_counter() - start
    print(
        f"{computed} shards on {count} workers: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.1f} tokens/s",
        file=sys.stderr,
    )
    if failures:
        for failure in sorted(failures, key=lambda r: r.index):
            print(f"shard {failure.index} failed: {failure.error}", file=sys.stderr)
        kept = f"; the {len(results)} finished are kept in {store.directory}" if store is not None else ""
        raise ShardsFailedError(f"{len(failures)} of {len(shards)} shards cannot run on their data (above){kept}")
    return JobRun(results, computed, count, tokens, seconds)


def _result(ray, ready) -> ShardResult:
    try:
        return ray.get(ready)
    except ray.exceptions.RayActorError as error:
        raise WorkerLostError(f"a worker could not start or died {RETRIES + 1} times: {error}") from None
