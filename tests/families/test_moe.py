"""Mixture of experts and attention sinks: the routing rules, the experts loop, both checkpoint layouts,
batches and the runtime on the Mixtral, Qwen3-MoE and gpt-oss fixtures, and proof that each mechanism
shows in the logits transformers computed."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import refllm
from refllm import CacheConfig, DecoderModel, InMemorySource, ModelConfig
from refllm.errors import ConfigError
from refllm.io.safetensors import HFDirectorySource
from refllm.memory import weight_bytes
from refllm.models.blocks import SparseMLP
from refllm.models.random import random_tensors
from refllm.nn.attention import attention, softmax, softmax_with_sink
from refllm.nn.mlp import MLPWeights, clamped_swiglu, gated_mlp
from refllm.nn.moe import (
    experts_forward,
    softmax_then_topk,
    top_k,
    topk_then_softmax,
)
from refllm.runtime.llm import LLM
from refllm.testing.strategies import hf_configs
from refllm.testing.truth import relative_error
from tests.helpers.hf_fixtures import NEW_TOKENS
from tests.helpers.op_sets import ROUNDING_MULTIPLE, ULP_FLOOR, weights_read_by_a_decode_step
from tests.helpers.parity import ATOL, RTOL, all_logits, greedy
from tests.helpers.paths import HF_DATA

MOE_CASES = ["mixtral", "qwen3_moe", "gpt_oss"]
CLOSE = dict(rtol=1e-5, atol=1e-5)  # the same arithmetic on other row groupings: float32 rounding


# --- routing --------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(arrays(np.int64, st.tuples(st.integers(1, 5), st.integers(2, 8)), elements=st.integers(-40, 40), unique=True),
       st.data())
def test_top_k_then_softmax_is_softmax_then_top_k_renormalised(steps, data):
    """Distinct logits a quarter apart: softmax keeps their order, so both routings pick the same experts."""
    logits = steps / 4.0
    k = data.draw(st.integers(1, logits.shape[1]))
    ids_a, weights_a = topk_then_softmax(logits, k)
    ids_b, weights_b = softmax_then_topk(logits, k, renormalize=True)
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_allclose(weights_a, weights_b, rtol=1e-12)
    np.testing.assert_allclose(weights_a.sum(-1), 1.0, rtol=1e-12)
    _, raw = softmax_then_topk(logits, k, renormalize=False)
    np.testing.assert_allclose(raw, np.take_along_axis(softmax(logits), ids_b, -1), rtol=1e-12)


def test_top_k_orders_by_score_and_breaks_ties_towards_the_lower_id():
    scores = np.array([[0.0, 2.0, 1.0, 2.0, 2.0, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    assert top_k(scores, 3).tolist() == [[1, 3, 4], [0, 1, 2]]
    assert top_k(scores, 3).dtype == np.int64


def test_the_experts_loop_is_the_weighted_sum_of_every_chosen_expert():
    rng = np.random.default_rng(0)
    D, M, X, T, k = 6, 5, 4, 7, 2
    experts = [MLPWeights(rng.normal(size=(M, D)), rng.normal(size=(M, D)), rng.normal(size=(D, M))) for _ in range(X)]
    x = rng.normal(size=(T, D))
    ids, weights = softmax_then_topk(rng.normal(size=(T, X)), k, renormalize=False)
    expected = np.stack(
        [sum(weights[t, i] * gated_mlp(x[t : t + 1], experts[ids[t, i]])[0] for i in range(k)) for t in range(T)]
    )
    np.testing.assert_allclose(experts_forward(x, ids, weights, experts), expected, rtol=1e-12)


def test_an_expert_no_token_chose_is_never_read():
    rng = np.random.default_rng(1)
    read = []

    def mlp(rows, expert):
        read.append(expert)
        return rows * 2

    experts = [MLPWeights(*[rng.normal(size=(2, 2))] * 3) for _ in range(5)]
    experts_forward(rng.normal(size=(3, 2)), np.array([[4, 1], [1, 4], [4, 1]]), np.ones((3, 2)), experts, mlp)
    assert read == [experts[1], experts[4]]


def test_clamped_swiglu_follows_its_equation():
    gate = np.array([-30.0, -1.0, 0.5, 3.0, 9.0])
    up = np.array([-9.0, 0.2, -0.5, 8.0, 1.0])
    g, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
    expected = (u + 1) * g / (1 + np.exp(-1.702 * g))
    np.testing.assert_allclose(clamped_swiglu(gate, up, 1.702, 7.0), expected, rtol=1e-15)


@settings(max_examples=30, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6)), elements=st.floats(-50, 50)),
    st.data(),
)
def test_a_sink_is_a_key_without_a_value(scores, data):
    sinks = data.draw(arrays(np.float64, scores.shape[0], elements=st.floats(-50, 50)))
    weights = softmax_with_sink(scores, sinks)
    with_sink = softmax(np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (*scores.shape[:2], 1))], -1))
    np.testing.assert_allclose(weights, with_sink[..., :-1], rtol=1e-12, atol=1e-300)
    assert np.all(weights.sum(-1) <= 1 + 1e-12)


def test_a_sink_of_minus_infinity_is_no_sink():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4, 8)), rng.normal(size=(5, 2, 8)), rng.normal(size=(5, 2, 8))
    positions = np.arange(2, 5)
    plain = attention(q, k, v, positions, 0.35, window=3)
    np.testing.assert_allclose(attention(q, k, v, positions, 0.35, 3, sinks=np.full(4, -np.inf)), plain, rtol=1e-12)
    assert not np.allclose(attention(q, k, v, positions, 0.35, 3, sinks=np.zeros(4)), plain)


# --- config -------------------------------------------------------------------------------------


def _config_json(name: str) -> dict:
    return json.loads((HF_DATA / name / "config.json").read_text())


def test_both_spellings_of_the_expert_count_give_the_same_config():
    for name in MOE_CASES:
        current = _config_json(name)
        older = dict(current)
        older["num_experts"] = older.pop("num_local_experts")
        assert ModelConfig.from_hf(older) == ModelConfig.from_hf(current)


def test_qwen3_moe_dense_and_sparse_layers():
    config = ModelConfig.from_hf(_config_json("qwen3_moe"))
    assert [config.is_sparse(i) for i in range(3)] == [True, False, True]
    stepped = ModelConfig.from_hf(_config_json("qwen3_moe") | {"decoder_sparse_step": 2, "mlp_only_layers": []})
    assert [stepped.is_sparse(i) for i in range(3)] == [False, True, False]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_local_experts": 0}, "num_local_experts"),
        ({"moe_intermediate_size": -3}, "moe_intermediate_size"),
        ({"mlp_only_layers": "1"}, "mlp_only_layers"),
    ],
)
def test_a_bad_moe_key_is_refused_by_name(change, named):
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf(_config_json("qwen3_moe") | change)


def test_parameter_counts_count_every_expert_and_the_active_ones():
    config = ModelConfig.from_hf(_config_json("mixtral"))
    weights = refllm.load_model(HF_DATA / "mixtral").weights
    assert weights.nbytes() == 4 * config.num_parameters  # float32: every expert is held
    assert weight_bytes(HFDirectorySource(HF_DATA / "mixtral"), quantized=False) == weights.nbytes()  # the estimate
    D, M, X, k, L = config.hidden_size, config.experts.moe_intermediate_size, 4, 2, config.num_hidden_layers
    assert config.num_parameters - config.active_parameters == L * (X - k) * 3 * D * M
    dense = ModelConfig.from_hf(_config_json("llama"))
    assert dense.active_parameters == dense.num_parameters


# --- loading ------------------------------------------------------------------------------------


def _fused(tensors: dict, config: ModelConfig) -> dict:
    """The per-expert tensors of a Mixtral or Qwen3-MoE checkpoint in transformers 5's fused in-memory layout."""
    fused = {}
    for name, array in tensors.items():
        if ".experts." not in name and not name.endswith("gate.weight"):
            fused[name] = array
    for i in range(config.num_hidden_layers):
        if not config.is_sparse(i):
            continue
        p = f"model.layers.{i}."
        moe_prefix = p + ("block_sparse_moe." if config.model_type == "mixtral" else "mlp.")
        names = ("w1", "w3", "w2") if config.model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        X = config.experts.num_experts
        expert = [[tensors[f"{moe_prefix}experts.{e}.{n}.weight"] for n in names] for e in range(X)]
        fused[p + "mlp.gate.weight"] = tensors[moe_prefix + "gate.weight"]
        fused[p + "mlp.experts.gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u, _ in expert])
        fused[p + "mlp.experts.down_proj"] = np.stack([d for _, _, d in expert])
    return fused


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_per_expert_and_fused_layouts_load_the_same_model(name):
    source = HFDirectorySource(HF_DATA / name)
    tensors = {n: source.tensor(n) for n in source.tensor_names()}
    assert any(".experts.0." in n for n in tensors)  # the Hub's layout, as save_pretrained wrote it
    fused = DecoderModel.load(InMemorySource(source.config, _fused(tensors, source.config)))
    reference = np.load(HF_DATA / name / "reference.npz")
    np.testing.assert_allclose(all_logits(fused, reference["input_ids"]), reference["logits"], ATOL, RTOL)


# --- batches and the runtime --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("name", MOE_CASES)
def test_batched_prefill_equals_single_runs(name, kind):
    model = refllm.load_model(HF_DATA / name)
    ids = np.random.default_rng(3).integers(0, 128, size=(3, 13))
    batched = all_logits(model, ids, kind)
    for row in range(3):
        np.testing.assert_allclose(batched[row], all_logits(model, ids[row : row + 1], kind)[0], **CLOSE)


@pytest.mark.parametrize("name", MOE_CASES)
def test_llm_decode_batch_and_greedy_match_single_runs_and_transformers(name):
    model = refllm.load_model(HF_DATA / name)
    reference = np.load(HF_DATA / name / "reference.npz")
    llm = LLM(model, CacheConfig(block_size=4))
    prompts = {"a": [5, 9, 33, 2, 77, 14, 8, 100, 3, 60], "b": [11, 12], "c": list(range(20, 39))}
    for cache_id, prompt in prompts.items():
        llm.prefill(cache_id, prompt)
    for step in range(3):
        items = [(cache_id, 40 + step, len(prompt)) for cache_id, prompt in prompts.items()]
        for (cache_id, token, _), row in zip(items, llm.decode_batch(items)):
            prompts[cache_id].append(token)
            fresh = model.prefill(np.array([prompts[cache_id]]), model.create_kv_cache(CacheConfig(kind="contiguous")),
                                  range(len(prompts[cache_id])))[0]
            np.testing.assert_allclose(row, fresh, **CLOSE)
    prompt = [int(t) for t in reference["input_ids"][0]]
    logits, tokens = llm.prefill("greedy", prompt), []
    for step in range(NEW_TOKENS):
        tokens.append(int(np.argmax(logits)))
        logits = llm.decode("greedy", tokens[-1], len(prompt) + step)
    assert tokens == reference["greedy"].tolist()


# --- each mechanism shows in the logits ---------------------------------------------------------


def _moe_changed(name: str, **changes) -> DecoderModel:
    source = HFDirectorySource(HF_DATA / name)
    config = source.config.with_overrides(experts=replace(source.config.experts, **changes))
    tensors = {n: source.tensor(n) for n in source.tensor_names()}
    return DecoderModel.load(InMemorySource(config, tensors))


def _without_sinks(name: str) -> DecoderModel:
    model = refllm.load_model(HF_DATA / name)
    layers = [replace(layer, attention=replace(layer.attention, sinks=None)) for layer in model.weights.layers]
    return DecoderModel(model.config, replace(model.weights, layers=layers))


MECHANISMS = {
    "mixtral: no renormalisation": lambda: _moe_changed("mixtral", norm_topk_prob=False),
    "qwen3_moe: renormalised": lambda: _moe_changed("qwen3_moe", norm_topk_prob=True),
    "qwen3_moe: top-k before the softmax": lambda: _moe_changed("qwen3_moe", routing="topk_then_softmax"),
    "gpt_oss: softmax before the top-k": lambda: _moe_changed(
        "gpt_oss", routing="softmax_then_topk", norm_topk_prob=False
    ),
    "gpt_oss: no clamp": lambda: _moe_changed("gpt_oss", swiglu_limit=1e9),
    "gpt_oss: no sinks": lambda: _without_sinks("gpt_oss"),
}


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_each_mechanism_changes_the_logits(mechanism):
    name = mechanism.split(":")[0]
    reference = np.load(HF_DATA / name / "reference.npz")
    changed = all_logits(MECHANISMS[mechanism](), reference["input_ids"])
    assert np.abs(changed - reference["logits"]).max() > 100 * (ATOL + RTOL * np.abs(reference["logits"]).max())


def test_gpt_oss_router_bias_changes_the_logits():
    reference = np.load(HF_DATA / "gpt_oss" / "reference.npz")
    model = refllm.load_model(HF_DATA / "gpt_oss")
    layers = [replace(layer, mlp=replace(layer.mlp, router_bias=None)) for layer in model.weights.layers]
    model = DecoderModel(model.config, replace(model.weights, layers=layers))
    changed = all_logits(model, reference["input_ids"])
    assert np.abs(changed - reference["logits"]).max() > 100 * (ATOL + RTOL * np.abs(reference["logits"]).max())


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_sink_layers_run_on_both_caches_and_both_op_sets(kind):
    reference = np.load(HF_DATA / "gpt_oss" / "reference.npz")
    for spec in (True, False):
        model = refllm.load_model(HF_DATA / "gpt_oss", reference=spec)
        np.testing.assert_allclose(all_logits(model, reference["input_ids"], kind), reference["logits"], ATOL, RTOL)
        assert greedy(model, reference["input_ids"], 8, kind) == reference["greedy"][:8].tolist()


# --- the op sets ---------------------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    config_json=hf_configs(architectures=MOE_CASES),
    seed=st.integers(0, 100),
    kind=st.sampled_from(["contiguous", "paged"]),
)
def test_fast_ops_run_the_experts_as_the_spec_does(config_json, seed, kind):
    """The experts loop through the kernels' linear against the spec's, on drawn MoE configs: within the
    rounding bound of tests/helpers/op_sets.py (each path's float32 error against float64 truth)."""
    config = ModelConfig.from_hf(config_json)
    tensors = random_tensors(config, seed)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(1, 12))

    def logits(dtype, reference, kind):
        model = DecoderModel.load(InMemorySource(config, tensors), dtype, reference)
        cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
        rows = list(model.prefill_all_logits(tokens[:, :8], cache, range(8))[0])
        return np.stack(rows + [model.decode(tokens[:, [t]], cache)[0] for t in range(8, 12)])

    truth = logits("float64", True, "contiguous")
    spec, fast = logits("float32", True, kind), logits("float32", False, kind)
    assert relative_error(fast, spec) <= ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)


