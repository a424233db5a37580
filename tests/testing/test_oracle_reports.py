"""Failure reports name the property and the call that exposed the bug, and the layer where drift starts."""

from __future__ import annotations

import numpy as np
import pytest

from refllm.testing import Checkpoint, ConformanceFailure, check_errors, get_profile, refllm_contiguous
from refllm.testing.backends import Backend
from refllm.testing.configs import tiny_config_json
from refllm.testing.explain import first_divergent_layer
from tests.helpers import mutants


def test_a_wrongly_accepted_decode_is_reported_as_that_decode_not_as_the_adapters_bookkeeping():
    checkpoint = Checkpoint.random(tiny_config_json("llama"), 0)
    with pytest.raises(ConformanceFailure) as failure:
        check_errors(mutants.accepts_decode_on_unknown_id(checkpoint), checkpoint, tokens=[0, 5, 9], token=4)
    assert "decode(7, ...) on a cache id never prefilled was accepted" in str(failure.value)


class _DriftAtLayer(Backend):
    """The reference's hidden states, with a drift of ``size`` x each position's spread from layer ``layer`` on."""

    name = "drift"

    def __init__(self, reference, layer: int, size: float):
        self.reference, self.layer, self.size = reference, layer, size

    def layer_states(self, tokens):
        states = self.reference.layer_states(tokens).astype(np.float64)
        states[self.layer :] += self.size * states[self.layer :].std(-1, keepdims=True)
        states[:, :, 0] *= 1000  # one outlier dim: dividing by the largest value would hide the drift
        return states


def test_small_drift_is_placed_at_its_layer_even_beside_a_large_outlier():
    checkpoint = Checkpoint.random(tiny_config_json("qwen3"), 0)
    reference, tokens = refllm_contiguous(checkpoint), [0, 5, 9, 17]
    outlier_only = _DriftAtLayer(reference, 0, 0.0)
    drifting = _DriftAtLayer(reference, 2, 1e-2)

    class _SameOutlier(Backend):  # the reference as the backend sees it: with the outlier, without the drift
        def layer_states(self, tokens):
            return outlier_only.layer_states(tokens)

    report = first_divergent_layer(drifting, _SameOutlier(), tokens, get_profile("float32"))
    assert "first diverge at the output of layer 1" in report
    assert "every layer matches" in first_divergent_layer(outlier_only, _SameOutlier(), tokens, get_profile("float32"))
