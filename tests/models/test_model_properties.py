"""Properties of the forward pass that hold for every architecture and every cache."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm import CacheConfig
from refllm.models.random import random_model
from tests.helpers.random_models import model_for, tiny_config

TIGHT = dict(rtol=1e-5, atol=2e-5)  # same arithmetic, different summation order


ARCHITECTURES = [
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma2", "smollm3", "olmo2",
    "mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3",
]  # fmt: skip


def splits(total: int):
    """Strategy: a list of chunk lengths summing to ``total``."""
    return st.lists(st.integers(1, total), min_size=1, max_size=5).map(lambda cuts: _chunks(total, cuts))


def _chunks(total: int, cuts: list[int]) -> list[int]:
    points = sorted({c for c in cuts if c < total})
    edges = [0, *points, total]
    return [b - a for a, b in zip(edges, edges[1:])]


@settings(max_examples=25, deadline=None)
@given(
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(["contiguous", "paged"]),
    data=st.data(),
)
def test_chunked_prefill_equals_one_prefill(arch, kind, data):
    model = model_for(arch)
    length = data.draw(st.integers(1, 20), label="length")
    ids = data.draw(st.lists(st.integers(0, 63), min_size=length, max_size=length), label="ids")
    ids = np.array([ids])
    chunks = data.draw(splits(length), label="chunks")

    whole = model.prefill_all_logits(ids, model.create_kv_cache(CacheConfig(kind=kind, block_size=4)), range(length))
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    start = 0
    for size in chunks:
        part = model.prefill_all_logits(ids[:, start : start + size], cache, range(start, start + size))
        np.testing.assert_allclose(part, whole[:, start : start + size], **TIGHT)
        start += size


@settings(max_examples=25, deadline=None)
@given(arch=st.sampled_from(ARCHITECTURES), data=st.data())
def test_decode_after_prefill_equals_all_logits(arch, data):
    model = model_for(arch)
    prompt_len = data.draw(st.integers(1, 12), label="prompt_len")
    new = data.draw(st.integers(1, 8), label="new tokens")
    ids = np.array([data.draw(st.lists(st.integers(0, 63), min_size=prompt_len + new, max_size=prompt_len + new))])
    reference = model.prefill_all_logits(ids, model.create_kv_cache(), range(prompt_len + new))

    cache = model.create_kv_cache()
    logits = model.prefill(ids[:, :prompt_len], cache, range(prompt_len))
    np.testing.assert_allclose(logits, reference[:, prompt_len - 1], **TIGHT)
    for t in range(prompt_len, prompt_len + new):
        logits = model.decode(ids[:, t : t + 1], cache)
        np.testing.assert_allclose(logits, reference[:, t], **TIGHT)


def test_batch_rows_are_independent():
    model = model_for("gemma3_text")
    ids = np.random.default_rng(0).integers(0, 64, size=(3, 9))
    batch = model.prefill_all_logits(ids, model.create_kv_cache(), range(9))
    for row in range(3):
        single = model.prefill_all_logits(ids[row : row + 1], model.create_kv_cache(), range(9))
        np.testing.assert_allclose(batch[row], single[0], **TIGHT)


def test_decode_all_logits_verifies_several_positions():
    model = model_for("qwen3")
    ids = np.random.default_rng(1).integers(0, 64, size=(1, 10))
    reference = model.prefill_all_logits(ids, model.create_kv_cache(), range(10))
    cache = model.create_kv_cache()
    model.prefill(ids[:, :6], cache, range(6))
    np.testing.assert_allclose(model.decode_all_logits(ids[:, 6:], cache), reference[:, 6:], **TIGHT)


def test_embeddings_in_equal_token_ids_in():
    model = model_for("gemma3_text")
    ids = np.random.default_rng(2).integers(0, 64, size=(1, 7))
    from_ids = model.prefill(ids, model.create_kv_cache(), range(7))
    from_embeddings = model.prefill(model.embed(ids), model.create_kv_cache(), range(7))
    np.testing.assert_array_equal(from_ids, from_embeddings)
    assert np.array_equal(model.embed_multimodal(ids, []), model.embed(ids))


def test_hidden_states_feed_the_lm_head():
    model = model_for("llama")
    ids = np.random.default_rng(3).integers(0, 64, size=(1, 5))
    hidden = model.prefill_hidden(ids, model.create_kv_cache(), range(5))
    assert hidden.shape == (1, 5, model.config.hidden_size)
    logits = model.prefill_all_logits(ids, model.create_kv_cache(), range(5))
    np.testing.assert_allclose(model.logits(hidden), logits, **TIGHT)


def test_sliding_window_changes_only_positions_past_the_window():
    window = 4
    windowed = random_model(tiny_config("mistral", sliding_window=window), seed=3)
    unwindowed = random_model(tiny_config("mistral").with_overrides(sliding_window=None), seed=3)
    ids = np.random.default_rng(4).integers(0, 64, size=(1, 12))
    a = windowed.prefill_all_logits(ids, windowed.create_kv_cache(), range(12))
    b = unwindowed.prefill_all_logits(ids, unwindowed.create_kv_cache(), range(12))
    np.testing.assert_allclose(a[:, :window], b[:, :window], **TIGHT)
    assert not np.allclose(a[:, window:], b[:, window:], atol=1e-3)
