"""SmolVLM (Idefics3) and Gemma 3 with vision against transformers, on their Hub-layout fixtures.

The fixtures (``tests/helpers/hf_vision_fixtures.py``) hold transformers' pixel values, image
features, spliced input embeddings, logits at every position and 16 greedy tokens for
prompts with several images of odd sizes (and Gemma 3's pan-and-scan crops). Here refllm
reproduces each from the same pixel values (the preprocessing is compared apart, in
tests/io/test_vision_preprocessing.py), on both caches and both op sets; every mechanism switched
off moves the logits past the tolerance; a text prompt gives exactly the text model's
logits; a mismatched image is refused and changes nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import refllm
from refllm import CacheConfig
from refllm.errors import ImageError
from refllm.io.safetensors import HFDirectorySource
from refllm.models.decoder import DecoderModel
from tests.helpers.hf_vision_fixtures import NEW_TOKENS, SCENARIOS, images_of, reference
from tests.helpers.paths import HF_DATA

ATOL = RTOL = 1e-4  # logits
FEATURES = 1e-5  # image features and spliced embeddings
CASES = [(case, scenario) for case in SCENARIOS for scenario in SCENARIOS[case]]
IMAGE_CASES = [(case, scenario) for case, scenario in CASES if scenario != "text_only"]


@pytest.fixture(scope="module", params=[True, False], ids=["spec", "fast"])
def models(request) -> dict:
    return {case: refllm.load_model(HF_DATA / case, reference=request.param) for case in SCENARIOS}


def all_logits(model, ref: dict, kind: str, spans: bool = True) -> np.ndarray:
    ids = ref["input_ids"][None]
    x = model.embed_multimodal(ids, images_of(ref))
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=8))
    runs = [model.image_spans(ids[0])] if spans else None
    return model.prefill_all_logits(x, cache, range(ids.shape[1]), image_spans=runs)[0]


def greedy(model, ref: dict, kind: str) -> list[int]:
    ids = ref["input_ids"][None]
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=8))
    x = model.embed_multimodal(ids, images_of(ref))
    logits = model.prefill(x, cache, range(ids.shape[1]), image_spans=[model.image_spans(ids[0])])
    tokens = []
    for _ in range(NEW_TOKENS):
        tokens.append(int(np.argmax(logits[0])))
        logits = model.decode(np.array([[tokens[-1]]]), cache)
    return tokens


@pytest.mark.parametrize("case, scenario", IMAGE_CASES)
def test_image_features_and_spliced_embeddings_match_transformers(models, case, scenario):
    model, ref = models[case], reference(case, scenario)
    features = model.image_features(ref["pixel_values"])
    np.testing.assert_allclose(features.reshape(-1, features.shape[-1]), ref["image_features"], atol=FEATURES, rtol=0)
    embeddings = model.embed_multimodal(ref["input_ids"][None], images_of(ref))[0]
    np.testing.assert_allclose(embeddings, ref["embeddings"], atol=FEATURES, rtol=0)


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("case, scenario", CASES)
def test_logits_and_greedy_tokens_match_transformers(models, case, scenario, kind):
    model, ref = models[case], reference(case, scenario)
    np.testing.assert_allclose(all_logits(model, ref, kind), ref["logits"], atol=ATOL, rtol=RTOL)
    assert greedy(model, ref, kind) == ref["greedy"].tolist()


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_a_text_prompt_gives_exactly_the_text_models_logits(case):
    vision_model = refllm.load_model(HF_DATA / case, reference=True)
    text_model = DecoderModel.load(HFDirectorySource(HF_DATA / case), reference=True)
    ref = reference(case, "text_only")
    ids = ref["input_ids"][None]
    cache = text_model.create_kv_cache(CacheConfig(kind="contiguous"))
    expected = text_model.prefill_all_logits(ids, cache, range(ids.shape[1]))
    got = all_logits(vision_model, ref, "contiguous")
    assert np.array_equal(got, expected[0])


# ---- every mechanism matters --------------------------------------------------------------------------


def shuffle_columns_first(features, scale):
    """Pixel shuffle with the neighbourhood read column by column: the wrong channel order."""
    N, P, D = features.shape
    G = math.isqrt(P)
    grid = features.reshape(N, G // scale, scale, G // scale, scale, D)
    return grid.transpose(0, 1, 3, 4, 2, 5).reshape(N, (G // scale) ** 2, scale * scale * D)


def gelu_erf(x):
    from math import erf, sqrt

    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


def pool_without_norm(connector, features):
    """PooledConnector.__call__ with the soft-embedding norm left out."""
    from refllm.nn.image_tokens import average_pool

    return average_pool(features, connector.scale) @ connector.projection


SWITCHED_OFF = {
    "pixel shuffle read by columns": ("idefics3", "refllm.models.connector.pixel_shuffle", shuffle_columns_first),
    "no position embeddings": ("idefics3", "refllm.models.vision_tower.position_embedding",
                               lambda mask, table: np.zeros((*mask.reshape(len(mask), -1).shape, table.shape[1]))),
    "GELU without the tanh approximation": ("idefics3", "refllm.models.vision_tower.gelu_tanh", gelu_erf),
    "no soft-embedding norm": ("gemma3_vision", "refllm.models.connector.PooledConnector.__call__", pool_without_norm),
}  # fmt: skip


@pytest.mark.parametrize("mechanism", list(SWITCHED_OFF))
def test_each_mechanism_switched_off_moves_the_logits(mechanism, monkeypatch):
    case, target, replacement = SWITCHED_OFF[mechanism]
    model, ref = refllm.load_model(HF_DATA / case, reference=True), reference(case, "two_images")
    np.testing.assert_allclose(all_logits(model, ref, "contiguous"), ref["logits"], atol=ATOL, rtol=RTOL)
    monkeypatch.setattr(target, replacement)
    assert_past_tolerance(all_logits(model, ref, "contiguous"), ref["logits"])


def assert_past_tolerance(got: np.ndarray, expected: np.ndarray) -> None:
    """The parity check (assert_allclose at ATOL, RTOL) would fail on ``got``."""
    moved = np.abs(got - expected).max()
    assert not np.allclose(got, expected, atol=ATOL, rtol=RTOL), f"the logits moved only {moved:.2e}"


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_gemmas_image_tokens_must_see_each_other(kind):
    model, ref = refllm.load_model(HF_DATA / "gemma3_vision"), reference("gemma3_vision", "two_images")
    assert_past_tolerance(all_logits(model, ref, kind, spans=False), ref["logits"])


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_features_spliced_one_position_off_move_the_logits(case):
    model, ref = refllm.load_model(HF_DATA / case, reference=True), reference(case, "two_images")
    ids = ref["input_ids"][None]
    is_image = ids[0] == model.multimodal.image_token_id
    x = model.embed_multimodal(ids, images_of(ref))
    shifted = model.embed(np.where(ids == model.multimodal.image_token_id, 0, ids))
    shifted[0, np.roll(is_image, 1)] = x[0, is_image]
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    logits = model.prefill_all_logits(shifted, cache, range(ids.shape[1]), image_spans=[model.image_spans(ids[0])])
    assert_past_tolerance(logits[0], ref["logits"])


# ---- refusals change nothing ------------------------------------------------------------------------------


def bad_images(ref: dict) -> dict:
    images = images_of(ref)
    return {
        "one image too few": images[:-1],
        "one tile too many": [np.concatenate([images[0], images[0][:1]]), *images[1:]],
        "wrong size": [images[0][:, :, :-1], *images[1:]],
        "not finite": [np.where(images[0] > 0, np.nan, images[0]), *images[1:]],
        "integers": [images[0].astype(np.int64), *images[1:]],
    }


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_mismatched_images_are_refused_and_the_cache_is_unchanged(case):
    from refllm.runtime.llm import LLM

    model, ref = refllm.load_model(HF_DATA / case), reference(case, "two_images")
    llm = LLM(model, CacheConfig(block_size=8))
    ids = ref["input_ids"].tolist()
    llm.prefill("kept", ids, images_of(ref))
    before = llm.stats()
    for name, images in bad_images(ref).items():
        with pytest.raises(ImageError):
            llm.prefill(name, ids, images)
        with pytest.raises(ImageError):
            model.embed_multimodal(ref["input_ids"][None], images)
    assert llm.cache_ids() == ["kept"] and llm.stats() == before


def test_a_run_of_the_wrong_length_is_refused():
    model, ref = refllm.load_model(HF_DATA / "idefics3"), reference("idefics3", "tall")
    ids = ref["input_ids"]
    first = model.image_spans(ids)[0][0]
    short = np.delete(ids, first)[None]  # one image token fewer in the first run
    with pytest.raises(ImageError, match="not 9 per tile"):
        model.embed_multimodal(short, images_of(ref))


def test_a_gemma_step_that_ends_inside_an_image_is_refused_and_changes_nothing():
    model, ref = refllm.load_model(HF_DATA / "gemma3_vision"), reference("gemma3_vision", "two_images")
    ids = ref["input_ids"][None]
    runs = model.image_spans(ids[0])
    cut = runs[0][0] + 3
    x = model.embed_multimodal(ids, images_of(ref))
    cache = model.create_kv_cache(CacheConfig(kind="paged", block_size=8))
    with pytest.raises(ImageError, match="end inside the image tokens"):
        model.prefill(x[:, :cut], cache, range(cut), image_spans=[runs])
    assert cache.sequence_ids() == []
    model.prefill(x[:, : runs[0][0]], cache, range(runs[0][0]), image_spans=[runs])  # up to the image: fine
    assert cache.length(0) == runs[0][0]


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_the_image_halfs_parameters_are_counted(case):
    source = HFDirectorySource(HF_DATA / case)
    model = refllm.load_model(HF_DATA / case)
    stored = sum(source.tensor(name).size for name in source.tensor_names())
    assert model.metadata.num_parameters == stored == model.config.num_parameters + source.multimodal.num_parameters


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SCENARIOS))
def test_the_fixture_script_reproduces_the_stored_references(case, tmp_path):
    """transformers, rebuilt by tests/helpers/hf_vision_fixtures.py, still computes what the fixtures store."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from tests.helpers.hf_vision_fixtures import BUILDERS, hf_reference

    model, processor = BUILDERS[case]()
    for scenario, (content, options) in SCENARIOS[case].items():
        live, stored = hf_reference(case, model, processor, HF_DATA / case, content, options), reference(case, scenario)
        assert live["input_ids"].tolist() == stored["input_ids"].tolist()
        np.testing.assert_allclose(live["logits"], stored["logits"], atol=1e-5, rtol=1e-5)
        assert live["greedy"].tolist() == stored["greedy"].tolist()
