"""Correct lower-precision engines pass their profiles on the kit's draws, long horizons included.

The 1000-case run per engine is ``python benchmarks/calibrate_profiles.py --check 1000 --seed 7``
(docs/oracle.md records it); here a CI-sized share of it.
"""

from __future__ import annotations

import numpy as np
import pytest

from refllm.testing import Checkpoint, run_properties
from refllm.testing.configs import tiny_config_json
from refllm.testing.emulated import EMULATED, bfloat16_round, float16_round, q8_0_round
from refllm.testing.factories import refllm_contiguous, refllm_float64
from refllm.testing.properties import PROPERTIES

LONG_HORIZON_CASES = 150
OTHER_CASES = 100


@pytest.mark.parametrize("name", list(EMULATED))
def test_emulated_engine_passes_its_profile_at_long_horizons(name):
    factory, profile = EMULATED[name]
    assert run_properties(["long_horizon"], factory, profile, LONG_HORIZON_CASES, shrink=False, seed=3, threads=1) == (
        LONG_HORIZON_CASES
    )


@pytest.mark.parametrize("name", list(EMULATED))
def test_emulated_engine_passes_the_other_properties(name):
    factory, profile = EMULATED[name]
    others = [p for p in PROPERTIES if p != "long_horizon"]
    assert run_properties(others, factory, profile, OTHER_CASES, shrink=False, seed=4, threads=1) == OTHER_CASES


@pytest.mark.parametrize("name", list(EMULATED))
def test_emulated_engine_rounds(name):
    """Each emulation's rounding reaches the logits, ten times float32's error at least: the profiles are
    held to lower-precision engines, not to the float32 spec under another name."""
    checkpoint = Checkpoint.random(tiny_config_json("llama"), seed=0)
    tokens = list(range(1, 20))
    truth = refllm_float64(checkpoint).all_logits(tokens)
    emulated_error = np.abs(EMULATED[name][0](checkpoint).all_logits(tokens) - truth).max()
    assert emulated_error > 10 * np.abs(refllm_contiguous(checkpoint).all_logits(tokens) - truth).max()


def test_bfloat16_and_float16_round_to_nearest_even():
    one_ulp_bf16, one_ulp_f16 = 2.0**-7, 2.0**-10
    x = np.array([1 + one_ulp_bf16 / 2, 1 + 1.5 * one_ulp_bf16, 1 + 0.75 * one_ulp_bf16, -3.0], np.float32)
    np.testing.assert_array_equal(bfloat16_round(x), [1, 1 + 2 * one_ulp_bf16, 1 + one_ulp_bf16, -3])
    y = np.array([1 + one_ulp_f16 / 2, 1 + 1.5 * one_ulp_f16], np.float32)
    np.testing.assert_array_equal(float16_round(y), [1, 1 + 2 * one_ulp_f16])


def test_q8_0_round_keeps_each_block_within_half_a_step():
    x = np.random.default_rng(0).normal(0, 1, (3, 64)).astype(np.float32)
    rounded = q8_0_round(x)
    for block in range(2):
        part, got = x[:, 32 * block : 32 * (block + 1)], rounded[:, 32 * block : 32 * (block + 1)]
        scale = np.abs(part).max(-1, keepdims=True) / 127
        assert np.all(np.abs(got - part) <= 0.51 * scale)  # half a step, and the scale's float16 rounding
        levels = got / float16_round(scale)
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
