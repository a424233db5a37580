# %% [markdown]
# # 02 · Rotary position embedding (RoPE)
#
# RoPE tells attention where tokens are by rotating queries and keys. Pair $i$ of a
# head's dimensions, $(x_i, x_{i+E/2})$, at position $p$ is turned by the angle
# $p f_i$:
#
# $$f_i = \theta^{-2i/E}, \qquad
#   \begin{pmatrix} x'_i \\ x'_{i+E/2} \end{pmatrix} =
#   \begin{pmatrix} \cos p f_i & -\sin p f_i \\ \sin p f_i & \cos p f_i \end{pmatrix}
#   \begin{pmatrix} x_i \\ x_{i+E/2} \end{pmatrix}$$
#
# Rotating both by their own positions leaves $q(p) \cdot k(p')$ a function of
# $p - p'$ only. Code: `refllm/nn/rope.py`; more in `docs/layers/rope.md`.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from refllm.config import RopeParameters
from refllm.nn.rope import apply_rope, cos_sin, inverse_frequencies

E, CONTEXT = 64, 1024  # head dim; the context length the model was trained on

# %% [markdown]
# ## Frequencies and what scaling does to them
#
# Pair 0 turns fastest (one radian per position); the last pairs turn so slowly that
# their **wavelength** $2\pi / f_i$ is longer than any sequence seen in training. To
# run past the trained context, models rescale the frequencies:
#
# | `rope_type` | frequencies |
# |---|---|
# | `linear` | $f_i / s$: every position squeezed by the factor $s$ |
# | `dynamic` | $\theta$ grows with the sequence length $L$ once it passes $L_0$: $\theta' = \theta\,(sL/L_0 - (s-1))^{E/(E-2)}$ |
# | `llama3` | wavelengths longer than $L_0$/`low_freq_factor` divided by $s$, shorter than $L_0$/`high_freq_factor` kept, a smooth blend between |
# | `yarn` | a ramp from kept (fast pairs) to divided by $s$ (slow pairs), and cos/sin scaled by $0.1 \ln s + 1$ |

# %%
s = 4.0
variants = {  # name: (parameters, sequence length the frequencies are computed for)
    "default": (RopeParameters(), None),
    "linear": (RopeParameters(rope_type="linear", factor=s), None),
    "dynamic, 4096 tokens": (RopeParameters(rope_type="dynamic", factor=s), 4096),
    "llama3": (RopeParameters(rope_type="llama3", factor=s, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=CONTEXT), None),
    "yarn": (RopeParameters(rope_type="yarn", factor=s, original_max_position_embeddings=CONTEXT), None),
}
frequencies = {}
for name, (params, seq_len) in variants.items():
    inv_freq, attention_factor = inverse_frequencies(params, E, CONTEXT, seq_len)  # [E/2]
    frequencies[name] = inv_freq
    print(f"{name:21} f_0 {inv_freq[0]:.3f}  f_last {inv_freq[-1]:.2e}  attention factor {attention_factor:.3f}")

# %%
pairs = np.arange(E // 2)
default = frequencies["default"]
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
for name, inv_freq in frequencies.items():
    left.plot(pairs, 2 * np.pi / inv_freq, marker=".", label=name)
    right.plot(pairs, inv_freq / default, marker=".", label=name)
left.axhline(CONTEXT, color="grey", linestyle="--", linewidth=1)
left.text(0, CONTEXT * 1.3, "trained context", color="grey")
left.set(yscale="log", xlabel="pair i", ylabel="wavelength 2π / f_i (positions)")
left.set_title("wavelength of each pair")
right.set(xlabel="pair i", ylabel="f_i / default f_i", ylim=(0, 1.1))
right.set_title("frequency relative to default")
right.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the right panel from left to right: `linear` slows every pair by $s$ (so local
# detail blurs too); `llama3` and `yarn` keep the fast pairs, which resolve nearby
# tokens, and slow only the pairs whose wavelength passes the trained context;
# `dynamic` raises $\theta$, which slows the later pairs more than the early ones.
#
# The same facts as assertions:

# %%
np.testing.assert_allclose(frequencies["linear"], default / s, rtol=1e-6)
wavelength = 2 * np.pi / default
short, long = wavelength < CONTEXT / 4.0, wavelength > CONTEXT / 1.0  # llama3's two bands
np.testing.assert_allclose(frequencies["llama3"][short], default[short], rtol=1e-6)
np.testing.assert_allclose(frequencies["llama3"][long], default[long] / s, rtol=1e-6)
assert frequencies["yarn"][0] == default[0] and np.isclose(frequencies["yarn"][-1], default[-1] / s, rtol=1e-5)
dynamic = frequencies["dynamic, 4096 tokens"]
assert dynamic[0] == default[0] and np.all(dynamic[1:] < default[1:])

# %% [markdown]
# ## The score depends on distance only
#
# Take one query vector and one key vector, put the query at position $p$ and the key
# at $p - d$, and compute $q(p)\cdot k(p-d)$ for many distances $d$. Doing it at two
# different absolute positions gives the same curve. With $q = k = (1, \dots, 1)$ the
# score is $2\sum_i \cos(d f_i)$: largest at $d = 0$ and decaying, with ripples, as the
# pairs fall out of phase.

# %%
def scores_by_distance(q, k, inv_freq, query_position, distances):
    """q, k: [E] -> q(p) . k(p - d) for each d in distances."""
    key_positions = query_position - distances  # [N]
    cos_q, sin_q = cos_sin(inv_freq, np.array([[query_position]]))
    cos_k, sin_k = cos_sin(inv_freq, key_positions[None])  # [1, N, E]
    q_rot = apply_rope(q[None, None, None], cos_q, sin_q)[0, 0, 0]  # [E]
    k_rot = apply_rope(np.broadcast_to(k, (1, len(distances), 1, E)), cos_k, sin_k)[0, :, 0]  # [N, E]
    return k_rot @ q_rot


ones = np.ones(E, np.float32)
distances = np.arange(0, 200)
near = scores_by_distance(ones, ones, default, 200, distances)
far = scores_by_distance(ones, ones, default, 700, distances)
np.testing.assert_allclose(near, far, atol=1e-3)  # same distances, same scores
np.testing.assert_allclose(near, 2 * np.cos(np.outer(distances, default)).sum(axis=1), atol=1e-3)
print("score at d=0:", near[0], " max |near - far|:", np.abs(near - far).max())

# %% [markdown]
# Linear scaling by $s$ turns distance $d$ into $d / s$, so its curve is the default one
# stretched $s$ times along the distance axis: 4096 positions look like 1024. `llama3`
# keeps the fast pairs, so at short range it follows the default curve closely.

# %%
distances = np.arange(0, 257)
fig, ax = plt.subplots(figsize=(10, 3.5))
for name in ("default", "linear", "llama3"):
    ax.plot(distances, scores_by_distance(ones, ones, frequencies[name], 1000, distances), label=name)
ax.set(xlabel="distance d = p - p'", ylabel="q(p) · k(p')")
ax.set_title("attention score against distance (q = k = ones)")
ax.legend()
plt.show()

stretched = scores_by_distance(ones, ones, frequencies["linear"], 4096, 4 * np.arange(1024))
np.testing.assert_allclose(stretched, scores_by_distance(ones, ones, default, 4096, np.arange(1024)), atol=1e-2)
