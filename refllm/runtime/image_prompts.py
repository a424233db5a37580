"""What the runtime needs to know about a prompt's images: where they sit, how the prefix cache names them,
and where a prompt may be cut into chunks.

A prompt's images sit in runs of the model's image token (``metadata.image_token_id``;
``refllm/models/image_spans.py``). Three rules follow:

- Prefix-cache keys name the image, not only its tokens: two different images of the same size
  give the same image tokens, and must not share cached blocks. Each image token's key id is
  a stand-in drawn from a digest of its image's pixels (negative, so no token id equals it):
  the same pixels share a cached prefix, anything else does not.
- A model whose image tokens attend to each other (Gemma 3) cannot run part of an image in one
  step and the rest in the next: the first part would never see the rest. A chunk boundary
  that falls inside a run moves out of it: back to the run's start, or, when the run starts the
  chunk, on to its end (so every chunk makes progress), as vLLM schedules whole multimodal items.
- Images are refused, naming the mismatch, unless they fill the prompt's runs exactly
  (``checked_images``), before anything is queued or cached.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from refllm.errors import ImageError
from refllm.models.contract import VisionInfo
from refllm.models.image_spans import check_images, image_token_runs

Run = tuple[int, int]


def image_runs(vision: VisionInfo | None, tokens: Sequence[int]) -> list[Run]:
    """The (start, end) runs of image tokens in a prompt; none for a text-only model (``vision`` None)."""
    return [] if vision is None else image_token_runs(tokens, vision.image_token_id)


def checked_images(vision: VisionInfo | None, tokens: Sequence[int], images: Sequence[np.ndarray] | None) -> list:
    """``images`` for a prompt, refused (ImageError) unless they fill its image runs exactly; a text-only model
    takes none."""
    if vision is None:
        if images:
            raise ImageError(f"this model reads text only; got {len(images)} image(s)")
        return []
    return check_images(images, image_runs(vision, tokens), vision)


def prefix_key_ids(tokens: Sequence[int], runs: list[Run], images: Sequence[np.ndarray]) -> list[int]:
    """The ids the prefix cache keys a prompt by: its token ids, each image token replaced by a stand-in
    naming its image's pixels. Image i of N_i tiles covers the next N_i runs."""
    keys = [int(t) for t in tokens]
    run = 0
    for image in images:
        digest = hashlib.sha256(np.ascontiguousarray(image).tobytes() + str(image.shape).encode()).digest()
        stand_in = -1 - int.from_bytes(digest[:7], "little")  # in [-2^56, -1]: never a token id
        for start, end in runs[run : run + len(image)]:
            keys[start:end] = [stand_in] * (end - start)
        run += len(image)
    return keys


def chunk_ends(start: int, stop: int, chunk_tokens: int, runs: list[Run]) -> list[int]:
    """Where to end each chunk of positions start .. stop - 1, at most ``chunk_tokens`` each, no end inside a run
    (a run longer than ``chunk_tokens`` makes a longer chunk of its own)."""
    ends, position = [], start
    while position < stop:
        end = min(position + chunk_tokens, stop)
        for run_start, run_end in runs:
            if run_start < end < run_end:  # the boundary cuts this run
                end = run_start if run_start > position else run_end
        ends.append(end)
        position = end
    return ends
