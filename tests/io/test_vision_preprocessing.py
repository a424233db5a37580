"""Images to pixels and prompts, against Pillow and transformers' processors.

refllm resizes with Pillow's algorithm written in NumPy (``refllm/nn/resample.py``): two
passes, each rounded to 8 bits, in the order Pillow 13 chooses (``column_pass_first``). That
equals, bit for bit, Pillow doing the two passes itself (any version) and Pillow's own
``resize`` from 13 on. Older Pillows run the row pass first whatever the shape, which rounds
differently for some shapes: the bounds below are stated for that case (docs/layers/vision.md).
The processors' arithmetic around the resizes (sizes, tiles, crops, rescale, normalise) and the
prompt expansion are compared exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm.io.images import read_image
from refllm.io.vision_prompt import encode_chat
from refllm.nn.resample import FILTERS, column_pass_first, resize
from tests.helpers.hf_vision_fixtures import SCENARIOS, messages, reference
from tests.helpers.paths import HF_DATA

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

PILLOW_ORDERS_PASSES = int(PIL.__version__.split(".")[0]) >= 13  # the order refllm follows (column_pass_first)
# Pixel levels (of 255) by which refllm's pixels may differ from the processors' where an older Pillow runs the
# row pass first regardless: bilinear (Gemma 3) can only round one level the other way; lanczos (SmolVLM)
# rings, and was measured at 4 levels at most over 250 images of gradients and noise; 8 is stated.
LEVELS = {"bilinear": 1, "lanczos": 8}
SETTINGS = settings(max_examples=30, deadline=None)


def natural(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Gradients and a ripple under mild noise: what photos look like to a resampler."""
    y, x = np.mgrid[0:height, 0:width]
    channels = [255 * x / width, 255 * y / height, 127 + 100 * np.sin(x / 3.0 + y / 5.0)]
    return np.clip(np.stack(channels, -1) + rng.normal(0, 10, (height, width, 3)), 0, 255).astype(np.uint8)


@SETTINGS
@given(h=st.integers(1, 90), w=st.integers(1, 90), oh=st.integers(1, 120), ow=st.integers(1, 120),
       resample=st.sampled_from(sorted(FILTERS)), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_resize_is_pillows_two_passes_in_pillows_order(h, w, oh, ow, resample, seed):
    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)  # noise: the hardest case
    passes = [((ow, h), (ow, oh)), ((w, oh), (ow, oh))][column_pass_first(h, w, oh, ow)]
    expected = Image.fromarray(image)
    for size in passes:
        expected = expected.resize(size, resample=resample)
    assert np.array_equal(resize(image, oh, ow, resample), np.array(expected))


