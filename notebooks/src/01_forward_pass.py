# %% [markdown]
# # 01 · Anatomy of a forward pass
#
# A decoder-only transformer turns token ids into one score per vocabulary entry
# for every position. This notebook pushes eight tokens through a tiny one-layer Llama
# with random weights, calling the functions of `refllm/nn/` one at a time and printing
# the shape after every step. At the end we check that our hand-made logits are the
# model's own.
#
# Shape letters (the legend of `refllm/nn/__init__.py`): `B` batch, `T` tokens,
# `S` keys, `D` hidden size, `H` query heads, `K` KV heads, `E` head dim,
# `F` MLP size, `V` vocabulary, `L` layers.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from refllm import CacheConfig
from refllm.config import ModelConfig
from refllm.models.random import random_model
from refllm.nn.attention import attention, attention_mask, softmax
from refllm.nn.embedding import embed
from refllm.nn.linear import linear
from refllm.nn.mlp import gated_mlp
from refllm.nn.norm import rms_norm
from refllm.nn.rope import apply_rope, cos_sin, inverse_frequencies

c = ModelConfig.from_hf(dict(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
))
# Weights drawn from N(0, 0.3): wider than a trained model's, so attention has clear favourites.
model = random_model(c, seed=0, std=0.3)
w = model.weights  # every tensor, put where its role says (refllm/models/weights.py)
a = c.attention  # the recipe's attention: grouped-query, its heads and options (refllm/recipe.py)
D, H, K, E = c.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim
F, V = c.mlp.intermediate_size, c.vocab_size
print(f"D={D} H={H} K={K} E={E} F={F} V={V} L={c.num_hidden_layers}")

# %% [markdown]
# ## 1. Embedding: a row lookup
#
# $$x_{b,t} = W_\text{embed}[\text{id}_{b,t}] \qquad W_\text{embed} \in \mathbb{R}^{V \times D}$$

# A random model has no tokenizer, so we give eight of its ids words of our own, for the pictures.
#
# %%
WORDS = {3: "the", 17: "cat", 42: "sat", 8: "on", 25: "warm", 60: "mat", 9: "."}
tokens = np.array([[3, 17, 42, 8, 3, 25, 60, 9]])  # [B, T]: "the cat sat on the warm mat ."
words = [WORDS[int(i)] for i in tokens[0]]
B, T = tokens.shape
x = embed(tokens, w.embed_tokens, c.embedding_scale)  # [B, T, D]
print("tokens", tokens.shape, "-> x", x.shape)
assert np.array_equal(x[0, 1], w.embed_tokens[17])  # position 1 holds token 17's row

# %% [markdown]
# ## 2. RMSNorm before attention
#
# $$\text{rms\_norm}(x) = \frac{x}{\sqrt{\tfrac{1}{D}\sum_i x_i^2 + \epsilon}} \odot w$$
#
# Every position is rescaled to unit root-mean-square, then scaled per channel by `w`.

# %%
layer = w.layers[0]
h = rms_norm(x, layer.attention_norm, c.norms.eps)  # [B, T, D]
unit = rms_norm(x, np.ones(D, np.float32), c.norms.eps)
print("h", h.shape, "  rms of each position before w:", np.sqrt(np.mean(unit**2, axis=-1)).round(4))

# %% [markdown]
# ## 3. Queries, keys and values
#
# Three projections, $q = h W_q^\top$, $k = h W_k^\top$, $v = h W_v^\top$, each split into heads.
# There are `H` query heads but only `K` key/value heads (grouped-query attention).

# %%
attn = layer.attention  # q/k/v/o projections [out, in] and their biases
q = linear(h, attn.q_proj, attn.q_proj_bias).reshape(B, T, H, E)
k = linear(h, attn.k_proj, attn.k_proj_bias).reshape(B, T, K, E)
v = linear(h, attn.v_proj, attn.v_proj_bias).reshape(B, T, K, E)
print("q", q.shape, " k", k.shape, " v", v.shape)

# %% [markdown]
# ## 4. RoPE: rotate by position
#
# Each pair of dimensions $(i, i + E/2)$ of a query or key at position $p$ is rotated by
# the angle $p f_i$, with $f_i = \theta^{-2i/E}$:
#
# $$x' = x \odot \cos(p f) + \text{rotate\_half}(x) \odot \sin(p f)$$
#
# A rotation keeps lengths, so only the angle between a query and a key changes.
# Notebook 02 looks at RoPE closely.

# %%
positions = np.arange(T)[None]  # [B, T]
inv_freq, attention_factor = inverse_frequencies(c.rope_for_layer(0), E, c.max_position_embeddings)
cos, sin = cos_sin(inv_freq, positions, attention_factor)  # [B, T, E]
q_rot, k_rot = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
print("inv_freq", inv_freq.shape, " cos", cos.shape, " q", q_rot.shape, " k", k_rot.shape)
np.testing.assert_allclose(np.linalg.norm(q_rot, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)

# %% [markdown]
# ## 5. Attention, piece by piece
#
# $$s_{h,t,j} = \frac{q_{h,t} \cdot k_{g(h),j}}{\sqrt{E}}, \qquad g(h) = \lfloor h / (H/K) \rfloor$$
# $$s_{h,t,j} = -\infty \text{ unless } j \le t \quad\text{(causal mask)}, \qquad
#   a_{h,t} = \sum_j \text{softmax}(s_{h,t})_j \, v_{g(h),j}$$
#
# We build the scores ourselves, so that we can look at the weights, then check the
# result against `refllm.nn.attention.attention`, the function the model uses.

# %%
group = H // K
q0, k0, v0 = q_rot[0], k_rot[0], v[0]  # batch row 0: [T, H, E], [S, K, E], [S, K, E]
k_heads = np.repeat(k0, group, axis=1)  # [S, H, E]: query head h reads KV head h // group
v_heads = np.repeat(v0, group, axis=1)
scores = q0.transpose(1, 0, 2) @ k_heads.transpose(1, 2, 0) * np.float32(a.scale)  # [H, T, S]
allowed = attention_mask(positions[0], T)  # [T, S]: key j visible from query t when j <= t
weights = softmax(np.where(allowed, scores, -np.inf))  # [H, T, S], each row sums to 1
out = (weights @ v_heads.transpose(1, 0, 2)).transpose(1, 0, 2)  # [H, T, E] -> [T, H, E]
print("scores", scores.shape, " weights", weights.shape, " out", out.shape)

np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-6)
np.testing.assert_allclose(out, attention(q0, k0, v0, positions[0], a.scale), rtol=1e-5, atol=1e-6)

