"""Resizing an 8-bit image the way Pillow does, in NumPy: the image processors' resampling.

Hugging Face's image processors resize with Pillow (``Image.resize``), on the 8-bit
image, before anything is rescaled. Pillow resamples separably, along each row and
along each column, each pass a weighted sum of input pixels:

    out[o] = sum_k w[o, k] * in[first[o] + k]

For output pixel o of ``out_size`` from ``in_size`` pixels (scale = in_size / out_size),
the filter is centred on the input coordinate ``center = (o + 0.5) * scale``, widened by
the scale when shrinking (so every input pixel still counts):

    stretch   = max(scale, 1)
    support   = filter_support * stretch                    (reach of the filter, input pixels)
    first[o]  = max(0, int(center - support + 0.5))       last = min(in_size, int(center + support + 0.5))
    w[o, k]   = filter((first[o] + k - center + 0.5) * (1 / stretch)), normalised to sum to 1 over k

Then, as Pillow does for 8-bit images, each weight becomes a fixed-point integer of 22
fractional bits (rounded half away from zero), each sum starts at half a unit and is
shifted back and clipped to 0 .. 255:

    W[o, k] = round(w[o, k] * 2^22)        out[o] = clip((2^21 + sum_k W[o, k] * in[first[o] + k]) >> 22, 0, 255)

so a pass rounds to the nearest level. The first pass ends in 8 bits before the second
reads it, so the order of the passes matters. Pillow (from version 13) runs the column
pass first when the height loses more than twice as many pixels as the width does, and
the row pass first otherwise (``column_pass_first``); so does this module.

Filters (Pillow's numbering, which ``preprocessor_config.json``'s ``resample`` uses):
box (4), bilinear (2, a triangle), hamming (5), bicubic (3, a = -0.5) and lanczos (1,
a windowed sinc of 3 lobes). Only the filter weights are computed in floating point
(float64, with NumPy's sine, which need not round as the C library's does); the sums are
integer arithmetic, so the result equals Pillow's unless a weight lands within a rounding
of a tie, which moves one output level by 1.
"""

from __future__ import annotations

import numpy as np

PRECISION_BITS = 22  # Pillow's fixed-point weights: 32 bits less 8 for the pixel and 2 spare


def _box(x: np.ndarray) -> np.ndarray:
    return ((x > -0.5) & (x <= 0.5)).astype(np.float64)


def _bilinear(x: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(x))


def _hamming(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    turned = np.pi * np.where(x == 0, 1.0, x)
    # Pillow writes the window's constants as C floats (0.54f, 0.46f): their float32 values, not 0.54 and 0.46
    window = np.sin(turned) / turned * (float(np.float32(0.54)) + float(np.float32(0.46)) * np.cos(turned))
    return np.where(x == 0, 1.0, np.where(x >= 1, 0.0, window))


def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _sinc(x: np.ndarray) -> np.ndarray:
    turned = np.pi * np.where(x == 0, 1.0, x)
    return np.where(x == 0, 1.0, np.sin(turned) / turned)


def _lanczos(x: np.ndarray) -> np.ndarray:
    return np.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)


# Pillow's filter number -> (name, filter, support in input pixels at scale 1)
FILTERS = {
    4: ("box", _box, 0.5),
    2: ("bilinear", _bilinear, 1.0),
    5: ("hamming", _hamming, 1.0),
    3: ("bicubic", _bicubic, 2.0),
    1: ("lanczos", _lanczos, 3.0),
}


def resample_weights(in_size: int, out_size: int, resample: int) -> tuple[np.ndarray, np.ndarray]:
    """-> (first [out_size] int: the first input pixel of each output, W [out_size, K] int64 fixed-point weights;
    a window that would pass the image's edge has zero weights there)."""
    _, kernel, filter_support = FILTERS[resample]
    scale = in_size / out_size
    stretch = max(scale, 1.0)
    support = filter_support * stretch
    width = int(np.ceil(support)) * 2 + 1  # the most input pixels one output reads
    center = (np.arange(out_size) + 0.5) * scale  # [O]
    first = np.maximum(0, (center - support + 0.5).astype(np.int64))  # int(): towards zero, as C's cast
    last = np.minimum(in_size, (center + support + 0.5).astype(np.int64))
    taps = np.arange(width)  # [K]
    inside = taps[None, :] < (last - first)[:, None]  # [O, K]
    shrink = 1.0 / stretch  # multiplied, not divided: Pillow's rounding
    weights = np.where(inside, kernel((first[:, None] + taps[None, :] - center[:, None] + 0.5) * shrink), 0.0)
    totals = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, totals, out=weights, where=totals != 0)
    scaled = weights * (1 << PRECISION_BITS)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))  # half away from zero
    return first, fixed.astype(np.int64)


def _pass(image: np.ndarray, out_size: int, resample: int, axis: int) -> np.ndarray:
    """Resample one axis of a uint8 image [H, W, C] -> uint8, the other axes as they were."""
    in_size = image.shape[axis]
    first, weights = resample_weights(in_size, out_size, resample)
    taps = np.minimum(first[:, None] + np.arange(weights.shape[1])[None, :], in_size - 1)  # [O, K]: zero-weight taps
    moved = np.moveaxis(image, axis, 0).astype(np.int64)  # [in, ...]
    sums = np.einsum("ok,ok...->o...", weights, moved[taps]) + (1 << (PRECISION_BITS - 1))
    out = np.clip(sums >> PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def column_pass_first(in_height: int, in_width: int, height: int, width: int) -> bool:
    """Pillow's order of the passes (version 13 on): columns first when the height loses more than twice
    as many pixels as the width does: H - height > 0 and H - height > 2 * (W - width)."""
    return in_height - height > 0 and in_height - height > 2 * (in_width - width)


def resize(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """image: uint8 [H, W, C] -> uint8 [height, width, C]: Pillow's ``Image.resize((width, height), resample)``.

    Rows first, then columns, unless ``column_pass_first``; an axis whose size does not change is left
    alone (its weights would be the identity)."""
    if resample not in FILTERS:
        raise ValueError(f"resample filter {resample} is not one of Pillow's {sorted(FILTERS)}")
    passes = [(width, 1), (height, 0)]  # (size, axis): the row pass resizes axis 1, the width
    if column_pass_first(image.shape[0], image.shape[1], height, width):
        passes.reverse()
    for size, axis in passes:
        if size != image.shape[axis]:
            image = _pass(image, size, resample, axis)
    return image
