# %% [markdown]
# # 08 · Seeing: an image cut into patches, the attention of a patch, image tokens in the prompt
#
# A vision-language model reads an image as a few dozen to a few thousand extra tokens:
#
# $$\text{image} \xrightarrow{\text{processor}} \text{tiles} \xrightarrow{\text{patches}}
#   \text{SigLIP} \xrightarrow{\text{pixel shuffle or pooling}} \text{image tokens}
#   \xrightarrow{\text{spliced into the prompt}} \text{the text model}$$
#
# Code: `refllm/nn/patches.py`, `refllm/nn/image_tokens.py`, `refllm/models/vision_tower.py`,
# `refllm/models/multimodal.py`; more in `docs/layers/vision.md`. The models here are the tiny
# random-weight SmolVLM and Gemma 3 checkpoints the tests compare with transformers (no real
# vision-language weights are published as a package), so the pictures show the machinery, not
# what a trained model sees.

# %%
%matplotlib inline
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import refllm
from refllm import CacheConfig
from refllm.io.images import read_image
from refllm.io.vision_prompt import content_parts, encode_chat
from refllm.nn.attention import attention_mask, softmax
from refllm.nn.image_tokens import pixel_shuffle
from refllm.nn.linear import linear
from refllm.nn.norm import layer_norm
from refllm.nn.patches import patch_embedding, position_embedding, unfold_patches

FIXTURES = Path(refllm.__file__).resolve().parents[1] / "tests" / "data" / "hf"
smolvlm = refllm.load_model(FIXTURES / "idefics3", reference=True)
gemma = refllm.load_model(FIXTURES / "gemma3_vision", reference=True)
picture = read_image(FIXTURES / "idefics3" / "images" / "wide.png")  # uint8 [H, W, 3]
print(f"the picture: {picture.shape[0]} x {picture.shape[1]} pixels")
print(f"SmolVLM's tower: {smolvlm.multimodal.vision.image_size}-pixel tiles, patches of"
      f" {smolvlm.multimodal.vision.patch_size}, {smolvlm.multimodal.tokens_per_image} image tokens per tile")

# %% [markdown]
# ## The processor: tiles and a global image
#
# SmolVLM's processor resizes the picture so its longest edge is `size`, then up to whole
# tiles, and cuts it into rows × columns of tiles plus the whole picture shrunk to one tile
# (the *global image*). Each becomes a pixel batch entry, normalised to about [-1, 1].

# %%
batch = smolvlm.image_processor(picture)
tiles = batch.pixels  # [N, 3, S, S]
fig, axes = plt.subplots(1, len(tiles) + 1, figsize=(2.0 * (len(tiles) + 1), 2.2))
axes[0].imshow(picture)
axes[0].set_title("the picture")
for ax, tile, name in zip(axes[1:], tiles, [f"tile {i + 1}" for i in range(len(tiles) - 1)] + ["global"]):
    ax.imshow((tile.transpose(1, 2, 0) * 0.5 + 0.5).clip(0, 1))
    ax.set_title(name)
for ax in axes:
    ax.axis("off")
plt.tight_layout()
plt.show()
print(f"{len(tiles)} pixel batches of {tiles.shape[1:]}; the prompt text for this image begins"
      f" {batch.prompt[:80]!r}...")

# %% [markdown]
# ## Patches: an unfold and one matrix multiply
#
# A tile of $S \times S$ pixels is a grid of $(S/Z)^2$ patches of $Z \times Z$. Flattened, each
# patch is a row; the convolution the checkpoint stores (kernel $Z$, stride $Z$) is then one
# matrix product: $\text{embedding}_p = W_{[D_v, 3Z^2]}\, \text{patch}_p + b$.

# %%
Z, tower = smolvlm.multimodal.vision.patch_size, smolvlm.tower
rows = unfold_patches(tiles[:1], Z)  # [1, P, 3 * Z * Z]
side = int(np.sqrt(rows.shape[1]))
fig, ax = plt.subplots(figsize=(3, 3))
ax.imshow((tiles[0].transpose(1, 2, 0) * 0.5 + 0.5).clip(0, 1))
for edge in range(0, side * Z + 1, Z):
    ax.axhline(edge - 0.5, color="white", lw=0.8)
    ax.axvline(edge - 0.5, color="white", lw=0.8)
ax.set_title(f"tile 1: {side} x {side} patches of {Z} x {Z}")
ax.axis("off")
plt.show()
embedded = patch_embedding(tiles[:1], tower.patch_embedding, tower.patch_embedding_bias)
by_hand = rows[0, 5] @ tower.patch_embedding.reshape(len(tower.patch_embedding), -1).T + tower.patch_embedding_bias
np.testing.assert_allclose(embedded[0, 5], by_hand, rtol=1e-5, atol=1e-6)
print(f"patches {rows.shape} -> embeddings {embedded.shape}")

