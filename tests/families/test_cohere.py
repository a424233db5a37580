"""Cohere's Command-R (refllm/families/cohere.py): each of its mechanisms matters, its config is read and refused.

Parity with transformers and float64 truth on the ``cohere`` and ``cohere-no-qk-norm`` fixtures run with
every other family's (tests/parity/test_hf_parity.py, tests/parity/test_float64_truth.py).
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
from refllm.recipe import NormKind, NormPlacement, QKNorm
from tests.helpers.parity import ATOL, RTOL, all_logits
from tests.helpers.paths import HF_DATA

FIXTURE = HF_DATA / "cohere"


def config_json() -> dict:
    return json.loads((FIXTURE / "config.json").read_text())


def test_the_recipe_is_read():
    c = ModelConfig.from_hf(config_json())
    assert (c.norms.placement, c.norms.kind, c.norms.eps) == (NormPlacement.PARALLEL, NormKind.LAYER, 1e-5)
    assert c.attention.qk_norm is QKNorm.PER_HEAD and c.logit_scale == 0.25
    plain = {k: v for k, v in config_json().items() if k not in ("logit_scale", "use_qk_norm", "tie_word_embeddings")}
    defaults = ModelConfig.from_hf(plain)  # transformers' CohereConfig defaults
    assert (defaults.logit_scale, defaults.attention.qk_norm, defaults.tie_word_embeddings) == (0.0625, QKNorm.NONE, True)


def sequential(model: DecoderModel) -> DecoderModel:
    """The same weights with attention, then the MLP, each reading a norm of its own input (Llama's wiring)."""
    layers = [replace(layer, mlp_norm=layer.attention_norm) for layer in model.weights.layers]
    norms = replace(model.config.norms, placement=NormPlacement.PRE)
    return DecoderModel(model.config.with_overrides(norms=norms), replace(model.weights, layers=layers))


def interleaved(model: DecoderModel) -> DecoderModel:
    """The checkpoint's q/k rows as they are stored: RoPE rotating (i, i + E/2) where Cohere rotates (2i, 2i + 1)."""
    layers = [
        replace(layer, attention=replace(
            layer.attention, **{name: tensor for name, tensor in raw_attention(layer_index).items()}
        ))
        for layer_index, layer in enumerate(model.weights.layers)
    ]  # fmt: skip
    return DecoderModel(model.config, replace(model.weights, layers=layers))


def raw_attention(layer: int) -> dict:
    from refllm.io.safetensors import HFDirectorySource

    source = HFDirectorySource(FIXTURE)
    prefix = f"model.layers.{layer}.self_attn."
    return {
        "q_proj": source.tensor(prefix + "q_proj.weight"),
        "k_proj": source.tensor(prefix + "k_proj.weight"),
        "q_norm": source.tensor(prefix + "q_norm.weight"),
        "k_norm": source.tensor(prefix + "k_norm.weight"),
    }


SWITCHED_OFF = {
    "parallel residual": sequential,
    # the spec ops: the RMSNorm kernel takes no per-head weights
    "LayerNorm": lambda m: DecoderModel(
        m.config.with_overrides(norms=replace(m.config.norms, kind=NormKind.RMS)), m.weights, reference=True
    ),
    "q/k norm": lambda m: DecoderModel(
        m.config.with_overrides(attention=replace(m.config.attention, qk_norm=QKNorm.NONE)), m.weights
    ),
    "logit scale": lambda m: DecoderModel(m.config.with_overrides(logit_scale=None), m.weights),
    "interleaved RoPE rows": interleaved,
}


@pytest.mark.parametrize("mechanism", list(SWITCHED_OFF))
def test_each_mechanism_moves_the_logits_past_the_tolerance(mechanism):
    model = refllm.load_model(FIXTURE)
    reference = np.load(FIXTURE / "reference.npz")
    np.testing.assert_allclose(all_logits(model, reference["input_ids"]), reference["logits"], ATOL, RTOL)
    changed = all_logits(SWITCHED_OFF[mechanism](model), reference["input_ids"])
    assert not np.allclose(changed, reference["logits"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"logit_scale": 0}, "logit_scale"),
        ({"logit_scale": math.nan}, "logit_scale"),
        ({"layer_norm_eps": 0}, "layer_norm_eps"),
        ({"layer_norm_eps": "1e-5"}, "layer_norm_eps"),
        ({"use_qk_norm": "yes"}, "use_qk_norm"),
    ],
)
def test_a_bad_value_is_refused_by_name(change, named):
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf(config_json() | change)
