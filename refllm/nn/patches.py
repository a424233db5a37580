"""From pixels to patch embeddings: the first step of a vision transformer.

Shapes: N images of C channels, H x W pixels, cut into patches of Z x Z pixels on a
grid of Gh x Gw = (H // Z) x (W // Z) patches; P = Gh * Gw patches per image; Dv the
vision tower's width.

Patch embedding. Each patch, flattened in (channel, row, column) order, is one row of
an unfolded image; one matrix multiply embeds every patch at once:

    patches[n, i * Gw + j] = pixels[n, :, i*Z : (i+1)*Z, j*Z : (j+1)*Z].reshape(C * Z * Z)
    embedding[n, p]        = W.reshape(Dv, C * Z * Z) @ patches[n, p] + b

which is exactly the strided convolution the checkpoints store (kernel Z, stride Z, no
padding; W [Dv, C, Z, Z]):

    out[n, d, i, j] = b[d] + sum_{c, y, x} W[d, c, y, x] * pixels[n, c, i*Z + y, j*Z + x]

Pixels past the last whole patch (H or W not a multiple of Z) are dropped, as the
convolution drops them.

Position embeddings. The tower learns one vector per cell of an S x S grid (S = image_size
// Z) and adds it to the patch in that cell. An image of Gh x Gw patches with Gh = Gw = S
reads the table in order. Some towers also take images whose real content covers
only nh x nw patches of the grid (the rest padding, masked out): patch (i, j) then takes
the cell its fractional position falls into,

    position_id(i, j) = floor(i * S / nh) * S + floor(j * S / nw)

so a small image still spans the whole learned grid.
"""

from __future__ import annotations

import numpy as np

from refllm.nn.linear import linear


def unfold_patches(pixels: np.ndarray, patch_size: int) -> np.ndarray:
    """pixels: [N, C, H, W] -> [N, Gh * Gw, C * Z * Z], patches in row-major grid order."""
    N, C, H, W = pixels.shape
    Z = patch_size
    Gh, Gw = H // Z, W // Z
    grid = pixels[:, :, : Gh * Z, : Gw * Z].reshape(N, C, Gh, Z, Gw, Z)  # [N, C, i, y, j, x]
    return grid.transpose(0, 2, 4, 1, 3, 5).reshape(N, Gh * Gw, C * Z * Z)  # [N, (i, j), (c, y, x)]


def patch_embedding(pixels: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """pixels: [N, C, H, W], weight: [Dv, C, Z, Z] (a convolution's), bias: [Dv] -> [N, P, Dv]."""
    patch_size = weight.shape[-1]
    return linear(unfold_patches(pixels, patch_size), weight.reshape(weight.shape[0], -1), bias)


def patch_position_ids(patch_mask: np.ndarray, grid_side: int) -> np.ndarray:
    """patch_mask: [N, Gh, Gw] bool (True where a patch holds image content, a top-left nh x nw block)
    -> position ids [N, Gh * Gw] into the S x S table (S = grid_side); masked patches get 0.

    A full S x S mask gives 0 .. S*S - 1 in order. (transformers computes the same cells with float32
    fractions and ``torch.bucketize``, which for a few grid sides, S = 19 the smallest, rounds a fraction
    i / nh that equals a cell boundary down into the cell before; no released tower's grid is among them:
    tests/nn/test_vision_spec.py lists them.)"""
    N, Gh, Gw = patch_mask.shape
    rows = patch_mask[:, :, 0].sum(axis=1)  # [N] nh: rows of real patches
    cols = patch_mask[:, 0, :].sum(axis=1)  # [N] nw
    i = np.arange(Gh)[None, :] * grid_side // np.maximum(rows, 1)[:, None]  # [N, Gh] the cell row of patch row i
    j = np.arange(Gw)[None, :] * grid_side // np.maximum(cols, 1)[:, None]  # [N, Gw]
    ids = i[:, :, None] * grid_side + j[:, None, :]  # [N, Gh, Gw]
    return np.where(patch_mask, ids, 0).reshape(N, Gh * Gw)


def position_embedding(patch_mask: np.ndarray, table: np.ndarray) -> np.ndarray:
    """patch_mask: [N, Gh, Gw] bool, table: [S * S, Dv] -> the embedding each patch adds, [N, Gh * Gw, Dv]."""
    grid_side = int(round(np.sqrt(table.shape[0])))
    return table[patch_position_ids(patch_mask, grid_side)]
