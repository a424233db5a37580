"""refllm agrees with Hugging Face transformers on every architecture it claims.

Stored fixtures (written by ``tests/tools/make_hf_fixtures.py``) run without torch; the live
comparison rebuilds the same models in transformers (``tests/helpers/hf_fixtures.py``) when it is
installed.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import refllm
from refllm import DecoderModel, InMemorySource, ModelConfig
from tests.helpers.hf_fixtures import CASES, LEGACY_CONFIGS, NEW_TOKENS, build_hf_model, hf_reference, prompt_ids
from tests.helpers.parity import ATOL, RTOL, all_logits, greedy
from tests.helpers.paths import HF_DATA

CACHE_KINDS = ["contiguous", "paged"]


@pytest.mark.parametrize("cache_kind", CACHE_KINDS)
@pytest.mark.parametrize("name", list(CASES))
def test_stored_fixture_logits_and_greedy(name, cache_kind):
    reference = np.load(HF_DATA / name / "reference.npz")
    model = refllm.load_model(HF_DATA / name)
    np.testing.assert_allclose(all_logits(model, reference["input_ids"], cache_kind), reference["logits"], ATOL, RTOL)
    assert greedy(model, reference["input_ids"], NEW_TOKENS, cache_kind) == reference["greedy"].tolist()


@pytest.mark.parametrize("name", list(LEGACY_CONFIGS))
def test_legacy_config_spelling_gives_the_same_model(name, tmp_path):
    for file in (HF_DATA / name).iterdir():
        shutil.copy(file, tmp_path / file.name)
    shutil.copy(HF_DATA / name / "config.legacy.json", tmp_path / "config.json")
    legacy = refllm.load_model(tmp_path)
    current = refllm.load_model(HF_DATA / name)
    assert legacy.config == current.config
    reference = np.load(HF_DATA / name / "reference.npz")
    np.testing.assert_allclose(all_logits(legacy, reference["input_ids"]), reference["logits"], ATOL, RTOL)


@pytest.mark.parametrize("name", list(CASES))
def test_live_transformers_parity(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf_model = build_hf_model(name)
    config = ModelConfig.from_hf(json.loads(hf_model.config.to_json_string()))
    tensors = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    model = DecoderModel.load(InMemorySource(config, tensors))
    for seed in range(2):
        ids = np.random.default_rng(seed).integers(0, config.vocab_size, size=(1, 30))
        # A fresh transformers model per prompt: its dynamic RoPE keeps the longest
        # length it has seen, so a second prompt would otherwise see other frequencies.
        reference = hf_reference(build_hf_model(name), ids)
        np.testing.assert_allclose(all_logits(model, ids), reference["logits"], ATOL, RTOL)
        assert greedy(model, ids, NEW_TOKENS, "contiguous") == reference["greedy"].tolist()


def test_fixture_prompt_is_longer_than_every_window():
    for name in CASES:
        config = refllm.load_model(HF_DATA / name).config
        if config.sliding_window is not None:
            assert prompt_ids().shape[1] > config.sliding_window
