"""The oracle kit's image half: drawn vision-language checkpoints and prompts, its properties, its golden files.

refllm's fast path (paged arena, Numba kernels), fed in chunks, passes every property against the spec;
backends with one mechanism wrong fail them; golden files carry their images and round-trip.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.models.multimodal import VisionLanguageModel
from refllm.testing.golden import Golden, GoldenFormatError, check
from refllm.testing.vision import (
    check_image_embeddings,
    check_image_logits,
    check_pixels,
    image_prompts,
    random_vision_checkpoint,
    vision_checkpoints,
)
from refllm.testing.vision_golden import check_vision_golden, dump_vision_golden

SETTINGS = settings(max_examples=12, deadline=None)


def fast(checkpoint) -> VisionLanguageModel:
    """refllm's laptop path: fast ops, the paged arena (the kit's default cache for a backend)."""
    return VisionLanguageModel.load(checkpoint.source(), checkpoint.multimodal, reference=False)


@SETTINGS
@given(checkpoint=vision_checkpoints(), data=st.data(), chunk=st.none() | st.integers(1, 12))
def test_refllms_fast_path_passes_the_image_properties(checkpoint, data, chunk):
    reference = checkpoint.reference()
    tokens, images = data.draw(image_prompts(checkpoint.multimodal, checkpoint.config.vocab_size))
    backend = fast(checkpoint)
    check_image_embeddings(backend, reference, tokens, images)
    check_image_logits(backend, reference, tokens, images, chunk)


class SeesNoOtherImageToken(VisionLanguageModel):
    """Gemma 3's image tokens attending causally only: the image spans dropped."""

    def prefill_all_logits(self, x, cache, pos, image_spans=None):
        return super().prefill_all_logits(x, cache, pos)


class FeaturesOneTileLate(VisionLanguageModel):
    """Each image's features spliced into the runs rotated by one tile."""

    def image_features(self, pixels):
        return np.roll(super().image_features(pixels), 1, axis=0)


def test_the_properties_catch_a_wrong_backend():
    gemma = random_vision_checkpoint(_config("gemma3"), seed=3)
    tokens, images = _prompt(gemma, tiles=(2, 1))
    wrong = SeesNoOtherImageToken.load(gemma.source(), gemma.multimodal, reference=True)
    with pytest.raises(AssertionError, match="logits differ"):
        check_image_logits(wrong, gemma.reference(), tokens, images)
    late = FeaturesOneTileLate.load(gemma.source(), gemma.multimodal, reference=True)
    with pytest.raises(AssertionError, match="an image token"):
        check_image_embeddings(late, gemma.reference(), tokens, images)


def _config(family: str) -> dict:
    from refllm.testing.configs import tiny_config_json

    vision = dict(hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                  patch_size=2, layer_norm_eps=1e-6)  # fmt: skip
    text = tiny_config_json("llama" if family == "idefics3" else "gemma3_text", sliding_window=3)
    if family == "idefics3":
        return dict(model_type="idefics3", text_config=text, vision_config=vision, scale_factor=2,
                    image_token_id=text["vocab_size"] - 1)  # fmt: skip
    return dict(model_type="gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4,
                image_token_index=text["vocab_size"] - 1)  # fmt: skip


def _prompt(checkpoint, tiles: tuple[int, ...]) -> tuple[list[int], list[np.ndarray]]:
    m = checkpoint.multimodal
    rng = np.random.default_rng(0)
    tokens, images = [5, 6], []
    for count in tiles:
        for _ in range(count):
            tokens += [m.image_token_id] * m.tokens_per_image + [7]
        images.append(rng.uniform(-1, 1, (count, 3, m.vision.image_size, m.vision.image_size)).astype(np.float32))
    return tokens + [8, 9], images


@pytest.mark.parametrize("family", ["idefics3", "gemma3"])
def test_golden_files_carry_their_images(family, tmp_path):
    checkpoint = random_vision_checkpoint(_config(family), seed=5)
    prompts = [_prompt(checkpoint, (1, 2)), _prompt(checkpoint, ()), _prompt(checkpoint, (3,))]
    path = tmp_path / "golden.safetensors"
    dump_vision_golden(checkpoint, prompts, path)
    golden = Golden.load(path)
    assert np.array_equal(golden.require(0, "image.1"), prompts[0][1][1])
    ok, lines = check_vision_golden(path, fast(checkpoint))
    assert ok, lines
    ok, lines = check_vision_golden(path, FeaturesOneTileLate.load(checkpoint.source(), checkpoint.multimodal))
    assert not ok and "FAIL" in lines[0] and lines[1].endswith("agrees")  # the text-only prompt still agrees
    with pytest.raises(GoldenFormatError, match="carries images"):
        check(golden, None)


def test_check_pixels_counts_levels():
    pixels = np.zeros((1, 3, 4, 4), np.float32)
    check_pixels(pixels, pixels)
    nudged = pixels + np.float32(2 / 255)  # one level of 255, after normalising by std 0.5
    check_pixels(nudged, pixels, levels=1)
    with pytest.raises(AssertionError, match="1.00 levels"):
        check_pixels(nudged, pixels)
