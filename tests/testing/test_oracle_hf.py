"""The transformers backend passes the conformance kit against refllm on every architecture."""

from __future__ import annotations

import pytest

from refllm.testing import run_conformance
from refllm.testing.configs import ARCHITECTURES

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_transformers_conforms_to_refllm(arch):
    from refllm.testing.hf import transformers_backend

    results = run_conformance(transformers_backend, max_examples=4, architectures=(arch,), seed=0, threads=1)
    statuses = {r.name: r.status for r in results}
    assert statuses.pop("memory") == "skipped"  # transformers' caches have no capacity to bound
    assert statuses.pop("own_greedy") == "skipped"  # the adapter offers no sampler of transformers' own
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n\n".join(r.detail for r in failed)
    assert set(statuses.values()) == {"passed"}
