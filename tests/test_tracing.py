"""The tracing API (refllm/tracing.py): one forward pass through the spec ops, every op kept, the model untouched.

Its outputs are checked against independent computations: the model's own
logits, the spec attention recomputed from the recorded queries and keys, the
routing functions on the recorded router logits, and a logit lens done by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

import refllm
from refllm.kv import CacheConfig
from refllm.nn.attention import attention, attention_weights
from refllm.nn.moe import softmax_then_topk
from refllm.tracing import FINAL, compare, trace
from tests.helpers.paths import HF_DATA

IDS = [1, 5, 9, 3, 7, 2, 11]
FAMILIES = ["llama", "gemma2", "olmo2", "phi3", "smollm3", "mixtral", "gpt_oss", "deepseek_v3"]


def spec_logits(model, ids):
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    return model.prefill_all_logits(np.array([ids]), cache, range(len(ids)))[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trace_is_the_forward_pass_of_the_spec_ops_layer_by_layer(family):
    model = refllm.load_model(HF_DATA / family, reference=True)
    traced = trace(model, IDS)
    np.testing.assert_array_equal(traced.logits, spec_logits(model, IDS))  # the same ops, in the same order
    assert [layer.index for layer in traced.layers] == list(range(model.config.num_hidden_layers))
    embedded = model.embed(np.array([IDS]))[0]
    np.testing.assert_array_equal(traced.layers[0].residual, embedded)  # layer 0 reads the embeddings
    for layer in traced.layers:
        weights = layer.attention
        assert weights.shape == (model.config.attention.num_heads, len(IDS), len(IDS))
        assert np.all(np.triu(weights, 1) == 0)  # causal: nothing after the query
        if not getattr(model.config.attention, "sinks", False):  # latent attention has none
            np.testing.assert_allclose(weights.sum(-1), 1, rtol=1e-5)
        assert layer.ops and all(op.layer == layer.index for op in layer.ops)
    assert [op.layer for op in traced.ops][-2:] == [FINAL, FINAL] and traced.ops[-1].weight == "lm_head"
    assert traced.ops[0].name == "embed"


def test_the_attention_map_is_the_one_the_recorded_queries_and_keys_give():
    model = refllm.load_model(HF_DATA / "qwen2-sliding", reference=True)
    c = model.config
    traced = trace(model, IDS)
    layer = traced.layers[1]
    q, k = [op.output for op in layer.ops if op.name == "apply_rope"]  # queries and keys after RoPE
    v = next(op.output for op in layer.ops if op.weight and op.weight.endswith("v_proj")).reshape(
        1, len(IDS), c.attention.num_kv_heads, c.attention.head_dim
    )
    positions = np.arange(len(IDS))
    window = c.window_for_layer(1)
    expected = attention_weights(q[0], k[0], positions, c.attention.scale, window)
    np.testing.assert_array_equal(layer.attention, expected)
    out = next(op.output for op in layer.ops if op.name == "attention")
    np.testing.assert_array_equal(out, attention(q[0], k[0], v[0], positions, c.attention.scale, window))


def test_routes_are_the_routing_of_the_recorded_router_logits():
    model = refllm.load_model(HF_DATA / "qwen3_moe", reference=True)
    traced = trace(model, IDS)
    sparse = [layer for layer in traced.layers if model.config.is_sparse(layer.index)]
    assert sparse and all(layer.experts is not None for layer in sparse)
    for layer in sparse:
        experts = model.config.experts  # qwen3_moe: softmax over all experts, then the top k, renormalised
        ids, weights = softmax_then_topk(layer.router_logits, experts.experts_per_token, experts.norm_topk_prob)
        np.testing.assert_array_equal(layer.experts[0], ids)
        np.testing.assert_array_equal(layer.experts[1], weights)
        assert layer.experts[0].shape == (len(IDS), model.config.experts.experts_per_token)


def test_the_logit_lens_is_each_layers_residual_through_the_final_norm_and_head():
    model = refllm.load_model(HF_DATA / "llama", reference=True)
    traced = trace(model, IDS)
    ids, probs = traced.logit_lens(top=3, positions=[2, 6])
    assert ids.shape == probs.shape == (model.config.num_hidden_layers, 2, 3)
    for layer in range(model.config.num_hidden_layers):
        residual = traced.residual_after(layer)[[2, 6]].astype(np.float64)
        c = model.config
        normed = residual / np.sqrt((residual**2).mean(-1, keepdims=True) + c.norms.eps)
        normed = normed * (model.weights.norm.astype(np.float64) + c.norms.weight_offset)
        logits = normed @ model.weights.lm_head.astype(np.float64).T
        np.testing.assert_array_equal(ids[layer], np.argsort(-logits, axis=-1)[:, :3])
        expected = np.exp(logits - logits.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        np.testing.assert_allclose(probs[layer], np.take_along_axis(expected, ids[layer], -1), rtol=1e-4)
    np.testing.assert_array_equal(ids[-1, :, 0], traced.logits[[2, 6]].argmax(-1))


def test_a_quantized_model_is_traced_through_its_dequantized_blocks_and_left_as_it_was(tmp_path):
    from tests.helpers.gguf_convert import convert

    path = convert("llama", tmp_path / "llama.gguf", "Q8_0")
    quantized = refllm.load_model(path, quantized=True)
    dequantized = refllm.load_model(path, reference=True)
    ops_before = quantized.ops
    traced = trace(quantized, IDS)
    assert quantized.ops is ops_before  # the model itself is untouched
    np.testing.assert_array_equal(traced.logits, spec_logits(dequantized, IDS))


def test_compare_finds_where_float32_parts_from_float64():
    truth = trace(refllm.load_model(HF_DATA / "llama", dtype="float64"), IDS)
    single = trace(refllm.load_model(HF_DATA / "llama", reference=True), IDS)
    errors = compare(single, truth)
    assert len(errors) == len(truth.ops) and all(0 <= e < 1e-5 for _, e in errors)
    assert max(errors, key=lambda pair: pair[1])[1] > 0  # float32 rounds somewhere
    with pytest.raises(ValueError, match="different ops"):
        compare(single, trace(refllm.load_model(HF_DATA / "gemma2", reference=True), IDS))
    with pytest.raises(ValueError, match="non-empty"):
        trace(refllm.load_model(HF_DATA / "llama", reference=True), [])
