"""How many bytes per second this machine's cores read from memory: a STREAM-like read benchmark.

    python benchmarks/bandwidth.py --threads 2

Sums a float32 array of ``--megabytes`` (far larger than any cache) with ``--threads`` threads,
each summing a contiguous share in vector lanes, and reports the bytes per second of the best
and the median sweep. A sum reads each byte once and does one addition per element, so memory,
not arithmetic, bounds it: the same bound a decode step's weight stream meets (STREAM's own
kernels copy or scale, and so also write; a decode only reads). ``bench_laptop.py`` measures it
in the same run as the engines, so that each engine's decode can be read against it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True)
def _sum_shares(shares: np.ndarray) -> float:
    """shares [P, n] float32 -> the sum of every element, one share per parallel task."""
    total = 0.0
    for share in prange(shares.shape[0]):
        lanes = np.float32(0.0)
        row = shares[share]
        for i in range(row.shape[0]):
            lanes += row[i]
        total += lanes
    return total


def read_bandwidth(megabytes: int = 1024, sweeps: int = 9) -> dict[str, float]:
    """-> {"best": GB/s, "median": GB/s} over ``sweeps`` sweeps, on Numba's threads."""
    import numba

    tasks = 8 * numba.get_num_threads()  # several shares per thread: a thread that starts late catches up
    shares = np.ones((tasks, megabytes * 2**20 // 4 // tasks), np.float32)  # written: every page is resident
    _sum_shares(shares)
    rates = []
    for _ in range(sweeps):
        start = time.perf_counter()
        _sum_shares(shares)
        rates.append(shares.nbytes / (time.perf_counter() - start) / 1e9)
    return {"best": max(rates), "median": float(np.median(rates))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=1024)
    parser.add_argument("--sweeps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="Numba's threads (default: every core)")
    args = parser.parse_args()
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    print(json.dumps(read_bandwidth(args.megabytes, args.sweeps)))


if __name__ == "__main__":
    main()
