"""The kit catches every mutant of the gallery (tests/helpers/mutants.py) within a bounded number of cases."""

from __future__ import annotations

from refllm.testing import first_failure
from tests.helpers.mutants import EXPECTED_PROPERTY, MUTANTS

MAX_CASES_PER_PROPERTY = 60  # thirteen architectures to draw from: dynamic NTK's mutant took 41 to 60


def test_every_mutant_is_caught():
    lines, missed = [], []
    for mutant in MUTANTS:
        failure, cases = first_failure(mutant, max_examples=MAX_CASES_PER_PROPERTY, threads=1)
        expected = EXPECTED_PROPERTY.get(mutant.__name__)
        if failure is not None and expected and failure.property != expected:
            missed.append(f"{mutant.__name__} (reported by {failure.property}, not {expected})")
            lines.append(f"  {mutant.__name__:28} BLAMED on {failure.property}, not {expected}")
        elif failure is None:
            missed.append(mutant.__name__)
            lines.append(f"  {mutant.__name__:28} MISSED after {cases} cases")
        else:
            lines.append(f"  {mutant.__name__:28} caught by {failure.property:16} after {cases:3} cases")
    caught = len(MUTANTS) - len(missed)
    print("\n".join(lines) + f"\n{caught}/{len(MUTANTS)} mutants caught")  # shown with -s, or on a failure
    assert not missed, f"{caught}/{len(MUTANTS)} mutants caught; missed: {', '.join(missed)}"
