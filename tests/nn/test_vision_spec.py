"""The vision spec in ``refllm/nn`` against what it claims to equal, and the image-span attention kernel against it.

- patch embedding (an unfold and one matrix multiply) = the strided convolution, as torch computes it and as a loop;
- position ids = transformers' Idefics3 embeddings for every grid the released SigLIP towers use, and where
  transformers' float32 bucketing differs (grid sides such as 19) the difference is the one stated in the docstring;
- pixel shuffle = transformers' Idefics3 connector; average pooling = torch's AvgPool2d; LayerNorm = torch's;
- attention with image spans = the mask spelled out pair by pair; the paged kernel with visible ends = that spec.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.kernels.attention import paged_prefill_attention_to
from refllm.kv.block_attention import visible_ends
from refllm.nn.attention import attention, bidirectional_attention
from refllm.nn.image_tokens import average_pool, pixel_shuffle
from refllm.nn.norm import layer_norm
from refllm.nn.patches import patch_embedding, patch_position_ids
from tests.helpers.paged_attention import ATOL, RTOL, attention_shapes, blocked, kernel_scalars

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(n=st.integers(1, 3), c=st.integers(1, 4), z=st.integers(1, 6), gh=st.integers(1, 5), gw=st.integers(1, 5),
       extra=st.integers(0, 5), d=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_patch_embedding_is_the_strided_convolution(n, c, z, gh, gw, extra, d, seed):
    rng = np.random.default_rng(seed)
    h, w = gh * z + extra % z, gw * z + extra // 2 % z  # pixels past the last whole patch are dropped
    pixels, weight, bias = rng.standard_normal((n, c, h, w)), rng.standard_normal((d, c, z, z)), rng.standard_normal(d)
    got = patch_embedding(pixels, weight, bias)  # [N, P, D]
    for i in range(gh):
        for j in range(gw):
            window = pixels[:, :, i * z : (i + 1) * z, j * z : (j + 1) * z]
            expected = np.einsum("ncyx,dcyx->nd", window, weight) + bias
            np.testing.assert_allclose(got[:, i * gw + j], expected, rtol=1e-12, atol=1e-12)


def test_patch_embedding_equals_torchs_convolution():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    pixels, weight, bias = rng.standard_normal((2, 3, 37, 30)), rng.standard_normal((8, 3, 6, 6)), rng.standard_normal(8)
    conv = torch.nn.functional.conv2d(torch.tensor(pixels), torch.tensor(weight), torch.tensor(bias), stride=6)
    expected = conv.flatten(2).transpose(1, 2).numpy()
    np.testing.assert_allclose(patch_embedding(pixels, weight, bias), expected, rtol=1e-12, atol=1e-12)


def transformers_position_ids(side: int, rows: int, cols: int, max_rows: int, max_cols: int) -> np.ndarray:
    """Idefics3VisionEmbeddings' position ids for one image whose content covers rows x cols patches."""
    import torch
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    config = Idefics3VisionConfig(hidden_size=4, image_size=side, patch_size=1, num_channels=1)
    embeddings = Idefics3VisionEmbeddings(config)
    torch.nn.init.zeros_(embeddings.patch_embedding.weight)
    torch.nn.init.zeros_(embeddings.patch_embedding.bias)
    with torch.no_grad():  # each position's embedding holds its id
        embeddings.position_embedding.weight.copy_(torch.arange(side * side)[:, None].float().expand(-1, 4))
    mask = torch.zeros(1, max_rows, max_cols, dtype=torch.bool)
    mask[0, :rows, :cols] = True
    with torch.no_grad():
        out = embeddings(torch.zeros(1, 1, max_rows, max_cols), mask)[0, :, 0].numpy().round().astype(int)
    return np.where(mask.reshape(-1).numpy(), out, 0)


SIDES = [9, 12, 14, 16, 24, 26, 27, 32, 64]  # the tiny fixtures' grids and every released SigLIP's (224..896 px)


def ids_of(side: int, rows: int, cols: int, max_rows: int, max_cols: int) -> np.ndarray:
    mask = np.zeros((1, max_rows, max_cols), dtype=bool)
    mask[0, :rows, :cols] = True
    return patch_position_ids(mask, side)[0]


@pytest.mark.parametrize("side", SIDES)
def test_position_ids_equal_transformers_for_every_grid_of_the_released_sides(side):
    pytest.importorskip("transformers")
    for rows in range(1, side + 1):
        cols = side + 1 - rows
        assert np.array_equal(ids_of(side, rows, cols, side, side), transformers_position_ids(side, rows, cols, side, side))


