"""The transformers backend passes the conformance kit against refllm on every architecture."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from refllm.testing import Checkpoint, check_logits, run_conformance
from refllm.testing.configs import ARCHITECTURES, optional_keys
from refllm.testing.strategies import full_configs

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


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_key_the_draws_leave_out_has_the_same_default_in_transformers(arch):
    """All of a family's optional keys left out at once: transformers' defaults and refllm's build the same model."""
    from refllm.testing.hf import transformers_backend

    @settings(max_examples=2, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(config=full_configs(arch))
    def defaults_agree(config):
        config = {key: value for key, value in config.items() if key not in optional_keys(arch)}
        checkpoint = Checkpoint.random(config, 0, std=0.5)
        check_logits(transformers_backend(checkpoint), checkpoint, tokens=list(range(3, 12)))

    defaults_agree()
