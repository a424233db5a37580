"""Failure reports name the property and the call that exposed the bug, and the layer and op where drift starts."""

from __future__ import annotations

import numpy as np
import pytest

from refllm.models.decoder import DecoderModel
from refllm.testing import (
    SUBLAYER_POINTS,
    Checkpoint,
    ConformanceFailure,
    ModelBackend,
    check_errors,
    check_logits,
    get_profile,
    refllm_contiguous,
    refllm_llm,
)
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


@pytest.mark.parametrize(
    "mutant, arch, keys, op",
    [
        (mutants.softmax_scale, "llama", {}, "the attention (the attention input matches"),
        (mutants.dropped_qkv_bias, "qwen2", {}, "the attention (the attention input matches"),
        (mutants.eps_outside_sqrt, "llama", {"rms_norm_eps": 0.5}, "the attention's input norm (the layer's input"),
        (mutants.pre_norm_not_post_norm, "olmo2", {}, "the attention's input norm (the layer's input matches"),
    ],
)
def test_a_refllm_shaped_mutant_is_reported_at_its_layer_and_op(mutant, arch, keys, op):
    checkpoint = Checkpoint.random(tiny_config_json(arch) | keys, 0)
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(mutant(checkpoint), checkpoint, [0, 5, 9, 17])
    report = str(failure.value)
    assert "first diverge at the output of layer 0 (" in report
    assert f"; in layer 0 the first op to diverge is {op}" in report


def test_an_embedding_bug_in_a_refllm_shaped_backend_names_the_embeddings():
    checkpoint = Checkpoint.random(tiny_config_json("llama"), 0)
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(mutants.pad_embedding_zeroed(checkpoint), checkpoint, [0, 5, 9, 17])
    report = str(failure.value)
    assert "hidden states first diverge at the embeddings (" in report
    assert "in layer" not in report


def _scaled_mlp_model(checkpoint, layer: int):
    model = DecoderModel.load(checkpoint, reference=True)
    mlp = model.layers[layer].mlp
    model.layers[layer].mlp = lambda h: mlp(h) * np.float32(1.01)
    return model


def test_a_broken_mlp_deep_in_a_refllm_model_is_reported_at_its_layer():
    checkpoint = Checkpoint.random(tiny_config_json("llama") | {"num_hidden_layers": 4}, 0)
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(ModelBackend(_scaled_mlp_model(checkpoint, 2)), checkpoint, [0, 5, 9, 17])
    report = str(failure.value)
    assert "first diverge at the output of layer 2 (" in report
    assert "in layer 2 the first op to diverge is the MLP (the MLP input matches, the MLP output does not" in report


class _ExposesSomePoints(Backend):
    """A backend that shows only what enters the attention and what leaves the MLP."""

    name = "some points"

    def __init__(self, inner: Backend):
        self.inner = inner

    def layer_states(self, tokens):
        return self.inner.layer_states(tokens)

    def sublayer_states(self, tokens):
        shown = ("attention input", "MLP output")
        return [{point: inside[point] for point in shown} for inside in self.inner.sublayer_states(tokens)]


def test_with_points_missing_every_op_between_the_last_agreeing_point_and_the_first_diverging_one_is_named():
    checkpoint = Checkpoint.random(tiny_config_json("llama"), 0)
    backend = _ExposesSomePoints(mutants.softmax_scale(checkpoint))
    report = first_divergent_layer(backend, refllm_contiguous(checkpoint), [0, 5, 9, 17], get_profile("float32"))
    assert (
        "in layer 0 the first op to diverge is the attention, the attention's output norm, the residual add after the"
        " attention, the MLP's input norm or the MLP (the attention input matches, the MLP output does not" in report
    )


def test_refllms_runtime_exposes_its_models_insides():
    checkpoint = Checkpoint.random(tiny_config_json("qwen3"), 0)
    tokens, profile = [0, 5, 9, 17], get_profile("float32")
    got, want = refllm_llm(checkpoint).sublayer_states(tokens), refllm_contiguous(checkpoint).sublayer_states(tokens)
    assert len(got) == len(want) == checkpoint.config.num_hidden_layers
    for inside, expected in zip(got, want):
        assert set(inside) == set(expected) == set(SUBLAYER_POINTS)
        assert all(profile.close(inside[point], expected[point]) for point in SUBLAYER_POINTS)
