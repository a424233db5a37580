"""From patch features to image tokens: fewer, wider vectors than patches.

A vision tower gives one feature of width Dv per patch, on a grid of G x G patches
(P = G * G). The language model would be slow with that many tokens per image, so a
connector merges an s x s neighbourhood of patches into one image token:

Pixel shuffle keeps every number and stacks the neighbourhood's
features side by side, s * s * Dv wide; a projection then maps that to the text width.
The features of token (I, J) are, in this order,

    token[I * (G/s) + J] = concat over dy = 0..s-1, then dx = 0..s-1, of patch[(I*s + dy) * G + (J*s + dx)]

    patches (G = 4, s = 2)          tokens (2 x 2), each 4 * Dv wide
      a b | c d                       [a b e f]  [c d g h]
      e f | g h           ->
      ----+----                       [i j m n]  [k l o p]
      i j | k l
      m n | o p

that is, row by row within the neighbourhood: Hugging Face's ``pixel_shuffle`` (a
view, two permutes and reshapes) gives exactly this order, and the projection's
columns were trained on it.

Average pooling averages the neighbourhood instead, keeping the width Dv:

    token[I * (G/s) + J] = mean over dy, dx of patch[(I*s + dy) * G + (J*s + dx)]
"""

from __future__ import annotations

import numpy as np


def pixel_shuffle(features: np.ndarray, scale: int) -> np.ndarray:
    """features: [N, G * G, Dv] -> [N, (G/s)^2, s * s * Dv], each s x s neighbourhood's features in a row."""
    N, P, Dv = features.shape
    G, s = _grid_side(P), scale
    grid = features.reshape(N, G // s, s, G // s, s, Dv)  # [N, I, dy, J, dx, Dv]
    return grid.transpose(0, 1, 3, 2, 4, 5).reshape(N, (G // s) ** 2, s * s * Dv)  # [N, (I, J), (dy, dx, Dv)]


def average_pool(features: np.ndarray, scale: int) -> np.ndarray:
    """features: [N, G * G, Dv] -> [N, (G/s)^2, Dv], the mean of each s x s neighbourhood."""
    N, P, Dv = features.shape
    G, s = _grid_side(P), scale
    grid = features.reshape(N, G // s, s, G // s, s, Dv)  # [N, I, dy, J, dx, Dv]
    return grid.mean(axis=(2, 4)).reshape(N, (G // s) ** 2, Dv)


def _grid_side(num_patches: int) -> int:
    side = int(round(np.sqrt(num_patches)))
    if side * side != num_patches:
        raise ValueError(f"{num_patches} patches do not form a square grid")
    return side
