"""Write the notebooks of this folder from the Python source below.

    python notebooks/build_notebooks.py            # (re)write every .ipynb next to this file
    python notebooks/build_notebooks.py --check    # exit 1 if an .ipynb's cells differ from this source

Each notebook is a function returning its cells: ``md(...)`` for text,
``code(...)`` for code. The .ipynb files are written without outputs and with
fixed cell ids, so writing them twice gives the same bytes; edit this file,
run it, and commit both. ``tests/test_notebooks.py`` executes every notebook
and checks that the files match this source.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
    return new_code_cell(textwrap.dedent(text).strip("\n"))


# --------------------------------------------------------------------------------------------
# 01 anatomy of a forward pass
# --------------------------------------------------------------------------------------------


def forward_pass() -> list:
    return [
        md(r"""
        # 01 · Anatomy of a forward pass

        A decoder-only transformer turns token ids into one score per vocabulary entry
        for every position. This notebook pushes eight tokens through a tiny Llama with
        random weights, calling the functions of `refllm/nn/` one at a time and printing
        the shape after every step. At the end we check that our hand-made logits are the
        model's own.

        Shape letters (the legend of `refllm/nn/__init__.py`): `B` batch, `T` tokens,
        `S` keys, `D` hidden size, `H` query heads, `K` KV heads, `E` head dim,
        `F` MLP size, `V` vocabulary, `L` layers.
        """),
        code("""
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
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        ))
        # Weights drawn from N(0, 0.3): wider than a trained model's, so attention has clear favourites.
        model = random_model(c, seed=0, std=0.3)
        w = model.weights  # every tensor, named as in the checkpoint
        D, H, K, E = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        F, V = c.intermediate_size, c.vocab_size
        print(f"D={D} H={H} K={K} E={E} F={F} V={V} L={c.num_hidden_layers}")
        """),
        md(r"""
        ## 1. Embedding: a row lookup

        $$x_{b,t} = W_\text{embed}[\text{id}_{b,t}] \qquad W_\text{embed} \in \mathbb{R}^{V \times D}$$
        """),
        code("""
        tokens = np.array([[3, 17, 42, 8, 25, 3, 17, 60]])  # [B, T]
        B, T = tokens.shape
        x = embed(tokens, w.embed_tokens, c.embedding_scale)  # [B, T, D]
        print("tokens", tokens.shape, "-> x", x.shape)
        assert np.array_equal(x[0, 1], w.embed_tokens[17])  # position 1 holds token 17's row
        """),
        md(r"""
        ## 2. RMSNorm before attention

        $$\text{rms\_norm}(x) = \frac{x}{\sqrt{\tfrac{1}{D}\sum_i x_i^2 + \epsilon}} \odot w$$

        Every position is rescaled to unit root-mean-square, then scaled per channel by `w`.
        """),
        code("""
        layer = w.layers[0]
        h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps)  # [B, T, D]
        unit = rms_norm(x, np.ones(D, np.float32), c.rms_norm_eps)
        print("h", h.shape, "  rms of each position before w:", np.sqrt(np.mean(unit**2, axis=-1)).round(4))
        """),
        md(r"""
        ## 3. Queries, keys and values

        Three projections, $q = h W_q^\top$, $k = h W_k^\top$, $v = h W_v^\top$, each split into heads.
        There are `H` query heads but only `K` key/value heads (grouped-query attention).
        """),
        code("""
        q = linear(h, layer.q_proj, layer.q_proj_bias).reshape(B, T, H, E)
        k = linear(h, layer.k_proj, layer.k_proj_bias).reshape(B, T, K, E)
        v = linear(h, layer.v_proj, layer.v_proj_bias).reshape(B, T, K, E)
        print("q", q.shape, " k", k.shape, " v", v.shape)
        """),
        md(r"""
        ## 4. RoPE: rotate by position

        Each pair of dimensions $(i, i + E/2)$ of a query or key at position $p$ is rotated by
        the angle $p f_i$, with $f_i = \theta^{-2i/E}$:

        $$x' = x \odot \cos(p f) + \text{rotate\_half}(x) \odot \sin(p f)$$

        A rotation keeps lengths, so only the angle between a query and a key changes.
        Notebook 02 looks at RoPE closely.
        """),
        code("""
        positions = np.arange(T)[None]  # [B, T]
        inv_freq, attention_factor = inverse_frequencies(c.rope_for_layer(0), E, c.max_position_embeddings)
        cos, sin = cos_sin(inv_freq, positions, attention_factor)  # [B, T, E]
        q_rot, k_rot = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        print("inv_freq", inv_freq.shape, " cos", cos.shape, " q", q_rot.shape, " k", k_rot.shape)
        np.testing.assert_allclose(np.linalg.norm(q_rot, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)
        """),
        md(r"""
        ## 5. Attention, piece by piece

        $$s_{h,t,j} = \frac{q_{h,t} \cdot k_{g(h),j}}{\sqrt{E}}, \qquad g(h) = \lfloor h / (H/K) \rfloor$$
        $$s_{h,t,j} = -\infty \text{ unless } j \le t \quad\text{(causal mask)}, \qquad
          a_{h,t} = \sum_j \text{softmax}(s_{h,t})_j \, v_{g(h),j}$$

        We build the scores ourselves, so that we can look at the weights, then check the
        result against `refllm.nn.attention.attention`, the function the model uses.
        """),
        code("""
        group = H // K
        q0, k0, v0 = q_rot[0], k_rot[0], v[0]  # batch row 0: [T, H, E], [S, K, E], [S, K, E]
        k_heads = np.repeat(k0, group, axis=1)  # [S, H, E]: query head h reads KV head h // group
        v_heads = np.repeat(v0, group, axis=1)
        scores = q0.transpose(1, 0, 2) @ k_heads.transpose(1, 2, 0) * np.float32(c.attention_scale)  # [H, T, S]
        allowed = attention_mask(positions[0], T)  # [T, S]: key j visible from query t when j <= t
        weights = softmax(np.where(allowed, scores, -np.inf))  # [H, T, S], each row sums to 1
        out = (weights @ v_heads.transpose(1, 0, 2)).transpose(1, 0, 2)  # [H, T, E] -> [T, H, E]
        print("scores", scores.shape, " weights", weights.shape, " out", out.shape)

        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(out, attention(q0, k0, v0, positions[0], c.attention_scale), rtol=1e-5, atol=1e-6)
        """),
        md("""
        Each panel is one head: row `t` shows how much query position `t` takes from each key
        position. The upper triangle is empty (the future is masked); heads 0 and 1 share one
        KV head, as do heads 2 and 3.
        """),
        code("""
        fig, axes = plt.subplots(1, H, figsize=(3.2 * H, 3.2))
        for head, ax in enumerate(axes):
            ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer 0, head {head} (KV head {head // group})", fontsize=9)
            ax.set_xticks(range(T), tokens[0], fontsize=7)
            ax.set_yticks(range(T), tokens[0], fontsize=7)
            ax.set_xlabel("key (token id)")
        axes[0].set_ylabel("query (token id)")
        plt.tight_layout()
        plt.show()
        """),
        md(r"""
        ## 6. Output projection and the residual stream

        The heads are concatenated back to `H·E` numbers and projected to `D`; the result is
        *added* to `x`: $x \leftarrow x + a W_o^\top$.
        """),
        code("""
        a = out.reshape(B, T, H * E)
        x1 = x + linear(a, layer.o_proj, layer.o_proj_bias)  # [B, T, D]
        print("a", a.shape, "-> x", x1.shape)
        """),
        md(r"""
        ## 7. The gated MLP

        $$\text{mlp}(x) = W_\text{down}\big(\text{SiLU}(W_\text{gate}\,x) \odot W_\text{up}\,x\big), \qquad
          \text{SiLU}(x) = \frac{x}{1 + e^{-x}}$$

        It widens each position to `F` numbers and back to `D`, position by position; again
        the result is added to the residual stream.
        """),
        code("""
        h = rms_norm(x1, layer.post_attention_layernorm, c.rms_norm_eps)
        print("gate(h)", linear(h, layer.gate_proj).shape)  # [B, T, F]
        x2 = x1 + gated_mlp(h, layer.gate_proj, layer.up_proj, layer.down_proj, c.hidden_act)
        print("after layer 0: x", x2.shape)
        """),
        md("""
        ## 8. Every layer, then the logits

        The same steps, written once as a function, run for each layer. A final RMSNorm and
        the LM head ($x W^\\top$, one row per vocabulary entry) give the logits.
        """),
        code("""
        def decoder_layer(x, layer):
            \"\"\"x: [B, T, D] -> [B, T, D]: steps 2 to 7 above.\"\"\"
            h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps)
            q = apply_rope(linear(h, layer.q_proj, layer.q_proj_bias).reshape(B, T, H, E), cos, sin)
            k = apply_rope(linear(h, layer.k_proj, layer.k_proj_bias).reshape(B, T, K, E), cos, sin)
            v = linear(h, layer.v_proj, layer.v_proj_bias).reshape(B, T, K, E)
            a = np.stack([attention(q[b], k[b], v[b], positions[b], c.attention_scale) for b in range(B)])
            x = x + linear(a.reshape(B, T, H * E), layer.o_proj, layer.o_proj_bias)
            h = rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps)
            return x + gated_mlp(h, layer.gate_proj, layer.up_proj, layer.down_proj, c.hidden_act)


        x = embed(tokens, w.embed_tokens, c.embedding_scale)
        for i, layer in enumerate(w.layers):
            x = decoder_layer(x, layer)
            if i == 0:
                np.testing.assert_allclose(x, x2, rtol=1e-5, atol=1e-6)  # the steps above, once more
        logits = linear(rms_norm(x, w.norm, c.rms_norm_eps), w.lm_head)  # [B, T, V]
        print("logits", logits.shape)
        """),
        md("""
        ## 9. Check: the model computes the same thing

        `prefill_all_logits` runs the model's own forward pass (`refllm/models/llama.py`). With
        the contiguous cache its attention is the NumPy spec we used; with the default paged
        cache it is a Numba kernel reading keys block by block (notebook 03). Both must agree
        with our walk-through.
        """),
        code("""
        contiguous_cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
        paged_cache = model.create_kv_cache(CacheConfig(kind="paged", block_size=4))
        spec = model.prefill_all_logits(tokens, contiguous_cache, range(T))  # [B, T, V]
        paged = model.prefill_all_logits(tokens, paged_cache, range(T))
        np.testing.assert_allclose(logits, spec, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(logits, paged, rtol=1e-5, atol=1e-5)
        print("max |difference|: spec", np.abs(logits - spec).max(), " paged", np.abs(logits - paged).max())
        """),
        md("""
        The last row of the logits is the model's guess for the token after the prompt: the
        softmax of it is the distribution that sampling (notebook 04) draws from.
        """),
        code("""
        probs = softmax(logits[0, -1])  # [V]
        top = np.argsort(-probs)[:5]
        print("most likely next ids:", top, "with probabilities", probs[top].round(3))
        """),
    ]


# --------------------------------------------------------------------------------------------
# 02 RoPE
# --------------------------------------------------------------------------------------------


def rope() -> list:
    return [
        md(r"""
        # 02 · Rotary position embedding (RoPE)

        RoPE tells attention where tokens are by rotating queries and keys. Pair $i$ of a
        head's dimensions, $(x_i, x_{i+E/2})$, at position $p$ is turned by the angle
        $p f_i$:

        $$f_i = \theta^{-2i/E}, \qquad
          \begin{pmatrix} x'_i \\ x'_{i+E/2} \end{pmatrix} =
          \begin{pmatrix} \cos p f_i & -\sin p f_i \\ \sin p f_i & \cos p f_i \end{pmatrix}
          \begin{pmatrix} x_i \\ x_{i+E/2} \end{pmatrix}$$

        Rotating both by their own positions leaves $q(p) \cdot k(p')$ a function of
        $p - p'$ only. Code: `refllm/nn/rope.py`; more in `docs/layers/rope.md`.
        """),
        code("""
        %matplotlib inline
        import matplotlib.pyplot as plt
        import numpy as np

        from refllm.config import RopeParameters
        from refllm.nn.rope import apply_rope, cos_sin, inverse_frequencies

        E, CONTEXT = 64, 1024  # head dim; the context length the model was trained on
        """),
        md(r"""
        ## Frequencies and what scaling does to them

        Pair 0 turns fastest (one radian per position); the last pairs turn so slowly that
        their **wavelength** $2\pi / f_i$ is longer than any sequence seen in training. To
        run past the trained context, models rescale the frequencies:

        | `rope_type` | frequencies |
        |---|---|
        | `linear` | $f_i / s$: every position squeezed by the factor $s$ |
        | `dynamic` | $\theta$ grows with the sequence length $L$ once it passes $L_0$: $\theta' = \theta\,(sL/L_0 - (s-1))^{E/(E-2)}$ |
        | `llama3` | wavelengths longer than $L_0$/`low_freq_factor` divided by $s$, shorter than $L_0$/`high_freq_factor` kept, a smooth blend between |
        | `yarn` | a ramp from kept (fast pairs) to divided by $s$ (slow pairs), and cos/sin scaled by $0.1 \ln s + 1$ |
        """),
        code("""
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
        """),
        code("""
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
        """),
        md(r"""
        Read the right panel from left to right: `linear` slows every pair by $s$ (so local
        detail blurs too); `llama3` and `yarn` keep the fast pairs, which resolve nearby
        tokens, and slow only the pairs whose wavelength passes the trained context;
        `dynamic` raises $\theta$, which slows the later pairs more than the early ones.

        The same facts as assertions:
        """),
        code("""
        np.testing.assert_allclose(frequencies["linear"], default / s, rtol=1e-6)
        wavelength = 2 * np.pi / default
        short, long = wavelength < CONTEXT / 4.0, wavelength > CONTEXT / 1.0  # llama3's two bands
        np.testing.assert_allclose(frequencies["llama3"][short], default[short], rtol=1e-6)
        np.testing.assert_allclose(frequencies["llama3"][long], default[long] / s, rtol=1e-6)
        assert frequencies["yarn"][0] == default[0] and np.isclose(frequencies["yarn"][-1], default[-1] / s, rtol=1e-5)
        dynamic = frequencies["dynamic, 4096 tokens"]
        assert dynamic[0] == default[0] and np.all(dynamic[1:] < default[1:])
        """),
        md(r"""
        ## The score depends on distance only

        Take one query vector and one key vector, put the query at position $p$ and the key
        at $p - d$, and compute $q(p)\cdot k(p-d)$ for many distances $d$. Doing it at two
        different absolute positions gives the same curve. With $q = k = (1, \dots, 1)$ the
        score is $2\sum_i \cos(d f_i)$: largest at $d = 0$ and decaying, with ripples, as the
        pairs fall out of phase.
        """),
        code("""
        def scores_by_distance(q, k, inv_freq, query_position, distances):
            \"\"\"q, k: [E] -> q(p) . k(p - d) for each d in distances.\"\"\"
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
        """),
        md(r"""
        Linear scaling by $s$ turns distance $d$ into $d / s$, so its curve is the default one
        stretched $s$ times along the distance axis: 4096 positions look like 1024. `llama3`
        keeps the fast pairs, so at short range it follows the default curve closely.
        """),
        code("""
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
        """),
    ]


# --------------------------------------------------------------------------------------------
# 03 the paged KV arena
# --------------------------------------------------------------------------------------------


def paged_arena() -> list:
    return [
        md(r"""
        # 03 · The paged KV arena

        During generation every layer keeps the keys and values of all earlier tokens: the
        KV cache. `PagedKVArena` (`refllm/kv/paged.py`, `docs/kv-cache.md`) stores them for
        many sequences in two flat arrays cut into fixed-size **blocks**:

        $$\texttt{k}, \texttt{v} : [L, N, S, K, E] \qquad \text{(layers, blocks, slots per block, KV heads, head dim)}$$

        A sequence is a **block table** (block ids in position order) and a length.
        Position $p$ lives in block $\text{table}[\lfloor p / S \rfloor]$ at offset
        $p \bmod S$, so sequences grow a block at a time and never move.

        Here a tiny arena of 8 blocks of 4 slots. Instead of a model's keys, each slot stores
        two numbers we can read back: which sequence wrote it, and at which position.
        """),
        code("""
        %matplotlib inline
        import matplotlib.pyplot as plt
        import numpy as np

        from refllm.kv import CacheConfig, CacheShape
        from refllm.kv.paged import PagedKVArena
        from refllm.nn.attention import attention

        shape = CacheShape(num_layers=1, num_kv_heads=1, head_dim=2)
        arena = PagedKVArena(shape, CacheConfig(block_size=4, num_blocks=8), max_context=32)
        print("arena.k", arena.k.shape, "  [L, N, S, K, E]")
        NAMES = {1: "a", 2: "b", 3: "c"}  # sequence ids are ints


        def append(seq, n):
            \"\"\"Feed n tokens to sequence seq as a forward pass does: reserve, write every layer, commit.\"\"\"
            start = arena.length(seq) if seq in arena else 0
            arena.reserve([seq], n)  # takes blocks (and copies shared ones); all or nothing
            kv = np.zeros((1, n, 1, 2), np.float32)  # [B, T, K, E]
            kv[0, :, 0, 0] = seq  # who wrote the slot ...
            kv[0, :, 0, 1] = np.arange(start, start + n)  # ... and for which position
            for layer in range(shape.num_layers):
                arena.write(layer, [seq], kv, kv)
            arena.commit([seq], n)  # the n tokens now count in the length
        """),
        md("""
        A picture helps: on the left the block tables (one row per sequence, one cell per
        table entry, the block id inside), on the right the blocks themselves, each slot
        labelled with what `arena.k` holds there (`a9` = sequence a, position 9), each block
        with its reference count: how many tables hold it (held blocks have a bold outline).
        """),
        code("""
        def draw(arena, title):
            seqs = arena.sequence_ids()
            N, S = arena.num_blocks, arena.block_size
            colors = plt.get_cmap("tab10")
            fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw=dict(width_ratios=[1, 2]))
            width = max(len(arena.block_table(s)) for s in seqs)
            for row, seq in enumerate(seqs):
                for col, block in enumerate(arena.block_table(seq)):
                    left.add_patch(plt.Rectangle((col, row), 1, 1, color=colors(block), alpha=0.5))
                    left.text(col + 0.5, row + 0.5, str(block), ha="center", va="center", fontsize=12)
            left.set(xlim=(0, width), ylim=(len(seqs), 0), title="block tables", xlabel="table index  (position // S)")
            left.set_xticks(np.arange(width) + 0.5, range(width))
            left.set_yticks(np.arange(len(seqs)) + 0.5, [f"{NAMES[s]} (length {arena.length(s)})" for s in seqs])
            filled = np.zeros((N, S), bool)  # slots below some holder's length
            for seq in seqs:
                for p in range(arena.length(seq)):
                    filled[arena.block_table(seq)[p // S], p % S] = True
            for block in range(N):
                held = arena.refcounts[block] > 0
                right.add_patch(plt.Rectangle((0, block), S, 1, fill=False, linewidth=2 if held else 0.5))
                for slot in range(S):
                    writer, position = arena.k[0, block, slot, 0]
                    if filled[block, slot]:
                        right.add_patch(plt.Rectangle((slot, block), 1, 1, color=colors(block), alpha=0.5))
                        label = f"{NAMES[int(writer)]}{int(position)}"
                        right.text(slot + 0.5, block + 0.5, label, ha="center", va="center")
                right.text(S + 0.2, block + 0.5, f"refs {arena.refcounts[block]}", va="center")
            right.set(xlim=(0, S + 1.2), ylim=(N, 0), title="arena.k[0]: blocks x slots", xlabel="slot (position % S)")
            right.set_xticks(np.arange(S) + 0.5, range(S))
            right.set_yticks(np.arange(N) + 0.5, [f"block {b}" for b in range(N)])
            fig.suptitle(title)
            plt.tight_layout()
            plt.show()
        """),
        md("""
        ## Two sequences grow side by side

        Sequence a takes 4 tokens, then b takes 4, then a 6 more and b 2 more. Blocks are
        taken from the free list as they are needed, so the two interleave in the arena;
        the block tables keep each one in order.
        """),
        code("""
        append(1, 4); append(2, 4); append(1, 6); append(2, 2)
        print("a:", arena.block_table(1), " b:", arena.block_table(2))
        draw(arena, "a (10 tokens) and b (6 tokens)")
        """),
        md(r"""
        The attention kernels find position $p$ through the table, at
        $\text{slot}(p) = \text{table}[\lfloor p / S \rfloor] \cdot S + p \bmod S$. Gathering a's
        blocks in table order gives its keys in position order:
        """),
        code("""
        table, length = arena.block_table(1), arena.length(1)
        keys = arena.k[0, table].reshape(-1, 1, 2)  # [blocks, S, K, E] -> [blocks * S, K, E]
        print("positions of a's keys, gathered in table order:", keys[:length, 0, 1].astype(int))
        assert np.array_equal(keys[:length, 0, 1], np.arange(length))
        """),
        md("""
        The kernel never gathers: it reads the blocks in place. A forward pass reserves room
        for the new token, writes its key and value, and asks for attention *before* it
        commits. Doing the same for one query (two heads sharing the KV head) at position 10
        gives what the NumPy spec attention gives over the gathered keys. Without a
        `commit` the token never counts: a still holds 10 tokens afterwards.
        """),
        code("""
        q = np.array([[[[0.3, -0.2], [0.1, 0.4]]]], np.float32)  # [B, T, H, E]: one token, 2 query heads
        kv = np.array([[[[1, length]]]], np.float32)  # [B, T, K, E]: its key and value
        arena.reserve([1], 1)
        arena.write(0, [1], kv, kv)
        paged = arena.attention(0, [1], q, scale=0.5)  # [B, T, H, E]: keys 0..10 read through the table

        table = arena.block_table(1)
        gathered_k = arena.k[0, table].reshape(-1, 1, 2)[: length + 1]  # [11, K, E]
        gathered_v = arena.v[0, table].reshape(-1, 1, 2)[: length + 1]
        spec = attention(q[0], gathered_k, gathered_v, query_positions=np.array([length]), scale=0.5)
        np.testing.assert_allclose(paged[0], spec, rtol=1e-5, atol=1e-6)
        assert arena.length(1) == 10
        print("paged kernel:", paged.ravel().round(4), " spec:", spec.ravel().round(4))
        """),
        md("""
        ## Fork: share, don't copy

        `fork(a, c)` gives c a's whole history without copying a byte: c's table is a's
        table, and every block's reference count goes up.
        """),
        code("""
        arena.fork(1, 3)
        print("c:", arena.block_table(3), " refcounts:", arena.refcounts)
        assert list(arena.block_table(3)) == list(arena.block_table(1))
        draw(arena, "after fork(a, c): blocks 0, 2 and 3 are held twice")
        """),
        md("""
        ## Copy-on-write

        Now c takes 2 tokens of its own. They belong in block 3 (slots 2 and 3), but block 3
        is shared with a, whose tokens must not change. So `reserve` first copies the shared
        block into a free one and puts the copy in c's table; a keeps the original. Full
        blocks 0 and 2 stay shared.
        """),
        code("""
        before = arena.k[:, 3].copy()
        append(3, 2)
        print("a:", arena.block_table(1), " c:", arena.block_table(3), " refcounts:", arena.refcounts)
        assert arena.block_table(3)[2] != 3 and arena.refcounts[3] == 1
        assert np.array_equal(arena.k[:, 3], before)  # a's block is untouched
        draw(arena, "c appended 2 tokens: its part of block 3 was copied first")
        """),
        md("""
        `stats()` summarises the arena. `unused_slots` counts reserved-but-empty slots in
        used blocks (the last block of each sequence is usually part-filled);
        `fragmentation` is their share.
        """),
        code("""
        stats = arena.stats()
        print(stats)
        assert stats.blocks_used + stats.blocks_free == stats.blocks_total
        assert stats.blocks_shared == 2 and stats.tokens == 10 + 6 + 12
        """),
        md(r"""
        ## Prefix caching

        Chats and few-shot prompts repeat long prefixes. A full block whose token ids are
        known gets a key that names the whole prefix up to its end,

        $$\text{key}_i = \text{sha256}(\text{key}_{i-1} \,\|\, \text{tokens of block } i),$$

        and `match_prefix(seq, prompt)` starts a new sequence on the cached blocks its
        prompt begins with, returning how many tokens need no computing.
        """),
        code("""
        arena.reset()
        shared = list(range(100, 112))  # a 12-token prefix: 3 full blocks
        prompt_a, prompt_b = shared + [7, 8], shared + [9]

        cached = arena.match_prefix(1, prompt_a)  # nothing cached yet
        append(1, len(prompt_a) - cached)
        print("a: cached", cached, "of", len(prompt_a), "tokens; table", arena.block_table(1))

        cached = arena.match_prefix(2, prompt_b)  # a's first 3 blocks match
        append(2, len(prompt_b) - cached)
        print("b: cached", cached, "of", len(prompt_b), "tokens; table", arena.block_table(2))
        assert cached == 12 and list(arena.block_table(2)[:3]) == list(arena.block_table(1)[:3])
        draw(arena, "b starts on a's cached prefix: 12 tokens it never computes")
        print(arena.stats())
        """),
        md("""
        Freeing a sequence does not forget its keyed blocks: with no holder they are
        *cached and unreferenced*, counted as free, and reused by a later prompt with the
        same prefix until a reservation needs the space.
        """),
        code("""
        arena.free(1); arena.free(2)
        stats = arena.stats()
        print(f"blocks used {stats.blocks_used}, free {stats.blocks_free} (of which cached {stats.blocks_cached}),"
              f" prefix hit tokens so far {stats.prefix_hit_tokens}")
        assert stats.blocks_used == 0 and stats.blocks_cached == 3
        print("a third prompt with the same prefix: cached", arena.match_prefix(3, shared + [1]), "tokens")
        """),
    ]


# --------------------------------------------------------------------------------------------
# 04 sampling and speculative decoding
# --------------------------------------------------------------------------------------------


def sampling() -> list:
    return [
        md(r"""
        # 04 · Sampling and speculative decoding

        The model gives logits $z \in \mathbb{R}^V$; choosing the next token is a chain of
        pure functions over them (`refllm/runtime/sampling.py`):

        $$p_i = \frac{e^{z_i / T}}{\sum_j e^{z_j / T}} \quad\text{(temperature } T\text{)}
          \;\to\; \text{top-}k \;\to\; \text{top-}p \;\to\; \text{min-}p \;\to\; \text{draw}$$

        This notebook takes the next-token distribution of a real model, SmolLM2-135M-Instruct
        (about 100 MB, fetched once into `~/.cache/refllm`), and shows what each knob does to it.
        """),
        code("""
        %matplotlib inline
        import time

        import matplotlib.pyplot as plt
        import numpy as np

        import refllm
        from refllm.runtime import LLM, LLMExecutor, PromptLookupDrafter, SamplingParams, speculative_generate
        from refllm.runtime.sampling import probabilities

        model = refllm.load_model("smollm2-135m")
        tokenizer = model.tokenizer
        llm = LLM(model)
        prompt = "Once upon a time, in a small village, there lived a"
        logits = llm.prefill("prompt", tokenizer.encode(prompt))  # [V]
        llm.release("prompt")
        print(prompt, "...", logits.shape)
        """),
        md(r"""
        ## Temperature, top-p, min-p

        - **Temperature** divides the logits by $T$: $T < 1$ sharpens, $T > 1$ flattens.
        - **Top-p** keeps the most likely tokens until their probability reaches $p$, and
          renormalises.
        - **Min-p** keeps the tokens with $p_i \ge p_\text{min} \cdot \max_j p_j$: the cut
          follows the model's confidence.

        `probabilities(logits, params)` is the exact distribution the sampler draws from.
        """),
        code("""
        settings = {
            "T = 1 (the model's own)": SamplingParams(temperature=1.0),
            "T = 0.5": SamplingParams(temperature=0.5),
            "T = 1.5": SamplingParams(temperature=1.5),
            "top-p = 0.5": SamplingParams(temperature=1.0, top_p=0.5),
            "min-p = 0.2": SamplingParams(temperature=1.0, min_p=0.2),
        }
        dists = {name: probabilities(logits, params) for name, params in settings.items()}  # each [V]
        raw = dists["T = 1 (the model's own)"]
        shown = np.argsort(-raw)[:15]  # the 15 most likely tokens
        labels = [repr(tokenizer.decode([int(t)])) for t in shown]

        fig, axes = plt.subplots(1, len(dists), figsize=(16, 4), sharey=True)
        for ax, (name, p) in zip(axes, dists.items()):
            ax.bar(range(len(shown)), raw[shown], color="lightgrey", label="T = 1")
            ax.bar(range(len(shown)), p[shown], color="tab:blue", alpha=0.7, label=name)
            ax.set_title(f"{name}\\n{np.count_nonzero(p)} tokens possible", fontsize=10)
            ax.set_xticks(range(len(shown)), labels, rotation=90, fontsize=8)
        axes[0].set_ylabel("probability")
        plt.tight_layout()
        plt.show()
        """),
        md("""
        What the pictures show, checked:
        """),
        code("""
        for name, p in dists.items():
            assert np.isclose(p.sum(), 1.0)
        assert dists["T = 0.5"].max() > raw.max() > dists["T = 1.5"].max()  # sharper, flatter

        kept = np.flatnonzero(dists["top-p = 0.5"])
        order = kept[np.argsort(-raw[kept])]
        assert raw[order].sum() >= 0.5 > raw[order[:-1]].sum()  # the smallest set reaching p
        np.testing.assert_allclose(dists["top-p = 0.5"][kept], raw[kept] / raw[kept].sum(), rtol=1e-6)

        kept = np.flatnonzero(dists["min-p = 0.2"])
        assert np.all(raw[kept] >= 0.2 * raw.max()) and np.all(np.delete(raw, kept) < 0.2 * raw.max())
        print("top-p keeps", np.count_nonzero(dists["top-p = 0.5"]), "tokens; min-p keeps", len(kept))
        """),
        md(r"""
        ## Speculative decoding

        Each decoding step runs the whole model for one token. Speculative decoding lets a
        cheap **drafter** guess $k$ tokens and checks them all in *one* forward pass of the
        model over $k + 1$ positions. Greedy decoding accepts drafts from the left while they
        equal the model's argmax, then adds the model's own next token, so its output is
        exactly plain greedy decoding's, in fewer forward passes when the guesses are good.

        The `PromptLookupDrafter` needs no second model: it finds the last few tokens
        earlier in the context and proposes what followed them there. Text that repeats
        the prompt drafts well.

        What it saves is forward passes. Whether that saves time depends on the machine:
        a pass over $k + 1$ positions costs more than a pass over one, and a busy CPU makes
        any timing noisy (`benchmarks/bench_runtime.py` measures the speed-up properly).
        """),
        code("""
        request = "Repeat after me: Alice was beginning to get very tired of sitting by her sister on the bank."
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": request}]),
                                      add_special_tokens=False)
        max_tokens, eos = 32, model.metadata.eos_token_ids


        def plain_greedy(prompt_ids, max_tokens):
            \"\"\"One forward pass per token: the argmax after the prompt, then after each new token.\"\"\"
            logits, tokens, passes = llm.prefill("plain", prompt_ids), [], 1
            while (token := int(np.argmax(logits))) not in eos:
                tokens.append(token)
                if len(tokens) == max_tokens:
                    break
                logits = llm.decode("plain", token, len(prompt_ids) + len(tokens) - 1)
                passes += 1
            llm.release("plain")
            return tokens, passes


        start = time.perf_counter()
        expected, passes = plain_greedy(prompt_ids, max_tokens)
        plain_seconds = time.perf_counter() - start

        params = SamplingParams(max_tokens=max_tokens)  # temperature 0: greedy
        start = time.perf_counter()
        result = await speculative_generate(LLMExecutor(llm), PromptLookupDrafter(), prompt_ids, params, k=4,
                                            tokenizer=tokenizer)
        speculative_seconds = time.perf_counter() - start

        print(repr(result.text))
        print(f"plain greedy: {len(expected)} tokens in {passes} forward passes, {plain_seconds:.2f} s")
        print(f"speculative:  {len(result.token_ids)} tokens in {1 + result.rounds} forward passes,"
              f" {result.accepted} of {result.drafted} drafts accepted, {speculative_seconds:.2f} s")
        assert result.token_ids == expected  # the same tokens, exactly
        assert 1 + result.rounds < passes
        """),
    ]


# --------------------------------------------------------------------------------------------
# 05 chat
# --------------------------------------------------------------------------------------------


def chat() -> list:
    return [
        md("""
        # 05 · Chat with SmolLM2 on the CPU

        SmolLM2-135M-Instruct is small enough to chat with in plain NumPy. The pieces:

        1. the model's **chat template** (Jinja, stored in the GGUF file) renders the
           conversation into one prompt string;
        2. the tokenizer turns it into ids;
        3. the **Engine** (`refllm/runtime/engine.py`) schedules the request, runs prefill
           and decode steps over the paged KV arena, samples, and streams text back as
           it is generated, never half a character at a time.
        """),
        code("""
        import refllm
        from refllm.runtime import LLM, Engine, LLMExecutor, SamplingParams

        model = refllm.load_model("smollm2-135m")
        tokenizer = model.tokenizer
        llm = LLM(model)
        engine = Engine(LLMExecutor(llm), tokenizer)

        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = tokenizer.apply_chat_template(messages)  # add_generation_prompt=True: ends where the reply starts
        print(prompt)
        """),
        md("""
        Each delta the engine yields carries the text its token added. Greedy decoding
        (temperature 0, the default) makes the replies reproducible; up to 24 tokens each.
        """),
        code("""
        def reply(messages, max_tokens=24):
            \"\"\"Stream the assistant's answer to the conversation so far; append it to messages.\"\"\"
            prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
            text = ""
            for delta in engine.submit(prompt_ids, SamplingParams(max_tokens=max_tokens)):
                print(delta.text, end="", flush=True)
                text += delta.text
            print(f"\\n[{delta.finish_reason}]")
            messages.append({"role": "assistant", "content": text})
            return text


        answer = reply(messages)
        assert "Paris" in answer
        """),
        md("""
        A second turn. The new prompt starts with the whole first exchange, and the arena
        still holds those blocks (prefix caching, notebook 03), so only the new part is
        computed.
        """),
        code("""
        hits_before = llm.stats().prefix_hit_tokens
        messages.append({"role": "user", "content": "And of Italy?"})
        answer = reply(messages)
        reused = llm.stats().prefix_hit_tokens - hits_before
        print(f"prompt tokens served from the prefix cache: {reused}")
        assert answer and reused > 0
        """),
        code("""
        print(engine.stats)
        engine.close()
        """),
    ]


# --------------------------------------------------------------------------------------------
# 06 the oracle
# --------------------------------------------------------------------------------------------


def oracle() -> list:
    return [
        md("""
        # 06 · Checking your own backend with the oracle

        You wrote an inference engine: a C++ port, a GPU kernel, a quantized path. How do
        you know it computes the same function as the model? `refllm.testing` draws tiny
        random models with every flag that changes the arithmetic, runs your backend and
        refllm's float32 spec on the same weights and inputs, and reports the smallest case
        where they disagree, down to the layer where they part (`docs/oracle.md`).

        Here the backend is a Llama forward pass written in NumPy straight from the
        checkpoint's tensors (Hugging Face names), with attention as its own code.
        """),
        code("""
        import numpy as np

        from refllm.nn.linear import linear
        from refllm.nn.mlp import gated_mlp
        from refllm.nn.norm import rms_norm
        from refllm.nn.rope import apply_rope, cos_sin, inverse_frequencies
        from refllm.testing import Backend, Checkpoint, ConformanceFailure, check_logits, run_conformance
        from refllm.testing.configs import tiny_config_json


        class ToyBackend(Backend):
            \"\"\"Llama from checkpoint.tensors; no KV cache: every call recomputes the whole prompt.\"\"\"

            has_cache_ids = False  # so only the stateless properties (logits, greedy) apply

            def __init__(self, checkpoint):
                self.c, self.t = checkpoint.config, checkpoint.tensors
                self.name = type(self).__name__  # how reports name the backend

            def attention(self, q, k, v):
                \"\"\"q: [T, H, E], k/v: [T, K, E] -> [T, H, E], causal.\"\"\"
                group = q.shape[1] // k.shape[1]
                k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h reads KV head h // group
                scores = np.einsum("the,she->hts", q, k) * np.float32(self.c.attention_scale)
                T = len(q)
                scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
                weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights /= weights.sum(axis=-1, keepdims=True)
                return np.einsum("hts,she->the", weights, v)

            def layer_states(self, tokens):
                \"\"\"The hidden states entering layer 0 and leaving each layer: [L + 1, T, D].\"\"\"
                c, t, T = self.c, self.t, len(tokens)
                inv_freq, factor = inverse_frequencies(c.rope_for_layer(0), c.head_dim, c.max_position_embeddings, T)
                cos, sin = cos_sin(inv_freq, np.arange(T)[None], factor)  # [1, T, E]
                x = t["model.embed_tokens.weight"][tokens]  # [T, D]
                states = [x]
                for i in range(c.num_hidden_layers):
                    p = f"model.layers.{i}."

                    def proj(name, heads):
                        y = linear(h, t[p + f"self_attn.{name}.weight"], t.get(p + f"self_attn.{name}.bias"))
                        return y.reshape(1, T, heads, c.head_dim)

                    h = rms_norm(x, t[p + "input_layernorm.weight"], c.rms_norm_eps)
                    q = apply_rope(proj("q_proj", c.num_attention_heads), cos, sin)[0]
                    k = apply_rope(proj("k_proj", c.num_key_value_heads), cos, sin)[0]
                    v = proj("v_proj", c.num_key_value_heads)[0]
                    a = self.attention(q, k, v).reshape(T, -1)
                    x = x + linear(a, t[p + "self_attn.o_proj.weight"], t.get(p + "self_attn.o_proj.bias"))
                    h = rms_norm(x, t[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
                    mlp = [t[p + f"mlp.{name}.weight"] for name in ("gate_proj", "up_proj", "down_proj")]
                    biases = [t.get(p + f"mlp.{name}.bias") for name in ("gate_proj", "up_proj", "down_proj")]
                    x = x + gated_mlp(h, *mlp, c.hidden_act, *biases)
                    states.append(x)
                return np.stack(states)

            def all_logits(self, tokens):
                \"\"\"[T] -> [T, V].\"\"\"
                tied = self.c.tie_word_embeddings  # tied: the head is the embedding table, whatever else is stored
                head = self.t["model.embed_tokens.weight" if tied else "lm_head.weight"]
                x = rms_norm(self.layer_states(tokens)[-1], self.t["model.norm.weight"], self.c.rms_norm_eps)
                return linear(x, head)
        """),
        md(r"""
        ## A bug that hides well

        Grouped-query attention shares each KV head among $H/K$ query heads: head $h$ reads
        KV head $\lfloor h / (H/K) \rfloor$. Write `np.tile` where `np.repeat` belongs and
        head $h$ reads KV head $h \bmod K$ instead. Shapes stay right, outputs stay plausible,
        and a model with $K = H$ (or $K = 1$) cannot tell.
        """),
        code("""
        class BrokenToyBackend(ToyBackend):
            def attention(self, q, k, v):
                group = q.shape[1] // k.shape[1]
                return super().attention(q, np.tile(k, (1, group, 1)), np.tile(v, (1, group, 1)))  # the bug


        checkpoint = Checkpoint.random(tiny_config_json("llama"), seed=0)  # H = 4, K = 2
        check_logits(ToyBackend(checkpoint), checkpoint, tokens=[3, 17, 5, 9, 22])
        print("the correct backend passes one hand-picked case")
        try:
            check_logits(BrokenToyBackend(checkpoint), checkpoint, tokens=[3, 17, 5, 9, 22])
        except ConformanceFailure as failure:
            what = next(line for line in str(failure).splitlines() if line.strip().startswith("what:"))
            print("the broken one does not:", what.strip())
        """),
        md("""
        ## The conformance run

        `run_conformance(factory)` calls `factory(checkpoint)` for each drawn model and checks
        every property that applies (this backend has no KV cache, so those needing cache
        ids are skipped). Our toy knows Llama only, so we draw Llama models: with and
        without biases, tied embeddings, every RoPE scaling, head dims apart from
        `D / H`, GQA ratios 1 to 3. A fixed seed makes the run reproducible; one thread is
        fastest for tiny models.

        First the broken backend. Hypothesis finds a failing case and shrinks it; the report
        names the model, the input, the first layer that diverges, and the comparison that failed.
        """),
        code("""
        options = dict(architectures=("llama",), max_examples=10, seed=0, threads=1)
        results = run_conformance(BrokenToyBackend, properties=["logits"], **options)
        print(results[0].detail)
        assert results[0].status == "failed" and "layer 0" in results[0].detail
        """),
        md("""
        The report points at layer 0 of a model with fewer KV heads than query heads, on a
        single token: attention's head mapping. (The `repro` line re-runs exactly that case
        from a shell when the factory lives in a module Python can import; here it was
        defined in the notebook.) Now the correct backend, on every property:
        """),
        code("""
        results = run_conformance(ToyBackend, **options)
        for result in results:
            print(result.line())
        assert {r.name for r in results if r.status == "passed"} == {"logits", "greedy"}
        assert all(r.status == "skipped" for r in results if r.name not in ("logits", "greedy"))
        """),
        md("""
        Green. The same run from the command line, against a factory in your own package:

        ```
        pytest -p refllm.testing.plugin --refllm-backend mybackend.oracle:factory --refllm-arch llama
        ```

        A backend with a KV cache (the `prefill` / `decode` / `release` contract) also gets
        the properties skipped here: chunked prefill, decode, batching, forks, truncation,
        memory reuse and error handling.
        """),
    ]


NOTEBOOKS = {
    "01_forward_pass.ipynb": forward_pass,
    "02_rope.ipynb": rope,
    "03_paged_kv_arena.ipynb": paged_arena,
    "04_sampling_and_speculative.ipynb": sampling,
    "05_chat_smollm2.ipynb": chat,
    "06_oracle.ipynb": oracle,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name``, with fixed cell ids and no outputs."""
    cells = NOTEBOOKS[name]()
    for index, cell in enumerate(cells):
        cell["id"] = f"cell-{index:02d}"
    metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    notebook = new_notebook(cells=cells, metadata=metadata)
    nbformat.validate(notebook)
    return notebook


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def content(notebook: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """What a notebook says, free of formatting and outputs: (id, cell type, source) per cell."""
    return [(cell.get("id", ""), cell.cell_type, cell.source) for cell in notebook.cells]


def is_current(name: str) -> bool:
    """Whether the file ``name`` holds exactly the cells this source builds, and no outputs."""
    path = HERE / name
    if not path.exists():
        return False
    notebook = nbformat.read(path, as_version=4)
    has_outputs = any(cell.get("outputs") or cell.get("execution_count") for cell in notebook.cells)
    return not has_outputs and content(notebook) == content(build(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        if args.check:
            if not is_current(name):
                stale.append(name)
        else:
            (HERE / name).write_text(render(name), encoding="utf-8")
            print(f"wrote notebooks/{name}")
    if stale:
        print(f"out of date (run python notebooks/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
