"""DeepSeek-V3 beyond plain parity: each mechanism matters, the cache holds only the latent, every runtime agrees.

The transformers fixtures (``tests/helpers/hf_fixtures.py``) are the oracle; a variant
with one mechanism turned off must move the logits well past the parity
tolerance, or the fixture would not prove that mechanism.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm import CacheConfig, DecoderModel, InMemorySource, ModelConfig
from refllm.errors import ConfigError
from refllm.kernels.latent_attention import absorbed_latent_attention
from refllm.loading import open_source
from refllm.models.weights import SparseMLPWeights
from refllm.nn.latent_attention import latent_attention
from refllm.nn.moe_grouped import grouped_topk_routing
from refllm.runtime.llm import LLM
from tests.helpers.hf_fixtures import NEW_TOKENS
from tests.helpers.op_sets import weights_read_by_a_decode_step
from tests.helpers.parity import ATOL, RTOL, all_logits
from tests.helpers.paths import HF_DATA

CASES = ["deepseek_v3", "deepseek_v3-plain-q"]


def fixture_tensors(name: str) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    source = open_source(HF_DATA / name)
    return source.config, {n: source.tensor(n) for n in source.tensor_names()}


def logits_with(name: str, config: ModelConfig, tensors: dict[str, np.ndarray]) -> np.ndarray:
    reference = np.load(HF_DATA / name / "reference.npz")
    return all_logits(DecoderModel.load(InMemorySource(config, tensors)), reference["input_ids"])


def variants(config: ModelConfig, tensors: dict[str, np.ndarray]) -> dict[str, tuple[ModelConfig, dict]]:
    """Each mechanism turned off, one at a time."""
    experts, latent = config.experts, config.attention
    unbiased = {n: np.zeros_like(t) if n.endswith("e_score_correction_bias") else t for n, t in tensors.items()}
    no_shared = {n: np.zeros_like(t) if ".shared_experts." in n else t for n, t in tensors.items()}
    return {
        "correction bias": (config, unbiased),
        "group limit": (replace(config, experts=replace(experts, groups_per_token=experts.num_groups)), tensors),
        "shared experts": (config, no_shared),
        "routed scaling factor": (replace(config, experts=replace(experts, routed_scaling_factor=1.0)), tensors),
        "topk renormalisation": (replace(config, experts=replace(experts, norm_topk_prob=not experts.norm_topk_prob)), tensors),
        "softmax scale": (replace(config, attention=replace(latent, scale=latent.qk_head_dim**-0.5 * 1.5)), tensors),
        "rope layout": (replace(config, attention=replace(latent, rope_interleave=not latent.rope_interleave)), tensors),
    }


@pytest.mark.parametrize("name", CASES)
def test_every_mechanism_changes_the_logits(name):
    config, tensors = fixture_tensors(name)
    reference = np.load(HF_DATA / name / "reference.npz")["logits"]
    np.testing.assert_allclose(logits_with(name, config, tensors), reference, ATOL, RTOL)
    for mechanism, (changed_config, changed_tensors) in variants(config, tensors).items():
        moved = np.max(np.abs(logits_with(name, changed_config, changed_tensors) - reference))
        assert moved > 100 * ATOL, f"{name}: turning off the {mechanism} moves the logits only {moved:.2g}"


def test_the_yarn_fixture_scales_the_softmax_by_mscale_squared():
    config = refllm.load_model(HF_DATA / "deepseek_v3").config
    rope = config.rope_for_layer(0)
    assert rope.rope_type == "yarn" and rope.mscale_all_dim == 1.0
    mscale = 0.1 * np.log(rope.factor) + 1.0
    assert config.attention.scale == pytest.approx(config.attention.qk_head_dim**-0.5 * mscale**2)
    unscaled = replace(config, attention=replace(config.attention, scale=config.attention.qk_head_dim**-0.5))
    _, tensors = fixture_tensors("deepseek_v3")
    reference = np.load(HF_DATA / "deepseek_v3" / "reference.npz")["logits"]
    assert np.max(np.abs(logits_with("deepseek_v3", unscaled, tensors) - reference)) > 100 * ATOL


@pytest.mark.parametrize("name", CASES)
def test_the_cache_holds_one_latent_per_token_and_layer(name):
    model = refllm.load_model(HF_DATA / name)
    c = model.config
    width = c.attention.kv_lora_rank + c.attention.qk_rope_head_dim
    assert model.cache_shape.bytes_per_token == c.num_hidden_layers * width * 4
    cache = model.create_kv_cache(CacheConfig(kind="paged", block_size=4, num_blocks=16))
    assert cache.k.shape[-2:] == (1, width) and cache.v.size == 0


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
@pytest.mark.parametrize("name", CASES)
def test_batched_prefill_and_decode_equal_single_runs(name, cache_kind):
    model = refllm.load_model(HF_DATA / name)
    ids = np.load(HF_DATA / name / "reference.npz")["input_ids"]
    batch = np.concatenate([ids, ids[:, ::-1]])  # two different prompts of one length
    cache = model.create_kv_cache(CacheConfig(kind=cache_kind))
    batched = model.prefill_all_logits(batch, cache, range(batch.shape[1]))
    next_tokens = np.argmax(batched[:, -1], axis=-1)[:, None]
    decoded = model.decode(next_tokens, cache)
    for row in range(2):
        single_cache = model.create_kv_cache(CacheConfig(kind=cache_kind))
        single = model.prefill_all_logits(batch[row : row + 1], single_cache, range(batch.shape[1]))
        np.testing.assert_allclose(batched[row], single[0], ATOL, RTOL)
        np.testing.assert_allclose(decoded[row], model.decode(next_tokens[row : row + 1], single_cache)[0], ATOL, RTOL)


@pytest.mark.parametrize("name", CASES)
def test_llm_on_the_paged_arena_reproduces_the_transformers_greedy_tokens(name):
    reference = np.load(HF_DATA / name / "reference.npz")
    llm = LLM(refllm.load_model(HF_DATA / name), CacheConfig(block_size=4, num_blocks=64))
    prompt = reference["input_ids"][0].tolist()
    logits = llm.prefill("a", prompt)
    np.testing.assert_allclose(logits, reference["logits"][0, -1], ATOL, RTOL)
    tokens = []
    for _ in range(NEW_TOKENS):
        tokens.append(int(np.argmax(logits)))
        logits = llm.decode("a", tokens[-1], len(prompt) + len(tokens) - 1)
    assert tokens == reference["greedy"].tolist()
    llm.prefill("b", prompt[:5])
    rows = llm.decode_batch([("a", 3, llm.length("a")), ("b", 4, 5)])
    single = LLM(refllm.load_model(HF_DATA / name), CacheConfig(block_size=4, num_blocks=64))
    single.prefill("b", prompt[:5])
    np.testing.assert_allclose(rows[1], single.decode("b", 4, 5), ATOL, RTOL)


def test_fused_expert_tensors_load_as_the_per_expert_ones():
    config, tensors = fixture_tensors("deepseek_v3")
    fused = dict(tensors)
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.mlp.experts."
        if prefix + "0.gate_proj.weight" not in tensors:
            continue
        X = config.experts.num_experts
        gate_up = [np.concatenate([fused.pop(f"{prefix}{e}.{p}.weight") for p in ("gate_proj", "up_proj")]) for e in range(X)]
        fused[prefix + "gate_up_proj"] = np.stack(gate_up)
        fused[prefix + "down_proj"] = np.stack([fused.pop(f"{prefix}{e}.down_proj.weight") for e in range(X)])
    reference = np.load(HF_DATA / "deepseek_v3" / "reference.npz")["logits"]
    np.testing.assert_allclose(logits_with("deepseek_v3", config, fused), reference, ATOL, RTOL)


@pytest.mark.parametrize("name", CASES)
def test_parameter_counts_cover_latent_attention_and_every_expert(name):
    config, tensors = fixture_tensors(name)
    stored = sum(tensor.size for tensor in tensors.values())  # what the checkpoint file holds
    assert config.num_parameters == stored
    experts = config.experts
    sparse = sum(experts.is_sparse(i) for i in range(config.num_hidden_layers))
    unread = (experts.num_experts - experts.experts_per_token) * 3 * config.hidden_size * experts.moe_intermediate_size
    assert config.active_parameters == stored - sparse * unread


def test_a_decode_step_reads_only_the_chosen_and_the_shared_experts():
    """The sparse layers run the experts loop every mixture shares (refllm/nn/moe.py), through the op set."""
    model, read = weights_read_by_a_decode_step(HF_DATA / "deepseek_v3")
    sparse = [layer.mlp for layer in model.weights.layers if isinstance(layer.mlp, SparseMLPWeights)]
    assert len(sparse) == 2  # the first layer stays dense
    for mlp in sparse:
        touched = [e for e, expert in enumerate(mlp.experts) if id(expert.gate_proj) in read]
        assert len(touched) == model.config.experts.experts_per_token  # 3 of 8
        assert all({id(mlp.experts[e].up_proj), id(mlp.experts[e].down_proj)} <= read for e in touched)
        shared = mlp.shared
        assert {id(shared.gate_proj), id(shared.up_proj), id(shared.down_proj)} <= read


def test_routing_weights_come_from_the_scores_and_ties_go_to_the_lower_index():
    logits = np.zeros((1, 4))  # every score 0.5: a four-way tie
    bias = np.array([0.0, 0.0, 0.0, 0.0])
    ids, weights = grouped_topk_routing(logits, bias, 2, 2, 1, False, 1.0)
    assert ids.tolist() == [[0, 1]] and weights.tolist() == [[0.5, 0.5]]
    bias = np.array([0.0, 0.0, 0.3, -0.1])  # group 1 (experts 2, 3) scores 0.5 + 0.3 + 0.5 - 0.1 > group 0's 1.0
    ids, weights = grouped_topk_routing(logits, bias, 2, 2, 1, False, 2.0)
    assert ids.tolist() == [[2, 3]] and weights.tolist() == [[1.0, 1.0]]  # the bias chose, the scores weigh


@pytest.mark.parametrize(
    "change, named",
    [
        (dict(n_group=3), "n_group"),
        (dict(topk_group=5), "topk_group"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok"),
        (dict(qk_rope_head_dim=5), "qk_rope_head_dim"),
        (dict(kv_lora_rank=0), "kv_lora_rank"),
        (dict(routed_scaling_factor="x"), "routed_scaling_factor"),
        (dict(first_k_dense_replace=1.5), "first_k_dense_replace"),
        (dict(n_shared_experts=-1), "n_shared_experts"),
    ],
)
def test_a_bad_deepseek_config_is_refused_by_name(change, named):
    config = refllm.load_model(HF_DATA / "deepseek_v3").config
    config_json = json.loads((HF_DATA / "deepseek_v3" / "config.json").read_text())
    assert ModelConfig.from_hf(config_json) == config
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf(config_json | change)


def test_the_multi_token_prediction_layer_of_official_checkpoints_is_skipped(tmp_path):
    """DeepSeek-V3's checkpoints hold layer L (num_nextn_predict_layers = 1) past the L decoder layers."""
    from safetensors.numpy import save_file

    config, tensors = fixture_tensors("deepseek_v3")
    last = f"model.layers.{config.num_hidden_layers - 1}."
    extra = f"model.layers.{config.num_hidden_layers}."
    prediction = {extra + n[len(last) :]: t for n, t in tensors.items() if n.startswith(last)}
    prediction[extra + "eh_proj.weight"] = np.zeros((config.hidden_size, 2 * config.hidden_size), np.float32)
    save_file(tensors | prediction, str(tmp_path / "model.safetensors"))
    config_json = json.loads((HF_DATA / "deepseek_v3" / "config.json").read_text())
    assert config_json["num_nextn_predict_layers"] == 1
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    reference = np.load(HF_DATA / "deepseek_v3" / "reference.npz")
    np.testing.assert_allclose(all_logits(refllm.load_model(tmp_path), reference["input_ids"]), reference["logits"], ATOL, RTOL)
    (tmp_path / "config.json").write_text(json.dumps(config_json | {"num_nextn_predict_layers": 0}))
    with pytest.raises(ConfigError, match="layers"):
        refllm.load_model(tmp_path)


@settings(max_examples=40, deadline=None)
@given(
    heads=st.integers(1, 4),
    rank=st.integers(1, 12),
    nope=st.integers(1, 8),
    rope=st.sampled_from([2, 4, 8]),
    value=st.integers(1, 8),
    new=st.integers(1, 5),
    past=st.integers(0, 9),
    window=st.none() | st.integers(1, 6),
    softcap=st.none() | st.just(5.0),
    seed=st.integers(0, 2**16),
)
def test_the_absorbed_twin_equals_the_expanded_spec(heads, rank, nope, rope, value, new, past, window, softcap, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(new, heads, nope + rope))
    latent = rng.normal(size=(past + new, 1, rank + rope))
    kv_b_proj = rng.normal(size=(heads * (nope + value), rank))
    args = (q, latent, latent[..., :0], np.arange(past, past + new), 0.3, window, softcap)
    spec = latent_attention(*args, kv_b_proj=kv_b_proj, nope_dim=nope)
    twin = absorbed_latent_attention(*args, kv_b_proj=kv_b_proj, nope_dim=nope)
    assert spec.shape == (new, heads, value)
    np.testing.assert_allclose(twin, spec, rtol=1e-10, atol=1e-10)