@SETTINGS
@given(h=st.integers(1, 90), w=st.integers(1, 90), oh=st.integers(1, 120), ow=st.integers(1, 120),
       resample=st.sampled_from(sorted(FILTERS)), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_resize_equals_pillows_own(h, w, oh, ow, resample, seed):
    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = np.array(Image.fromarray(image).resize((ow, oh), resample=resample)).astype(int)
    difference = np.abs(resize(image, oh, ow, resample) - expected)
    if PILLOW_ORDERS_PASSES or not column_pass_first(h, w, oh, ow):
        assert difference.max() == 0
    elif resample in (2, 4):  # bilinear and box: weights >= 0, so the orders differ by one rounding at most
        assert difference.max() <= 1


def hf_processor(case: str):
    """transformers' PIL-backend image processor with the fixture's settings."""
    pytest.importorskip("transformers")
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    if case == "idefics3":
        return Idefics3ImageProcessorPil(size={"longest_edge": 108}, max_image_size={"longest_edge": 36})
    return Gemma3ImageProcessorPil(size={"height": 36, "width": 36}, resample=2, pan_and_scan_min_crop_size=8,
                                   pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2)  # fmt: skip


PROCESSORS = {case: refllm.load_model(HF_DATA / case).image_processor for case in SCENARIOS}


def processor(case: str, options: dict):
    """The fixture's image processor, with pan and scan when the scenario asks (Gemma 3's only option)."""
    if options.get("do_pan_and_scan"):
        return dataclasses.replace(PROCESSORS[case], pan_and_scan=True)
    return PROCESSORS[case]


def assert_pixels_close(ours: np.ndarray, theirs: np.ndarray, levels: int) -> None:
    """Normalised pixels ((x / 255 - 0.5) / 0.5) equal, or within ``levels`` of 255 under a Pillow older than 13
    (whose passes run rows first whatever the shape)."""
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    allowed = 0 if PILLOW_ORDERS_PASSES else levels * 2 / 255 + 1e-6
    assert np.abs(ours - theirs).max() <= allowed


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_the_fixtures_images_give_transformers_pixel_values(case):
    for scenario, (content, options) in SCENARIOS[case].items():
        ref = reference(case, scenario)
        if "pixel_values" not in ref:
            continue
        ours = np.concatenate([processor(case, options)(read_image(HF_DATA / case / "images" / c)).pixels
                               for c in content if c.endswith(".png")])  # fmt: skip
        assert_pixels_close(ours, ref["pixel_values"], LEVELS["lanczos" if case == "idefics3" else "bilinear"])


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_prompts_expand_and_tokenize_as_transformers_processors(case):
    tokenizer = refllm.load_model(HF_DATA / case).tokenizer
    for scenario, (content, options) in SCENARIOS[case].items():
        images = [read_image(HF_DATA / case / "images" / c) for c in content if c.endswith(".png")]
        ids, pixels = encode_chat(tokenizer, processor(case, options), messages(content), images)
        assert ids == reference(case, scenario)["input_ids"].tolist()
        assert [len(p) for p in pixels] == reference(case, scenario).get("tiles_per_image", np.array([])).tolist()


@settings(max_examples=12, deadline=None)
@given(h=st.integers(2, 260), w=st.integers(2, 260), mode=st.sampled_from(["RGB", "L", "RGBA", "P"]),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_drawn_images_give_transformers_pixel_values(h, w, mode, seed):
    import io

    rgb = natural(np.random.default_rng(seed), h, w)
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(buffer, format="PNG")
    from refllm.io.images import decode_image

    decoded = decode_image(buffer.getvalue())
    pil = Image.open(io.BytesIO(buffer.getvalue()))
    for case, options in (("idefics3", {}), ("gemma3_vision", {}), ("gemma3_vision", {"do_pan_and_scan": True})):
        ours = processor(case, options)(decoded).pixels
        theirs = hf_processor(case)(images=[[pil]] if case == "idefics3" else [pil], **options)
        theirs = np.asarray(theirs["pixel_values"][0] if case == "idefics3" else theirs["pixel_values"])
        assert_pixels_close(ours, theirs, LEVELS["lanczos" if case == "idefics3" else "bilinear"])


def test_decoding_refuses_what_is_not_an_image_or_too_large(tmp_path):
    import io

    from refllm.errors import ImageError
    from refllm.io.images import decode_data_url, decode_image

    buffer = io.BytesIO()
    Image.new("RGB", (300, 200)).save(buffer, format="PNG")
    png = buffer.getvalue()
    assert decode_image(png).shape == (200, 300, 3)
    with pytest.raises(ImageError, match="at most 50000 pixels"):
        decode_image(png, max_pixels=50_000)
    with pytest.raises(ImageError, match="at most 100 are accepted"):
        decode_image(png, max_bytes=100)
    with pytest.raises(ImageError, match="not an image"):
        decode_image(b"GIF89a but not really")
    with pytest.raises(ImageError, match="cannot be decoded"):
        decode_image(png[: len(png) // 2])
    with pytest.raises(ImageError, match="not fetched"):
        decode_data_url("https://example.com/image.png")
