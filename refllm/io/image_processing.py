"""Images to pixel batches and prompt text, as the Hugging Face processors make them, in NumPy.

An image processor turns an 8-bit RGB image [H, W, 3] (``refllm/io/images.py``) into a
``PixelBatch``: the float32 pixels [N, 3, S, S] the vision tower reads, and the text that
stands for the image in the prompt (its runs of image tokens and their markers).

SmolVLM (``Idefics3Processor``), with S = max_image_size:

    resize so the longest edge is ``size`` (the other edge in proportion, rounded up to even)
    resize up to whole multiples of S (height and width)       -> rows x cols tiles of S x S
    tiles in row-major order, then the whole image resized to S x S (the global image)
    -> N = rows * cols + 1 (or 1, the image alone resized to S x S, when it fits in one tile)

    prompt: <fake_token_around_image><row_1_col_1><image>*L ... per tile, "\\n" after each row,
            "\\n<fake_token_around_image><global-img><image>*L<fake_token_around_image>"

Gemma 3 (``Gemma3Processor``): the image resized to S x S; with pan and scan, a wide or tall
image also cut into 2 .. max crops along its long side, each resized to S x S after it.

    prompt: "\\n\\n<start_of_image><image_soft_token>*L<end_of_image>\\n\\n" per image (and crop)

Then both rescale by 1/255 (in float64, stored as float32) and normalise each channel,
(x - mean) / std in float32, as transformers does. Resizing is Pillow's algorithm
(``refllm/nn/resample.py``); see docs/layers/vision.md for where it can differ from the
Pillow a transformers install runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from refllm.errors import ImageError
from refllm.nn.resample import FILTERS, resize

MAX_IMAGE_SIZE = 4096  # transformers' Idefics3 bound on the resized image's longest edge
LANCZOS, BILINEAR = 1, 2


@dataclass(frozen=True)
class PixelBatch:
    """One image, ready for the model: its tiles (or crops) and the text that stands for it in the prompt."""

    pixels: np.ndarray  # [N, 3, S, S] float32
    prompt: str


@dataclass(frozen=True)
class Normalization:
    rescale_factor: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """uint8 [h, w, 3] -> float32 [3, h, w]: x * factor (in float64, then float32), then (x - mean) / std."""
        scaled = (image.astype(np.float64) * self.rescale_factor).astype(np.float32)
        normed = (scaled - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return normed.transpose(2, 0, 1)


@dataclass(frozen=True)
class Idefics3ImageProcessor:
    """SmolVLM's: tiles of ``tile`` x ``tile`` and a global image; ``tokens`` image tokens per tile."""

    tile: int  # max_image_size's longest_edge: the vision tower's image size
    tokens: int  # image_seq_len
    longest_edge: int = 4 * 364  # size's longest_edge
    resample: int = LANCZOS
    split: bool = True  # do_image_splitting
    normalize: Normalization = Normalization()
    placeholder: str = "<image>"  # what the chat template writes for an image

    def __call__(self, image: np.ndarray) -> PixelBatch:
        height, width = _rescaled_to_longest(*image.shape[:2], self.longest_edge)
        image = resize(image, height, width, self.resample)
        if not self.split:
            return self._batch([resize(image, self.tile, self.tile, self.resample)], 0, 0)
        height, width = _multiples_of(*image.shape[:2], self.tile)
        image = resize(image, height, width, self.resample)
        if height <= self.tile and width <= self.tile:
            return self._batch([image], 0, 0)
        rows, cols = height // self.tile, width // self.tile
        t = self.tile
        tiles = [image[r * t : (r + 1) * t, c * t : (c + 1) * t] for r in range(rows) for c in range(cols)]
        return self._batch([*tiles, resize(image, t, t, self.resample)], rows, cols)

    def _batch(self, frames: list[np.ndarray], rows: int, cols: int) -> PixelBatch:
        pixels = np.stack([self.normalize(frame) for frame in frames])
        image = "<image>" * self.tokens
        whole = f"<fake_token_around_image><global-img>{image}<fake_token_around_image>"
        if rows == 0:
            return PixelBatch(pixels, whole)
        grid = "".join(
            "".join(f"<fake_token_around_image><row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n"
            for r in range(rows)
        )
        return PixelBatch(pixels, grid + "\n" + whole)


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    """Gemma 3's: the image (and with ``pan_and_scan`` its crops) resized to ``size`` x ``size``."""

    size: int
    tokens: int  # image_seq_length: mm_tokens_per_image
    resample: int = BILINEAR
    pan_and_scan: bool = False
    min_crop_size: int = 256
    max_crops: int = 4
    min_ratio: float = 1.2  # pan and scan only past this aspect ratio
    normalize: Normalization = Normalization()
    placeholder: str = "<start_of_image>"
    image_token: str = "<image_soft_token>"
    end_token: str = "<end_of_image>"

    def __call__(self, image: np.ndarray) -> PixelBatch:
        frames = [image, *(self._crops(image) if self.pan_and_scan else [])]
        pixels = np.stack([self.normalize(resize(frame, self.size, self.size, self.resample)) for frame in frames])
        one = f"\n\n{self.placeholder}{self.image_token * self.tokens}{self.end_token}\n\n"
        if len(frames) == 1:
            return PixelBatch(pixels, one)
        crops = " ".join([one] * (len(frames) - 1))
        return PixelBatch(pixels, f"Here is the original image {one} and here are some crops to help you see better {crops}")

    def _crops(self, image: np.ndarray) -> list[np.ndarray]:
        """Crops along the long side of an image whose aspect ratio passes ``min_ratio``, as transformers cuts."""
        height, width = image.shape[:2]
        long, short = max(width, height), min(width, height)
        if long / short < self.min_ratio:
            return []
        count = min(int(math.floor(long / short + 0.5)), int(math.floor(long / self.min_crop_size)))
        count = min(self.max_crops, max(2, count))
        across, down = (count, 1) if width >= height else (1, count)
        crop_w, crop_h = math.ceil(width / across), math.ceil(height / down)
        if min(crop_w, crop_h) < self.min_crop_size:
            return []
        return [image[r * crop_h : (r + 1) * crop_h, c * crop_w : (c + 1) * crop_w]
                for r in range(down) for c in range(across)]  # fmt: skip


def expand_prompt(text: str, placeholder: str, batches: list[PixelBatch]) -> str:
    """Replace each ``placeholder`` the chat template wrote, in order, by its image's prompt text."""
    pieces = text.split(placeholder)
    if len(pieces) - 1 != len(batches):
        raise ImageError(f"the prompt has {len(pieces) - 1} image place(s) ({placeholder}) for {len(batches)} image(s)")
    out = [pieces[0]]
    for batch, piece in zip(batches, pieces[1:]):
        out += [batch.prompt, piece]
    return "".join(out)


def _rescaled_to_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """transformers' Idefics3 size: the longest edge set to ``longest``, the other in proportion (int(), then up
    to even), both at least 1; then scaled below MAX_IMAGE_SIZE if still past it."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    if max(height, width) > MAX_IMAGE_SIZE:
        aspect = width / height
        if width >= height:
            width, height = MAX_IMAGE_SIZE, max(int(MAX_IMAGE_SIZE / aspect), 1)
        else:
            height, width = MAX_IMAGE_SIZE, max(int(MAX_IMAGE_SIZE * aspect), 1)
    return height, width


def _multiples_of(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' ``resize_for_vision_encoder``: the long side up to a multiple of ``tile``, the short one in
    proportion and then up to a multiple too."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def check_resample(resample: int, where: str) -> int:
    if resample not in FILTERS:
        raise ImageError(f"{where}: resample {resample!r} is not one of Pillow's filters {sorted(FILTERS)}")
    return resample


def load_image_processor(directory, model_type: str, tokens_per_image: int, image_size: int):
    """The image processor of a model directory (``preprocessor_config.json`` and ``processor_config.json``,
    or transformers 5's ``processor_config.json`` alone, its image processor nested), or None without them.

    A setting the files leave out (or null) takes transformers' default for the processor."""
    from pathlib import Path

    from refllm.io.json_file import read_json_object

    directory = Path(directory)
    files = [directory / name for name in ("processor_config.json", "preprocessor_config.json")]
    processor, image = ({} if not f.is_file() else read_json_object(f, ImageError) for f in files)
    if not processor and not image:
        return None
    nested = processor.get("image_processor")
    settings = {k: v for k, v in (nested if isinstance(nested, dict) else image).items() if v is not None}
    where = str(files[0] if isinstance(nested, dict) else files[1])
    normalize = Normalization(
        float(settings.get("rescale_factor", 1 / 255)) if settings.get("do_rescale", True) else 1.0,
        tuple(settings.get("image_mean", (0.5,) * 3)) if settings.get("do_normalize", True) else (0.0,) * 3,
        tuple(settings.get("image_std", (0.5,) * 3)) if settings.get("do_normalize", True) else (1.0,) * 3,
    )
    if model_type == "idefics3":
        tokens = processor.get("image_seq_len", tokens_per_image)
        tile = _size(settings.get("max_image_size", {}), "longest_edge", image_size, where)
        if tokens != tokens_per_image or tile != image_size:
            raise ImageError(
                f"{where}: {tokens} image tokens of {tile} pixels per tile, but the model makes {tokens_per_image}"
                f" of {image_size}"
            )
        return Idefics3ImageProcessor(
            tile, tokens, _size(settings.get("size", {}), "longest_edge", 4 * 364, where),
            check_resample(settings.get("resample", LANCZOS), where), bool(settings.get("do_image_splitting", True)),
            normalize,
        )  # fmt: skip
    tokens = processor.get("image_seq_length", tokens_per_image)
    size = settings.get("size", {})
    side = _size(size, "height", image_size, where)
    if tokens != tokens_per_image or side != image_size or _size(size, "width", side, where) != side:
        raise ImageError(f"{where}: images of {size} in {tokens} tokens, but the model reads {image_size} in"
                         f" {tokens_per_image}")  # fmt: skip
    return Gemma3ImageProcessor(
        side, tokens, check_resample(settings.get("resample", BILINEAR), where),
        bool(settings.get("do_pan_and_scan", False)), int(settings.get("pan_and_scan_min_crop_size", 256)),
        int(settings.get("pan_and_scan_max_num_crops", 4)),
        float(settings.get("pan_and_scan_min_ratio_to_activate", 1.2)), normalize,
    )  # fmt: skip


def _size(settings, key: str, default: int, where: str) -> int:
    value = settings.get(key, default) if isinstance(settings, dict) else default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IMAGE_SIZE:
        raise ImageError(f"{where}: {key} must be a size in pixels up to {MAX_IMAGE_SIZE}; got {value!r:.40}")
    return value
