"""Hostile model files are loaded or refused, never a crash, a memory blow-up or a hang (tests/helpers/fuzz_loaders.py).

A few dozen cases of each kind run here; ``python benchmarks/fuzz_loaders.py`` runs
thousands and reports them (docs/robustness.md).
"""

from __future__ import annotations

import pytest

from tests.helpers.fuzz_loaders import Seeds, Stats, make_seeds, run_cases

EXAMPLES = 30


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Seeds:
    return make_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.mark.parametrize(
    "kind",
    [
        "GGUF header bytes",
        "GGUF metadata field",
        "safetensors header field",
        "safetensors header bytes",
        "config.json field",
        "tokenizer_config.json field",
        "tokenizer.json bytes",
        "family config.json field",
    ],
)
def test_a_hostile_file_loads_or_is_refused_within_the_caps(seeds, kind):
    stats = Stats()
    run_cases(kind, seeds, stats, EXAMPLES)
    assert stats.cases >= EXAMPLES
    assert stats.worst_peak_bytes < 512 << 20, stats.worst_case