# %% [markdown]
# Each panel is one head: row `t` shows how much the word at `t` takes from each word
# before it (each row sums to 1). The upper triangle is empty (the future is masked);
# heads 0 and 1 share one KV head, as do heads 2 and 3.

# %%
fig, axes = plt.subplots(1, H, figsize=(3.3 * H, 3.6), layout="constrained")
for head, ax in enumerate(axes):
    image = ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"head {head} (KV head {head // group})", fontsize=9)
    ax.set_xticks(range(T), words, fontsize=8, rotation=60)
    ax.set_yticks(range(T), words, fontsize=8)
    ax.set_xlabel("key: looked at")
axes[0].set_ylabel("query: looking")
fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
fig.suptitle("layer 0: how much each word takes from each earlier word")
plt.show()

# %% [markdown]
# ## 6. Output projection and the residual stream
#
# The heads are concatenated back to `H·E` numbers and projected to `D`; the result is
# *added* to `x`: $x \leftarrow x + a W_o^\top$.

# %%
heads = out.reshape(B, T, H * E)
x1 = x + linear(heads, attn.o_proj, attn.o_proj_bias)  # [B, T, D]
print("heads", heads.shape, "-> x", x1.shape)

# %% [markdown]
# ## 7. The gated MLP
#
# $$\text{mlp}(x) = W_\text{down}\big(\text{SiLU}(W_\text{gate}\,x) \odot W_\text{up}\,x\big), \qquad
#   \text{SiLU}(x) = \frac{x}{1 + e^{-x}}$$
#
# It widens each position to `F` numbers and back to `D`, position by position; again
# the result is added to the residual stream.

# %%
h = rms_norm(x1, layer.mlp_norm, c.norms.eps)
print("gate(h)", linear(h, layer.mlp.gate_proj).shape)  # [B, T, F]
x2 = x1 + gated_mlp(h, layer.mlp)  # SwiGLU: the activation Llama's config names (c.mlp.activation)
print("after layer 0: x", x2.shape)

# %% [markdown]
# ## 8. The final norm and the logits
#
# This model has one layer, so steps 2 to 7 were all of it; a real model runs the same
# steps once per layer, each layer's output the next one's input (the model's `_forward`
# in `refllm/models/decoder.py` does exactly that, each layer a block built from the
# recipe in `refllm/families/llama.py`). A final RMSNorm and the LM head
# ($x W^\top$, one row per vocabulary entry) give the logits.

# %%
logits = linear(rms_norm(x2, w.norm, c.norms.eps), w.lm_head)  # [B, T, V]
print("logits", logits.shape)

# %% [markdown]
# ## 9. Check: the model computes the same thing
#
# `prefill_all_logits` runs the model's own forward pass (`refllm/models/decoder.py`). With
# the contiguous cache its attention is the NumPy spec we used; with the default paged
# cache it is a Numba kernel reading keys block by block (notebook 03). Both must agree
# with our walk-through.

# %%
contiguous_cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
paged_cache = model.create_kv_cache(CacheConfig(kind="paged", block_size=4))
spec = model.prefill_all_logits(tokens, contiguous_cache, range(T))  # [B, T, V]
paged = model.prefill_all_logits(tokens, paged_cache, range(T))
np.testing.assert_allclose(logits, spec, rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(logits, paged, rtol=1e-5, atol=1e-5)
print("max |difference|: spec", np.abs(logits - spec).max(), " paged", np.abs(logits - paged).max())

# %% [markdown]
# The last row of the logits is the model's guess for the token after the prompt: the
# softmax of it is the distribution that sampling (notebook 04) draws from.

# %%
probs = softmax(logits[0, -1])  # [V]
top = np.argsort(-probs)[:5]
print("most likely next ids:", top, "with probabilities", probs[top].round(3))

# %% [markdown]
# ## 10. The same, recorded: `refllm.tracing`
#
# `trace(model, ids)` runs the model's own forward pass through the spec ops and keeps
# every op's output, per layer, with each layer's attention weights: what we computed by
# hand above, without writing it out. The web page of `refllm serve` draws its inside view
# from it, and notebook 06 uses it to find where two runs part ways.

# %%
from refllm.tracing import trace

traced = trace(model, tokens[0])
for op in traced.layers[0].ops:
    print(f"{op.name:<10} {op.weight or '':<28} {tuple(op.output.shape)}")
np.testing.assert_allclose(traced.layers[0].attention, weights, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(traced.logits, logits[0], rtol=1e-5, atol=1e-5)

