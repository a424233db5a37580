"""Gemma 2's soft-caps, SmolLM3's NoPE layers and OLMo 2's post-norms, on their transformers fixtures.

``tests/parity/test_hf_parity.py`` holds each fixture to transformers (logits and greedy
tokens, contiguous and paged). Here: each mechanism matters (switched off, the
logits leave the 1e-4 tolerance, so the parity could not pass without it), a
batch and ``decode_batch`` equal single runs, ``LLM`` over the paged arena and the
engine's continuous batching reproduce the fixture; the kernel twins agree with the
spec on each.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import refllm
from refllm import LLM, CacheConfig, ModelConfig
from refllm.errors import ConfigError
from refllm.io.safetensors import HFDirectorySource
from refllm.models.decoder import DecoderModel
from refllm.recipe import NormPlacement, QKNorm
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.sampling import SamplingParams
from refllm.testing.truth import relative_error
from tests.helpers.hf_fixtures import NEW_TOKENS
from tests.helpers.op_sets import ROUNDING_MULTIPLE, ULP_FLOOR, logits_over, random_weights_model
from tests.helpers.parity import ATOL, RTOL, all_logits
from tests.helpers.paths import HF_DATA

FIXTURES = ["gemma2", "smollm3", "olmo2"]


def load(name: str) -> tuple[DecoderModel, dict]:
    return refllm.load_model(HF_DATA / name), dict(np.load(HF_DATA / name / "reference.npz"))


def pre_norm_twin(model: DecoderModel) -> DecoderModel:
    """OLMo 2 with its two norms moved before attention and the MLP (Llama's placement), weights unchanged."""
    layers = [
        dataclasses.replace(
            layer,
            attention_norm=layer.attention_output_norm,
            attention_output_norm=None,
            mlp_norm=layer.mlp_output_norm,
            mlp_output_norm=None,
        )
        for layer in model.weights.layers
    ]
    weights = dataclasses.replace(model.weights, layers=layers)
    pre_norms = dataclasses.replace(model.config.norms, placement=NormPlacement.PRE)
    return DecoderModel(model.config.with_overrides(norms=pre_norms), weights)


def with_config(model: DecoderModel, **changes) -> DecoderModel:
    return DecoderModel(model.config.with_overrides(**changes), model.weights)


def with_attention(model: DecoderModel, **changes) -> DecoderModel:
    return with_config(model, attention=dataclasses.replace(model.config.attention, **changes))


SWITCHED_OFF = {
    "no attention soft-cap": ("gemma2", lambda m: with_attention(m, softcap=None)),
    "no final-logit soft-cap": ("gemma2", lambda m: with_config(m, final_logit_softcapping=None)),
    "no sliding window": ("gemma2", lambda m: with_config(m, sliding_window=None)),
    "RoPE on every layer": ("smollm3", lambda m: with_config(m, nope_layers=())),
    "pre-norm placement": ("olmo2", pre_norm_twin),
    "no q/k norm": ("olmo2", lambda m: with_attention(m, qk_norm=QKNorm.NONE)),
}


@pytest.mark.parametrize("change", list(SWITCHED_OFF))
def test_each_mechanism_moves_the_logits_past_the_tolerance(change):
    name, switch_off = SWITCHED_OFF[change]
    model, reference = load(name)
    np.testing.assert_allclose(all_logits(model, reference["input_ids"]), reference["logits"], ATOL, RTOL)
    changed = all_logits(switch_off(model), reference["input_ids"])
    assert not np.allclose(changed, reference["logits"], rtol=RTOL, atol=ATOL)


def test_the_fixtures_carry_their_mechanisms():
    gemma2, smollm3, olmo2 = (load(name)[0].config for name in FIXTURES)
    assert (gemma2.attention.softcap, gemma2.final_logit_softcapping) == (2.0, 3.0)
    assert gemma2.layer_types == ("sliding_attention", "full_attention") and gemma2.attention.scale == 24**-0.5
    assert smollm3.nope_layers == (3,)
    assert olmo2.norms.placement is NormPlacement.POST and olmo2.attention.qk_norm is QKNorm.WHOLE


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("name", FIXTURES)
def test_a_batch_equals_its_rows_run_alone(name, kind):
    model, reference = load(name)
    prompts = np.concatenate([reference["input_ids"], reference["input_ids"][:, ::-1]])  # [2, T]
    batched = model.prefill_all_logits(prompts, model.create_kv_cache(CacheConfig(kind=kind)), range(prompts.shape[1]))
    for row in range(2):
        np.testing.assert_allclose(batched[row], all_logits(model, prompts[row : row + 1], kind)[0], 1e-5, 1e-5)
    np.testing.assert_allclose(batched[0], reference["logits"][0], ATOL, RTOL)


@pytest.mark.parametrize("name", FIXTURES)
def test_llm_reproduces_the_fixture_and_decode_batch_equals_single_decodes(name):
    model, reference = load(name)
    prompt = reference["input_ids"][0].tolist()
    batched, single = (LLM(model, CacheConfig(block_size=4, num_blocks=64)) for _ in range(2))
    next_logits = batched.prefill("a", prompt)
    np.testing.assert_allclose(next_logits, reference["logits"][0, -1], ATOL, RTOL)
    batched.prefill("b", prompt[:9])
    single.prefill("a", prompt)
    single.prefill("b", prompt[:9])
    generated, other = [], 3
    for _ in range(NEW_TOKENS):
        generated.append(int(np.argmax(next_logits)))
        items = [("a", generated[-1], batched.length("a")), ("b", other, batched.length("b"))]
        rows = batched.decode_batch(items)
        for (cache_id, token, pos), row in zip(items, rows):
            np.testing.assert_allclose(row, single.decode(cache_id, token, pos), 1e-5, 1e-5)
        next_logits, other = rows[0], int(np.argmax(rows[1]))
    assert generated == reference["greedy"].tolist()


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("name", FIXTURES)
def test_the_fast_ops_agree_with_the_spec(name, kind):
    """The kernel twins on each mechanism (soft-capped scores in the arena's kernels, NoPE, post-norms)."""
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 128, size=20)]
    truth = logits_over(random_weights_model(name, "float64"), "contiguous", tokens, 12)
    spec = logits_over(random_weights_model(name, reference=True), kind, tokens, 12)
    fast = logits_over(random_weights_model(name, reference=False), kind, tokens, 12)
    assert relative_error(fast, spec) <= ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)


