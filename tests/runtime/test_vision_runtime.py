"""Images through the runtime: chunked prefill that would cut an image, the prefix cache keyed by image, the engine.

- ``LLM.prefill(..., chunk_tokens=k)`` moves a boundary that would fall inside a run of image tokens out of it,
  so Gemma 3's image tokens always see the rest of their image: any k gives the whole prompt's logits;
- two prompts with the same image share their cached prefix through the image, with a different image of the
  same size (the same image tokens) only up to it; a prefix hit that ends inside an image is still exact;
- the engine batches requests with different images as it would run them alone, and refuses a mismatched one
  before anything is queued.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm import CacheConfig
from refllm.errors import ImageError
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.image_prompts import chunk_ends, prefix_key_ids
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from tests.helpers.hf_vision_fixtures import SCENARIOS, images_of, reference
from tests.helpers.paths import HF_DATA

CLOSE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def models() -> dict:
    return {case: refllm.load_model(HF_DATA / case) for case in SCENARIOS}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), length=st.integers(1, 60), chunk=st.integers(1, 20), start=st.integers(0, 10))
def test_chunk_ends_never_fall_inside_a_run_and_always_advance(data, length, chunk, start):
    cuts = sorted(data.draw(st.sets(st.integers(0, start + length), max_size=8)))
    runs = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]
    ends = chunk_ends(start, start + length, chunk, runs)
    assert ends[-1] == start + length and all(a < b for a, b in zip([start, *ends], ends))
    for end in ends[:-1]:
        assert not any(a < end < b for a, b in runs)
    for begin, end in zip([start, *ends], ends):
        inside = [b - a for a, b in runs if begin <= a and b <= end]
        assert end - begin <= max(chunk, *inside, 0) or any(a < begin < b for a, b in runs)


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_any_chunking_gives_the_whole_prompts_logits(models, case):
    model, ref = models[case], reference(case, "two_images")
    ids, images = ref["input_ids"].tolist(), images_of(ref)
    llm = LLM(model, CacheConfig(block_size=4, prefix_caching=False))
    whole = llm.prefill("whole", ids, images)
    np.testing.assert_allclose(whole, ref["logits"][-1], rtol=1e-4, atol=1e-4)
    for chunk in (1, 3, 5, 16, 17, 40):
        np.testing.assert_allclose(llm.prefill(("chunked", chunk), ids, images, chunk_tokens=chunk), whole, **CLOSE)


def other_image(images: list[np.ndarray]) -> list[np.ndarray]:
    """The same sizes (so the same image tokens), other pixels in the first image."""
    return [images[0][::-1].copy(), *images[1:]] if len(images[0]) > 1 else [-images[0], *images[1:]]


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_the_prefix_cache_shares_an_image_only_with_the_same_image(models, case):
    model, ref = models[case], reference(case, "two_images")
    ids, images = ref["input_ids"].tolist(), images_of(ref)
    first_image = model.image_spans(ids)[0][0]
    llm = LLM(model, CacheConfig(block_size=4))
    llm.prefill("first", ids, images)
    hits = llm.stats().prefix_hit_tokens
    again = llm.prefill("same", ids, images)
    assert llm.stats().prefix_hit_tokens - hits == min(len(ids) // 4 * 4, len(ids) - 1)  # every full block
    np.testing.assert_allclose(again, ref["logits"][-1], rtol=1e-4, atol=1e-4)
    hits = llm.stats().prefix_hit_tokens
    changed = other_image(images)
    different = llm.prefill("other", ids, changed)
    assert llm.stats().prefix_hit_tokens - hits == first_image // 4 * 4  # the blocks before the first image only
    fresh = LLM(model, CacheConfig(block_size=4, prefix_caching=False)).prefill("fresh", ids, changed)
    np.testing.assert_allclose(different, fresh, **CLOSE)
    assert not np.allclose(different, again, **CLOSE)


def test_prefix_keys_name_the_pixels():
    tokens, runs = [5, 7, 7, 7, 9], [(1, 4)]
    image = np.ones((1, 3, 2, 2), np.float32)
    keys = prefix_key_ids(tokens, runs, [image])
    assert keys[0] == 5 and keys[4] == 9 and len(set(keys[1:4])) == 1 and keys[1] < 0
    assert prefix_key_ids(tokens, runs, [image.copy()]) == keys
    assert prefix_key_ids(tokens, runs, [image * 2])[1] != keys[1]


def test_a_prefix_hit_inside_a_gemma_image_is_exact(models):
    """A second prompt with the same first image and other text right after it: its cached blocks end inside the
    image. The image's first tokens come from the cache (computed seeing the whole image, the same image); the
    rest are computed seeing them and each other."""
    model, ref = models["gemma3_vision"], reference("gemma3_vision", "two_images")
    ids, images = ref["input_ids"].tolist(), images_of(ref)
    start, end = model.image_spans(ids)[0]
    block = next(b for b in range(3, 8) if end % b and start < end // b * b)  # a block boundary inside the image
    other = ids[: end + 1] + [ids[end + 1] + 1, 30, 31]  # other text right after the image
    llm = LLM(model, CacheConfig(block_size=block))
    llm.prefill("first", ids, images)
    hits = llm.stats().prefix_hit_tokens
    logits = llm.prefill("second", other, images[:1])
    assert llm.stats().prefix_hit_tokens - hits == end // block * block  # the hit stops inside the image
    fresh = LLM(model, CacheConfig(block_size=block, prefix_caching=False)).prefill("fresh", other, images[:1])
    np.testing.assert_allclose(logits, fresh, **CLOSE)


def test_the_engine_batches_requests_with_different_images_as_it_runs_them_alone(models):
    model, ref = models["idefics3"], reference("idefics3", "two_images")
    ids, images = ref["input_ids"].tolist(), images_of(ref)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    engine = Engine(LLMExecutor(LLM(model, CacheConfig(block_size=8)), offload=False), model.tokenizer)
    try:
        alone = [engine.submit(ids, params, imgs).result().completions[0].token_ids for imgs in (images, other_image(images))]
        together = [engine.submit(ids, params, imgs) for imgs in (images, other_image(images))]
        assert [h.result().completions[0].token_ids for h in together] == alone
        assert alone[0] == ref["greedy"][:8].tolist()
        with pytest.raises(ImageError):
            engine.submit(ids, params, images[:1])
        assert not engine.has_work()
    finally:
        engine.close()
