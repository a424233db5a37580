"""The LM head (refllm.nn.logits.output_logits): the projection, then the scale, then the soft-cap."""

from __future__ import annotations

import numpy as np

from refllm.nn.logits import output_logits


def test_logits_are_scaled_then_soft_capped():
    rng = np.random.default_rng(0)
    hidden, lm_head = rng.normal(size=(2, 5)), rng.normal(size=(7, 5))
    raw = hidden @ lm_head.T
    np.testing.assert_array_equal(output_logits(hidden, lm_head), raw)
    np.testing.assert_array_equal(output_logits(hidden, lm_head, scale=0.125), raw * 0.125)
    capped = output_logits(hidden, lm_head, scale=4.0, softcap=3.0)
    np.testing.assert_allclose(capped, 3.0 * np.tanh(raw * 4.0 / 3.0), rtol=1e-15)
    assert np.abs(capped).max() < 3.0