def test_a_decode_step_reads_only_the_chosen_experts():
    model, read = weights_read_by_a_decode_step(HF_DATA / "mixtral")
    for layer in model.weights.layers:
        experts = layer.mlp.experts
        touched = [e for e, expert in enumerate(experts) if id(expert.gate_proj) in read]
        assert len(touched) == model.config.experts.experts_per_token  # 2 of 4: the others' weights stay unread
        assert all({id(experts[e].up_proj), id(experts[e].down_proj)} <= read for e in touched)


@pytest.mark.parametrize("name", MOE_CASES)
def test_no_fixture_token_is_routed_by_float_rounding(name):
    """Between every token's k-th and (k+1)-th router logit (prompt and greedy continuation) lies a gap
    thousands of times float32's rounding of them: transformers and refllm pick the same experts."""
    reference = np.load(HF_DATA / name / "reference.npz")
    model = refllm.load_model(HF_DATA / name, reference=True)
    gaps = []

    k = model.config.experts.experts_per_token

    def recording(route):
        def recording_route(router_logits):
            ordered = np.sort(router_logits, axis=-1)[:, ::-1]
            gaps.append(ordered[:, k - 1] - ordered[:, k])
            return route(router_logits)

        return recording_route

    for layer in model.layers:
        if isinstance(layer.mlp, SparseMLP):
            layer.mlp.route = recording(layer.mlp.route)
    ids = np.concatenate([reference["input_ids"], reference["greedy"][None]], axis=1)
    all_logits(model, ids)
    assert min(gap.min() for gap in gaps) > 1e-3
