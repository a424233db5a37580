"""Where a prompt's images sit: the runs of image tokens that vision features replace.

A vision-language prompt holds, for each image, one or more runs of a placeholder token
(SmolVLM: one run per tile, ``<image>`` x 64 with row/column markers between; Gemma 3:
one run of ``<image_soft_token>`` x 256 per image or crop). A run is a span of positions
[start, end): ``embed_multimodal`` puts the image's features there, and Gemma 3's text
model lets the tokens of one span attend to each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refllm.errors import ImageError
from refllm.nn.attention import ImageSpans


def image_token_runs(tokens: Sequence[int] | np.ndarray, image_token_id: int) -> list[tuple[int, int]]:
    """tokens: [T] -> the (start, end) of every maximal run of ``image_token_id``, in order."""
    is_image = np.concatenate([[False], np.asarray(tokens) == image_token_id, [False]])
    edges = np.flatnonzero(is_image[1:] != is_image[:-1])  # starts and ends alternate
    return [(int(start), int(end)) for start, end in zip(edges[::2], edges[1::2])]


def spans_in_step(runs: ImageSpans, start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """The runs that reach into positions start .. stop - 1, refused if one goes on past ``stop``: a step
    that cuts an image whose tokens see each other would leave its first part blind to the rest."""
    inside = tuple((a, b) for a, b in runs if a < stop and b > start)
    for a, b in inside:
        if b > stop:
            raise ImageError(
                f"positions {start}..{stop - 1} end inside the image tokens at {a}..{b - 1}, which attend to each"
                f" other: a step must end before position {a} or at {b} or later"
            )
    return inside


def check_images(images: Sequence[np.ndarray] | None, runs: list[tuple[int, int]], vision) -> list[np.ndarray]:
    """Each image a finite float array [N_i, *vision.image_shape], together filling ``runs`` (each
    ``vision.tokens_per_tile`` long) one tile per run, in order -> the images as a list.

    No images at all is a text prompt: its image tokens, if any, are embedded as the tokens they
    are, as transformers does without pixel values. vision: the model's ``VisionInfo``."""
    images = [] if images is None else list(images)
    if not images:
        return []
    for i, image in enumerate(images):
        ok = isinstance(image, np.ndarray) and np.issubdtype(image.dtype, np.floating) and image.ndim == 4
        if not ok or image.shape[1:] != vision.image_shape or len(image) == 0:
            raise ImageError(
                f"image {i} must be a float array [tiles, {', '.join(map(str, vision.image_shape))}] from the model's"
                f" image processor; got {getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
            )
        if not np.isfinite(image).all():
            raise ImageError(f"image {i} holds values that are not finite")
    tiles = sum(len(image) for image in images)
    if tiles != len(runs):
        raise ImageError(
            f"the prompt holds {len(runs)} runs of image tokens but the {len(images)} image(s) give {tiles}"
            " (one run per tile or crop)"
        )
    for start, end in runs:
        if end - start != vision.tokens_per_tile:
            raise ImageError(
                f"the image tokens at positions {start}..{end - 1} are {end - start}, not {vision.tokens_per_tile} per tile"
            )
    return images
