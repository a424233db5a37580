"""float64 truth covers the vision tower: refllm's float64 path against an independent float64 forward.

``tests/helpers/float64_vision_reference.py`` computes SmolVLM's and Gemma 3's logits from the
checkpoint's bytes with its own tower, connector and whole-sequence text model (Gemma 3's
image tokens seeing each other by an explicit rule); refllm's float64 model, fed the same
pixels, agrees to 1e-9 of the largest logit. A float32 tower would not: the test shows the
bound sees it.
"""

from __future__ import annotations

import numpy as np
import pytest

import refllm
from refllm import CacheConfig
from tests.helpers.float64_vision_reference import reference_logits
from tests.helpers.hf_vision_fixtures import images_of, reference
from tests.helpers.paths import HF_DATA

TRUTH = 1e-9  # of the largest logit


def float64_logits(model, ref: dict, chunks: list[int] | None = None) -> np.ndarray:
    ids = ref["input_ids"][None]
    x = model.embed_multimodal(ids, [image.astype(np.float64) for image in images_of(ref)])
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    return model.prefill_all_logits(x, cache, range(ids.shape[1]), image_spans=[model.image_spans(ids[0])])[0]


@pytest.mark.slow
@pytest.mark.parametrize("case, scenario", [("idefics3", "tall"), ("gemma3_vision", "two_images")])
def test_float64_logits_agree_with_the_independent_forward(case, scenario):
    ref = reference(case, scenario)
    truth = reference_logits(HF_DATA / case, ref["input_ids"].tolist(), ref["pixel_values"])
    model = refllm.load_model(HF_DATA / case, dtype="float64")
    got = float64_logits(model, ref)
    scale = np.abs(truth).max(axis=-1, keepdims=True)
    assert (np.abs(got - truth) / scale).max() < TRUTH
    float32 = refllm.load_model(HF_DATA / case, reference=True)
    ids = ref["input_ids"][None]
    x = float32.embed_multimodal(ids, images_of(ref))
    cache = float32.create_kv_cache(CacheConfig(kind="contiguous"))
    rounded = float32.prefill_all_logits(x, cache, range(ids.shape[1]), image_spans=[float32.image_spans(ids[0])])[0]
    assert (np.abs(rounded - truth) / scale).max() > 100 * TRUTH  # float32's rounding is far outside the bound
