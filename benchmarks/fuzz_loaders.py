"""Many more hostile model files than CI runs: every kind of tests/helpers/fuzz_loaders.py, N cases each.

Each case loads a mutated tiny model under the suite's caps (512 MB of address space
beyond the process, 10 s); a crash, a MemoryError or a hang stops the run with the case
that caused it (shrunk by hypothesis). Reports, per kind and in all, the cases, the
seconds, how they ended and the largest peak of resident memory a case added.

    python benchmarks/fuzz_loaders.py [--cases 1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.helpers

from tests.helpers.fuzz_loaders import Stats, cases, make_seeds, run_cases  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases of each kind (default 1000)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as directory:
        seeds = make_seeds(Path(directory))
        total, started = Stats(), time.monotonic()
        print(f"{'kind':30} {'cases':>6} {'seconds':>8} {'worst peak':>11}  outcomes")
        for kind in cases(seeds):
            stats, start = Stats(), time.monotonic()
            run_cases(kind, seeds, stats, args.cases)
            seconds = time.monotonic() - start
            outcomes = ", ".join(f"{name} {count}" for name, count in sorted(stats.outcomes.items()))
            print(f"{kind:30} {stats.cases:6} {seconds:8.1f} {stats.worst_peak_bytes / 2**20:8.1f} MB  {outcomes}")
            total.cases += stats.cases
            if stats.worst_peak_bytes > total.worst_peak_bytes:
                total.worst_peak_bytes, total.worst_case = stats.worst_peak_bytes, stats.worst_case
        print(f"{'all':30} {total.cases:6} {time.monotonic() - started:8.1f} {total.worst_peak_bytes / 2**20:8.1f} MB")
        print(f"worst case: {total.worst_case}")


if __name__ == "__main__":
    main()