# %% [markdown]
# ## The attention of one patch
#
# In the tower every patch attends to every other: no causal mask. Here the first layer's
# weights of the patch at the centre, head by head, laid back on the grid.

# %%
x = embedded + position_embedding(np.ones((1, side, side), bool), tower.position_embedding)
layer, heads = tower.layers[0], smolvlm.multimodal.vision.num_attention_heads
h = layer_norm(x, layer.layer_norm1_weight, layer.layer_norm1_bias, smolvlm.multimodal.vision.layer_norm_eps)[0]
E = h.shape[-1] // heads
q = linear(h, layer.q_proj, layer.q_proj_bias).reshape(-1, heads, E)
k = linear(h, layer.k_proj, layer.k_proj_bias).reshape(-1, heads, E)
centre = (side // 2) * side + side // 2
weights = softmax(np.einsum("he,phe->hp", q[centre], k) / np.sqrt(E))  # [H, P]
fig, axes = plt.subplots(1, heads, figsize=(2.4 * heads, 2.4))
for head, ax in enumerate(axes):
    ax.imshow(weights[head].reshape(side, side), cmap="magma")
    ax.plot(side // 2, side // 2, "c+", markersize=12)
    ax.set_title(f"head {head}")
    ax.axis("off")
plt.suptitle("where the centre patch (+) looks, layer 0")
plt.tight_layout()
plt.show()
np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)

# %% [markdown]
# ## Pixel shuffle: fewer, wider tokens
#
# SmolVLM merges each $s \times s$ neighbourhood of patch features into one token by laying
# them side by side, row by row (transformers' channel order), then projects to the text
# width. With patch p holding the number p:

# %%
numbers = np.arange(16.0).reshape(1, 16, 1)
print("4 x 4 patches ->", pixel_shuffle(numbers, 2)[0].astype(int).tolist())
features = smolvlm.image_features(tiles)
print(f"the tower's {side}x{side} features per tile -> {features.shape[1]} image tokens of width {features.shape[2]}")

# %% [markdown]
# ## The image tokens in the prompt
#
# The chat template writes one placeholder per image; the processor replaces it with runs of
# image tokens (with row and column markers for SmolVLM's tiles). `embed_multimodal` puts the
# features there, tile by tile, in order.

# %%
messages = [{"role": "user", "content": content_parts("what is here?", 1)}]
ids, pixels = encode_chat(smolvlm.tokenizer, smolvlm.image_processor, messages, [picture])
is_image = np.array(ids) == smolvlm.multimodal.image_token_id
fig, ax = plt.subplots(figsize=(12, 1.0))
ax.imshow(is_image[None], aspect="auto", cmap="coolwarm")
ax.set_yticks([])
ax.set_xlabel(f"position ({len(ids)} tokens; red: image tokens, {len(smolvlm.image_spans(ids))} runs of"
              f" {smolvlm.multimodal.tokens_per_image})")
plt.show()
x = smolvlm.embed_multimodal(np.array([ids]), pixels)
np.testing.assert_allclose(x[0, is_image], smolvlm.image_features(pixels[0]).reshape(-1, x.shape[-1]), rtol=1e-6)

# %% [markdown]
# ## Why Gemma 3's image tokens see each other
#
# A causal mask would let the first token of an image see nothing of the rest of it. Gemma 3
# lets the tokens of one image attend to each other both ways, inside the otherwise causal mask;
# its sliding window (8 here) still bounds how far back a query looks. The mask of a prompt with
# one image, allowed in yellow:

# %%
g_messages = [{"role": "user", "content": content_parts("and here?", 1)}]
g_ids, g_pixels = encode_chat(gemma.tokenizer, gemma.image_processor, g_messages, [picture])
runs = gemma.image_spans(g_ids)
T = len(g_ids)
fig, axes = plt.subplots(1, 2, figsize=(11, 5))
for ax, window, title in zip(axes, (None, gemma.config.sliding_window), ("full layers", "sliding layers")):
    ax.imshow(attention_mask(np.arange(T), T, window, runs), cmap="viridis")
    ax.set(xlabel="key position", ylabel="query position", title=f"{title}: image at {runs[0][0]}..{runs[0][1] - 1}")
plt.tight_layout()
plt.show()
cache = gemma.create_kv_cache(CacheConfig(kind="contiguous"))
x = gemma.embed_multimodal(np.array([g_ids]), g_pixels)
seeing = gemma.prefill_all_logits(x, cache, range(T), image_spans=[runs])
blind = gemma.prefill_all_logits(x, gemma.create_kv_cache(CacheConfig(kind="contiguous")), range(T))
print(f"the logits move by up to {np.abs(seeing - blind).max():.3f} when the image tokens cannot see each other")
assert np.abs(seeing[0, : runs[0][0]] - blind[0, : runs[0][0]]).max() == 0  # before the image: the same
