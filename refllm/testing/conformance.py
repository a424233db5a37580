"""The conformance suite, one test per property; collected by ``refllm.testing.plugin``."""

from __future__ import annotations

import pytest

from refllm.testing.compare import ConformanceFailure
from refllm.testing.properties import PROPERTIES
from refllm.testing.suite import PropertySkipped, run_properties


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_property(name: str, refllm_conformance: dict) -> None:
    options = dict(refllm_conformance)
    factory = options.pop("factory")
    skipped = failed = None
    try:
        run_properties([name], factory, **options)
    except PropertySkipped as reason:
        skipped = str(reason)
    except ConformanceFailure as failure:
        failed = str(failure)
    # Reported outside the except blocks, so the report is the explanation alone.
    if skipped is not None:
        pytest.skip(skipped)
    if failed is not None:
        pytest.fail(failed, pytrace=False)
