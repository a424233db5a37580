"""Gemma 2, SmolLM3 and OLMo 2 from GGUF files written by gguf's GGUFWriter, as llama.cpp converts them.

Each transformers fixture is converted (``test_gguf_source.convert``: llama.cpp's
metadata keys, gguf's tensor names, the q/k permutation of ``smollm3`` files,
Gemma's norms + 1) and loaded back: the same tensors, the same hyper-parameters
where the file can carry them, and the same logits as the safetensors checkpoint.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import refllm
from refllm import DecoderModel
from refllm.io.gguf import GGUFSource
from refllm.io.safetensors import HFDirectorySource
from tests.helpers.gguf_convert import convert, float32_eps
from tests.helpers.hf_fixtures import NEW_TOKENS
from tests.helpers.parity import ATOL, RTOL, all_logits, greedy
from tests.helpers.paths import HF_DATA

CASES = ["gemma2", "smollm3", "olmo2"]


@pytest.mark.parametrize("case", CASES)
def test_tensors_come_back_in_hugging_face_names_and_layout(case, tmp_path):
    hf = HFDirectorySource(HF_DATA / case)
    source = GGUFSource(convert(case, tmp_path / f"{case}.gguf"))
    assert sorted(source.tensor_names()) == sorted(hf.tensor_names())
    for name in hf.tensor_names():
        # Gemma's norms went through w + 1 - 1 in float32, which may round the last bit.
        np.testing.assert_allclose(source.tensor(name), hf.tensor(name), rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", ["smollm3", "olmo2"])
def test_converted_fixture_is_the_hugging_face_model(case, tmp_path):
    model = refllm.load_model(convert(case, tmp_path / f"{case}.gguf"))
    hf_model = refllm.load_model(HF_DATA / case)
    assert model.config == float32_eps(hf_model.config)  # GGUF stores the epsilon as a float32
    reference = np.load(HF_DATA / case / "reference.npz")
    ids = reference["input_ids"]
    np.testing.assert_array_equal(all_logits(model, ids), all_logits(hf_model, ids))
    np.testing.assert_allclose(all_logits(model, ids), reference["logits"], ATOL, RTOL)
    assert greedy(model, ids, NEW_TOKENS) == reference["greedy"].tolist()


def test_smollm3_gguf_skips_rope_on_every_fourth_layer(tmp_path):
    """No GGUF key names SmolLM3's NoPE layers; llama.cpp fixes the interval at 4, and so does refllm."""
    assert GGUFSource(convert("smollm3", tmp_path / "s.gguf")).config.nope_layers == (3,)


def test_gemma2_gguf_carries_both_soft_caps_and_takes_the_rest_from_the_architecture(tmp_path):
    """Gemma 2 files carry the soft-caps and the window; the alternating layers and the query scale
    (head_dim below the 27B) are llama.cpp's."""
    hf_config = HFDirectorySource(HF_DATA / "gemma2").config
    model = refllm.load_model(convert("gemma2", tmp_path / "g.gguf"))
    c = model.config
    assert (c.attention.softcap, c.final_logit_softcapping) == (2.0, 3.0)
    assert c.layer_types == ("sliding_attention", "full_attention") and c.sliding_window == 8
    # the fixture's query_pre_attn_scalar (24) is not in the file
    assert c.attention.scale == c.attention.head_dim**-0.5
    assert c == float32_eps(hf_config).with_overrides(attention=replace(hf_config.attention, scale=c.attention.scale))
    expected = DecoderModel(c, refllm.load_model(HF_DATA / "gemma2").weights)
    ids = np.load(HF_DATA / "gemma2" / "reference.npz")["input_ids"]
    np.testing.assert_allclose(all_logits(model, ids), all_logits(expected, ids), rtol=1e-5, atol=1e-5)