def test_position_ids_where_transformers_rounds_a_boundary_down():
    pytest.importorskip("transformers")
    ours, theirs = ids_of(19, 19, 19, 19, 19), transformers_position_ids(19, 19, 19, 19, 19)
    differ = np.flatnonzero(ours != theirs)
    assert ours.tolist() == list(range(19 * 19))  # a full grid reads the table in order
    assert set(differ // 19) | set(differ % 19) >= {12}  # row or column 12 of 19: 12/19 rounded below its cell
    assert np.all(theirs[differ] < ours[differ])


def transformers_pixel_shuffle(x: np.ndarray, scale: int) -> np.ndarray:
    import torch
    from transformers.models.idefics3.modeling_idefics3 import Idefics3Connector

    return Idefics3Connector.pixel_shuffle(None, torch.tensor(x), scale).numpy()


@SETTINGS
@given(n=st.integers(1, 3), tokens_side=st.integers(1, 5), scale=st.integers(1, 4), d=st.integers(1, 6),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_pixel_shuffle_keeps_transformers_channel_order(n, tokens_side, scale, d, seed):
    pytest.importorskip("transformers")
    side = tokens_side * scale
    x = np.random.default_rng(seed).standard_normal((n, side * side, d))
    assert np.array_equal(pixel_shuffle(x, scale), transformers_pixel_shuffle(x, scale))


def test_pixel_shuffle_by_index():
    """Token (I, J) holds patches (2I + dy, 2J + dx), row by row: the picture in nn/image_tokens.py."""
    x = np.arange(16.0).reshape(1, 16, 1)  # patch p holds p
    assert pixel_shuffle(x, 2)[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]


@SETTINGS
@given(n=st.integers(1, 3), tokens_side=st.integers(1, 5), scale=st.integers(1, 4), d=st.integers(1, 6),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_average_pool_is_torchs_avgpool(n, tokens_side, scale, d, seed):
    torch = pytest.importorskip("torch")
    side = tokens_side * scale
    x = np.random.default_rng(seed).standard_normal((n, side * side, d))
    grid = torch.tensor(x).transpose(1, 2).reshape(n, d, side, side)
    expected = torch.nn.AvgPool2d(scale, scale)(grid).flatten(2).transpose(1, 2).numpy()
    np.testing.assert_allclose(average_pool(x, scale), expected, rtol=1e-12, atol=1e-12)


def test_layer_norm_is_torchs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((3, 5, 17)) * 4 + 2, rng.standard_normal(17), rng.standard_normal(17)
    expected = torch.nn.functional.layer_norm(torch.tensor(x), (17,), torch.tensor(w), torch.tensor(b), 1e-6).numpy()
    np.testing.assert_allclose(layer_norm(x, w, b, 1e-6), expected, rtol=1e-12, atol=1e-12)


def test_bidirectional_attention_hides_only_padding_keys():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 6, 3, 4)) for _ in range(3))
    mask = np.array([[True] * 6, [True] * 4 + [False] * 2])
    out = bidirectional_attention(q, k, v, 0.5, mask)
    for n in range(2):
        keys = mask[n]
        for p in range(6):
            for h in range(3):
                scores = 0.5 * k[n, keys, h] @ q[n, p, h]
                weights = np.exp(scores - scores.max())
                np.testing.assert_allclose(out[n, p, h], weights @ v[n, keys, h] / weights.sum(), rtol=1e-12)


@st.composite
def image_runs(draw: st.DrawFn, length: int) -> list[tuple[int, int]]:
    """Disjoint (start, end) runs within 0 .. length."""
    cuts = sorted(draw(st.sets(st.integers(0, length), max_size=6)))
    return [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b > a]


@SETTINGS
@given(data=st.data(), length=st.integers(1, 30), window=st.none() | st.integers(1, 12), seed=st.integers(0, 99))
def test_attention_with_image_spans_is_the_mask_spelled_out(data, length, window, seed):
    runs = data.draw(image_runs(length))
    first = data.draw(st.integers(0, length - 1))  # the queries are positions first .. length - 1
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((length - first, 2, 3)), rng.standard_normal((length, 1, 3)), rng.standard_normal((length, 1, 3))
    out = attention(q, k, v, np.arange(first, length), 0.7, window, image_spans=runs)
    image = {p: r for r, (a, b) in enumerate(runs) for p in range(a, b)}
    for t, p in enumerate(range(first, length)):
        seen = [j for j in range(length)
                if (j <= p or image.get(j, -1) == image.get(p, -2)) and (window is None or p - j < window)]  # fmt: skip
        for h in range(2):
            scores = 0.7 * k[seen, 0] @ q[t, h]
            weights = np.exp(scores - scores.max())
            np.testing.assert_allclose(out[t, h], weights @ v[seen, 0] / weights.sum(), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(shape=attention_shapes(), data=st.data(), prefix_lens=st.lists(st.integers(0, 100), min_size=1, max_size=3),
       num_tokens=st.integers(1, 40))  # fmt: skip
def test_image_span_kernel_matches_spec(shape, data, prefix_lens, num_tokens):
    """Spans end within the new tokens (a step never ends inside one) and may start in the cached prefix."""
    rng = np.random.default_rng(shape["seed"])
    lengths = [prefix + num_tokens for prefix in prefix_lens]
    runs = [[(a, b) for a, b in data.draw(image_runs(length)) if b > prefix] for prefix, length in zip(prefix_lens, lengths)]
    key_cache, value_cache, tables, keys, values = blocked(rng, lengths, shape)
    q = rng.standard_normal((len(lengths), num_tokens, shape["num_heads"], shape["head_dim"]), dtype=np.float32)
    scale, window, softcap = kernel_scalars(shape)
    prefixes = np.array(prefix_lens, np.int64)

    out = paged_prefill_attention_to(q, key_cache, value_cache, tables, prefixes,
                                     visible_ends(prefixes, num_tokens, runs), scale, window, softcap)  # fmt: skip

    for b, prefix in enumerate(prefix_lens):
        positions = prefix + np.arange(num_tokens)
        f64 = np.float64
        expected = attention(q[b].astype(f64), keys[b].astype(f64), values[b].astype(f64), positions, scale,
                             shape["window"], shape["softcap"], image_spans=runs[b])  # fmt: skip
        np.testing.assert_allclose(out[b], expected, rtol=RTOL, atol=ATOL)


def test_visible_ends_reach_an_images_end():
    ends = visible_ends(np.array([3]), 6, [[(1, 5)]])  # positions 3..8; the image covers 1..4
    assert ends.tolist() == [[5, 5, 6, 7, 8, 9]]
