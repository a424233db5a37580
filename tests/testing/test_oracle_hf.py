"""The transformers backend passes the conformance kit against refllm on every architecture, and a failure in it
is placed at its layer and op: through output_hidden_states and hooks on each layer's attention and MLP."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from refllm.testing import (
    SUBLAYER_POINTS,
    Checkpoint,
    ConformanceFailure,
    check_logits,
    get_profile,
    refllm_contiguous,
    run_conformance,
)
from refllm.testing.configs import ARCHITECTURES, optional_keys, tiny_config_json
from refllm.testing.explain import first_divergent_layer
from refllm.testing.strategies import full_configs

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOKENS = [0, 5, 9, 17, 3, 63]


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
def test_every_point_inside_every_layer_matches_the_reference(arch):
    from refllm.testing.hf import transformers_backend

    checkpoint = Checkpoint.random(tiny_config_json(arch), 0)
    backend, reference = transformers_backend(checkpoint), refllm_contiguous(checkpoint)
    got, want, profile = backend.sublayer_states(TOKENS), reference.sublayer_states(TOKENS), get_profile("float32")
    assert len(got) == len(want) == checkpoint.config.num_hidden_layers
    for layer, (inside, expected) in enumerate(zip(got, want)):
        assert set(inside) == set(expected) == set(SUBLAYER_POINTS), layer
        for point in SUBLAYER_POINTS:
            assert inside[point].shape == (len(TOKENS), checkpoint.config.hidden_size), (layer, point)
            assert profile.close(inside[point], expected[point]), (layer, point)
    assert "every layer matches" in first_divergent_layer(backend, reference, TOKENS, profile)


class _Scaled(torch.nn.Module):
    """A module whose output is ``factor`` times the wrapped one's: a deliberately broken op."""

    def __init__(self, module, factor: float):
        super().__init__()
        self.module, self.factor = module, factor

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs) * self.factor


def _scale_mlp(model):
    model.model.layers[2].mlp = _Scaled(model.model.layers[2].mlp, 1.01)


def _drop_attention_scale(model):
    model.model.layers[1].self_attn.scaling = 1.0  # scores not divided by sqrt(head dim)


def _widen_mlp_norm_epsilon(model):
    model.model.layers[3].post_attention_layernorm.variance_epsilon = 0.1  # llama's MLP input norm


@pytest.mark.parametrize(
    "patch, layer, op",
    [
        (_scale_mlp, 2, "the MLP (the MLP input matches, the MLP output does not"),
        (_drop_attention_scale, 1, "the attention (the attention input matches, the attention output does not"),
        (_widen_mlp_norm_epsilon, 3, "the attention's output norm, the residual add after the attention or the MLP's"),
    ],
)
def test_a_broken_op_in_a_transformers_model_is_reported_at_its_layer_and_op(patch, layer, op):
    from refllm.testing.hf import transformers_backend

    checkpoint = Checkpoint.random(tiny_config_json("llama") | {"num_hidden_layers": 4}, 0)
    backend = transformers_backend(checkpoint)
    check_logits(backend, checkpoint, TOKENS)  # unpatched, it conforms
    patch(backend.model)
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(backend, checkpoint, TOKENS)
    report = str(failure.value)
    assert f"first diverge at the output of layer {layer} " in report
    assert f"in layer {layer} the first op to diverge is {op}" in report


def test_an_embedding_bug_is_reported_at_the_embeddings():
    from refllm.testing.hf import transformers_backend

    checkpoint = Checkpoint.random(tiny_config_json("gemma3_text"), 0)
    backend = transformers_backend(checkpoint)
    backend.model.model.embed_tokens.embed_scale.fill_(1.0)  # Gemma's sqrt(hidden size) scale dropped
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(backend, checkpoint, TOKENS)
    report = str(failure.value)
    assert "hidden states first diverge at the embeddings (" in report
    assert "in layer" not in report


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