@pytest.mark.parametrize("name", FIXTURES)
def test_the_parameter_count_is_the_checkpoints(name):
    """``refllm info`` and the memory estimates count OLMo 2's post-norms and [H*E] q/k norms, Gemma 2's four norms."""
    source = HFDirectorySource(HF_DATA / name)
    assert source.config.num_parameters == sum(source.tensor(t).size for t in source.tensor_names())


# ---- config.json as the Hub spells it, and refusals that name the bad value ----------------------------


def hub_config(name: str) -> dict:
    return json.loads((HF_DATA / name / "config.json").read_text())


def test_gemma2_takes_transformers_defaults_for_missing_caps_and_none_for_null_ones():
    config = hub_config("gemma2")
    del config["attn_logit_softcapping"], config["final_logit_softcapping"]
    c = ModelConfig.from_hf(config)
    assert (c.attention.softcap, c.final_logit_softcapping) == (50.0, 30.0)
    c = ModelConfig.from_hf(config | {"attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (c.attention.softcap, c.final_logit_softcapping) == (None, None)


def test_smollm3_no_rope_layers_flag_the_layers_that_rotate():
    assert ModelConfig.from_hf(hub_config("smollm3") | {"no_rope_layers": [0, 1, 1, 0]}).nope_layers == (0, 3)
    derived = {k: v for k, v in hub_config("smollm3").items() if k != "no_rope_layers"}
    assert ModelConfig.from_hf(derived | {"no_rope_layer_interval": 2}).nope_layers == (1, 3)


def test_smollm3_windows_only_where_use_sliding_window_is_on():
    config = hub_config("smollm3") | {"sliding_window": 4}
    config.pop("layer_types")
    assert ModelConfig.from_hf(config).sliding_window is None
    c = ModelConfig.from_hf(config | {"use_sliding_window": True})
    assert c.sliding_window == 4 and c.layer_types == ("full_attention",) * 3 + ("sliding_attention",)


BAD_CONFIGS = {
    "a soft-cap of zero": ("gemma2", {"attn_logit_softcapping": 0}, "attn_logit_softcapping"),
    "a soft-cap that is text": ("gemma2", {"final_logit_softcapping": "30"}, "final_logit_softcapping"),
    "too few no_rope_layers": ("smollm3", {"no_rope_layers": [1, 1, 0]}, "no_rope_layers"),
    "a no_rope_layers flag of 2": ("smollm3", {"no_rope_layers": [1, 1, 2, 0]}, "no_rope_layers"),
    "an interval of zero": ("smollm3", {"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
    "a negative epsilon": ("olmo2", {"rms_norm_eps": -1e-6}, "rms_norm_eps"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_a_bad_value_is_refused_by_name(case):
    name, change, key = BAD_CONFIGS[case]
    with pytest.raises(ConfigError, match=key):
        ModelConfig.from_hf(hub_config(name) | change)


def test_nope_layers_must_be_layers_of_the_model():
    config = ModelConfig.from_hf(hub_config("smollm3"))
    with pytest.raises(ConfigError, match="nope_layers holds 4"):
        config.with_overrides(nope_layers=(4,))


@pytest.mark.parametrize("name", FIXTURES)
def test_the_engine_batches_the_fixture_with_other_requests_and_keeps_its_greedy_tokens(name):
    model, reference = load(name)
    prompt = reference["input_ids"][0].tolist()
    others = [prompt[::-1], prompt[:5], prompt[3:17]]
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=4, num_blocks=48)), offload=False))
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    handles = [engine.submit(p, params) for p in [prompt, *others]]
    engine.run_until_done()
    assert engine.stats.largest_batch > 1
    assert handles[0].result().completions[0].token_ids == reference["greedy"].tolist()
