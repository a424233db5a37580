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
