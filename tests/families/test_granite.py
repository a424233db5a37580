"""IBM Granite 3 (refllm/families/granite.py): its four multipliers read, each one mattering, bad ones refused.

Parity with transformers and float64 truth on the ``granite`` fixture run with every other
family's (tests/parity/test_hf_parity.py, tests/parity/test_float64_truth.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import refllm
from refllm.config import ConfigError, ModelConfig
from refllm.models.decoder import DecoderModel
from tests.helpers.parity import ATOL, RTOL, all_logits
from tests.helpers.paths import HF_DATA

FIXTURE = HF_DATA / "granite"


def config_json() -> dict:
    return json.loads((FIXTURE / "config.json").read_text())


def test_the_multipliers_are_read_into_the_recipe():
    c = ModelConfig.from_hf(config_json())
    assert (c.embedding_scale, c.residual_scale, c.attention.scale) == (12.0, 0.22, 0.125)
    assert c.logit_scale == 1 / 8.0
    absent = {k: v for k, v in config_json().items() if not k.endswith(("_multiplier", "_scaling"))}
    neutral = ModelConfig.from_hf(absent)  # transformers' GraniteConfig defaults: every multiplier 1
    assert (neutral.embedding_scale, neutral.residual_scale, neutral.attention.scale, neutral.logit_scale) == (1, 1, 1, 1)


NEUTRAL = {
    "embedding_multiplier": lambda c: c.with_overrides(embedding_scale=1.0),
    "residual_multiplier": lambda c: c.with_overrides(residual_scale=None),
    "attention_multiplier": lambda c: c.with_overrides(attention=replace(c.attention, scale=c.attention.head_dim**-0.5)),
    "logits_scaling": lambda c: c.with_overrides(logit_scale=None),
}


@pytest.mark.parametrize("multiplier", list(NEUTRAL))
def test_each_multiplier_moves_the_logits_past_the_tolerance(multiplier):
    model = refllm.load_model(FIXTURE)
    reference = np.load(FIXTURE / "reference.npz")
    np.testing.assert_allclose(all_logits(model, reference["input_ids"]), reference["logits"], ATOL, RTOL)
    changed = DecoderModel(NEUTRAL[multiplier](model.config), model.weights)
    assert not np.allclose(all_logits(changed, reference["input_ids"]), reference["logits"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("key", ["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"])
@pytest.mark.parametrize("value", [0, -2.0, math.nan, "12"])
def test_a_bad_multiplier_is_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=key):
        ModelConfig.from_hf(config_json() | {key: value})
