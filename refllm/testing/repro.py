"""Re-run one failing case: ``python -m refllm.testing.repro --backend module:factory 'CASE_JSON'``.

The case JSON is what a conformance failure prints on its ``repro:`` line.
Exits 0 if the property now holds, 1 with the explanation if it fails.
"""

from __future__ import annotations

import argparse
import sys

from refllm.testing.compare import ConformanceFailure
from refllm.testing.explain import Case
from refllm.testing.factories import load_factory
from refllm.testing.suite import PropertySkipped, run_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refllm.testing.repro", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="module:factory building the backend from a Checkpoint")
    parser.add_argument("case", help="the case JSON of a failure report")
    args = parser.parse_args(argv)
    case = Case.from_json(args.case)
    try:
        run_case(case, load_factory(args.backend), args.backend)
    except ConformanceFailure as failure:
        print(failure)
        return 1
    except PropertySkipped as skipped:
        print(f"property {case.property!r} does not apply: {skipped}")
        return 0
    print(f"property {case.property!r} holds for this case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
