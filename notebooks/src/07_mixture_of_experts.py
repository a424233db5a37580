# %% [markdown]
# # 07 · A token's route through a mixture of experts
#
# In a mixture-of-experts layer (Mixtral, Qwen3-MoE, gpt-oss) the one MLP of a dense
# layer becomes $X$ expert MLPs and a **router**, a linear layer that scores every
# expert for every token. Each token runs only its $k$ best-scored experts and mixes
# their outputs by the router's weights:
#
# $$\ell = W_r x, \qquad p = \text{softmax}(\ell), \qquad \text{ids} = \text{top}_k(p), \qquad
#   w = \frac{p_\text{ids}}{\sum p_\text{ids}}, \qquad
#   \text{moe}(x) = \sum_{i=1}^{k} w_i\, \text{expert}_{\text{ids}_i}(x)$$
#
# That is Mixtral's routing: softmax over all experts, top-$k$, renormalise. Code:
# `refllm/nn/moe.py`; more in `docs/layers/moe.md`. Here: a random-weight Mixtral-style
# model, the route each token of a prompt takes through its layers, and the same
# computation redone by hand.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from refllm import CacheConfig, ModelConfig
from refllm.models.random import random_model
from refllm.nn.linear import linear
from refllm.nn.mlp import gated_mlp
from refllm.nn.moe import experts_forward, softmax_then_topk

config = ModelConfig.from_hf(dict(
    model_type="mixtral", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    num_local_experts=8, num_experts_per_tok=2,
))
moe = config.experts  # the recipe's mixture of experts (refllm/moe_parameters.py)
print(f"{moe.num_experts} experts per layer, {moe.experts_per_token} per token, routing {moe.routing},"
      f" renormalised: {moe.norm_topk_prob}")
print(f"parameters: {config.num_parameters:,} in all, {config.active_parameters:,} read per token")

# %% [markdown]
# ## Recording the routes
#
# The model's forward pass calls each layer's MLP block (`model.layers[i].mlp`, a
# `SparseMLP` here, built at load from the recipe) with the normed hidden states `h`
# [B, T, D]. Wrapping the blocks in one that routes `h` itself before handing it on
# records which experts each token chose, and with what weight, without changing the output.

# %%
class RouteRecorder:
    """A layer's MLP block that first records (expert_ids [T, k], expert_weights [T, k], h [T, D])."""

    def __init__(self, block, routes):
        self.block, self.routes = block, routes

    def __call__(self, h):
        x = h.reshape(-1, h.shape[-1])
        ids, weights = softmax_then_topk(linear(x, self.block.w.router), moe.experts_per_token, moe.norm_topk_prob)
        self.routes.append((ids, weights, x))
        return self.block(h)


model = random_model(config, seed=3, std=0.3)
routes = []
for decoder_layer in model.layers:
    decoder_layer.mlp = RouteRecorder(decoder_layer.mlp, routes)
prompt = np.array([[1, 17, 42, 5, 9, 33, 61, 8, 20, 4]])
logits = model.prefill_all_logits(prompt, model.create_kv_cache(CacheConfig(kind="contiguous")), range(10))
print(f"{len(routes)} sparse layers recorded, each: ids {routes[0][0].shape}, weights {routes[0][1].shape}")

# %% [markdown]
# ## One token's route
#
# Token 3 of the prompt, layer by layer: a matrix of layers × experts holding the weight
# each chosen expert gets (empty where the expert was not chosen). Each row has exactly
# $k$ entries, and they sum to 1 because Mixtral renormalises.

# %%
T, L, X = prompt.shape[1], config.num_hidden_layers, moe.num_experts
route = np.zeros((L, T, X))  # [layer, token, expert]: the weight, 0 where not chosen
for layer, (ids, weights, _) in enumerate(routes):
    np.put_along_axis(route[layer], ids, weights, axis=-1)

token = 3
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 3.8))
image = left.imshow(np.where(route[:, token] > 0, route[:, token], np.nan), cmap="viridis", vmin=0, vmax=1)
for layer in range(L):
    for expert in np.nonzero(route[layer, token])[0]:
        left.text(expert, layer, f"{route[layer, token, expert]:.2f}", ha="center", va="center", color="white")
left.set(xlabel="expert", ylabel="layer", xticks=range(X), yticks=range(L))
left.set_title(f"token {token} (id {prompt[0, token]}): its experts and their weights")
fig.colorbar(image, ax=left, fraction=0.03)
right.imshow((route > 0).sum(axis=1), cmap="Blues")
for layer in range(L):
    for expert in range(X):
        count = int((route[layer, :, expert] > 0).sum())
        right.text(expert, layer, count, ha="center", va="center", color="white" if count > T / 2 else "black")
right.set(xlabel="expert", ylabel="layer", xticks=range(X), yticks=range(L))
right.set_title(f"tokens routed to each expert (of {T})")
plt.tight_layout()
plt.show()

assert np.all((route > 0).sum(axis=-1) == moe.experts_per_token)
np.testing.assert_allclose(route.sum(axis=-1), 1.0, rtol=1e-6)

# %% [markdown]
# The right panel is the load: how many of the prompt's tokens each expert serves.
# Unbalanced loads are normal at inference; training adds a loss that evens them out.
#
# ## The layer by hand
#
# Redo layer 0's mixture for every token with the spec's functions: route, then run
# `experts_forward`, the loop that gathers each expert's tokens, runs its SwiGLU MLP
# once on them and adds the weighted results back. Then the same sum written per
# token, the way the equation reads.

# %%
layer = 0
w = model.weights.layers[layer].mlp  # the router [X, D] and each expert's MLPWeights
experts = w.experts
ids, weights, x = routes[layer]
loop = experts_forward(x, ids, weights, experts)  # [T, D]
by_token = np.stack([
    sum(weights[t, i] * gated_mlp(x[t : t + 1], experts[ids[t, i]])[0] for i in range(moe.experts_per_token))
    for t in range(T)
])
np.testing.assert_allclose(loop, by_token, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(loop, model.layers[layer].mlp.block(x[None])[0], rtol=1e-5, atol=1e-6)
print(f"token {token}, layer {layer}: experts {ids[token].tolist()},"
      f" weights {', '.join(f'{weight:.3f}' for weight in weights[token])}")
print("experts_forward == the per-token sum == the model's own MLP step")

# %% [markdown]
# ## Why renormalising matters
#
# Without the division by $\sum p_\text{ids}$ (Qwen3-MoE's default, `norm_topk_prob`
# false) the weights are the raw softmax probabilities of the chosen experts and sum to
# less than 1: the layer's output shrinks. The same router logits, both ways:

# %%
router_logits = linear(x, w.router)  # [T, X]
_, renormalised = softmax_then_topk(router_logits, moe.experts_per_token, renormalize=True)
_, raw = softmax_then_topk(router_logits, moe.experts_per_token, renormalize=False)
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(np.arange(T) - 0.2, renormalised.sum(-1), width=0.4, label="renormalised (Mixtral)")
ax.bar(np.arange(T) + 0.2, raw.sum(-1), width=0.4, label="not renormalised")
ax.set(xlabel="token", ylabel="sum of the k weights", xticks=range(T), ylim=(0, 1.15))
ax.legend(loc="upper right")
plt.tight_layout()
plt.show()
assert np.all(raw.sum(-1) < renormalised.sum(-1))
