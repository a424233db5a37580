# %% [markdown]
# # 06 · Checking your own backend with the oracle
#
# You wrote an inference engine: a C++ port, a GPU kernel, a quantized path. How do
# you know it computes the same function as the model? `refllm.testing` draws tiny
# random models with every flag that changes the arithmetic, runs your backend and
# refllm's float32 spec on the same weights and inputs, and reports the smallest case
# where they disagree, down to the layer where they part (`docs/oracle.md`).
#
# Here the backend is a Llama forward pass written in NumPy straight from the
# checkpoint's tensors (Hugging Face names), with attention as its own code.

# %%
%matplotlib inline
import functools

import matplotlib.pyplot as plt
import numpy as np

from refllm.nn.linear import linear
from refllm.nn.mlp import MLPWeights, gated, gated_mlp
from refllm.nn.norm import rms_norm
from refllm.nn.rope import apply_rope, cos_sin, inverse_frequencies
from refllm.testing import Backend, Checkpoint, ConformanceFailure, check_logits, run_conformance
from refllm.testing.configs import tiny_config_json


class ToyBackend(Backend):
    """Llama from checkpoint.tensors; no KV cache: every call recomputes the whole prompt."""

    has_cache_ids = False  # so only the stateless properties (logits, long_horizon, greedy) apply

    def __init__(self, checkpoint):
        self.c, self.t = checkpoint.config, checkpoint.tensors
        self.name = type(self).__name__  # how reports name the backend

    def attention(self, q, k, v):
        """q: [T, H, E], k/v: [T, K, E] -> [T, H, E], causal."""
        group = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h reads KV head h // group
        scores = np.einsum("the,she->hts", q, k) * np.float32(self.c.attention.scale)
        T = len(q)
        scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        return np.einsum("hts,she->the", weights, v)

    def layer_states(self, tokens):
        """The hidden states entering layer 0 and leaving each layer: [L + 1, T, D]."""
        c, t, T = self.c, self.t, len(tokens)
        H, K, E, eps = c.attention.num_heads, c.attention.num_kv_heads, c.attention.head_dim, c.norms.eps
        act = functools.partial(gated, activation=c.mlp.activation)
        inv_freq, factor = inverse_frequencies(c.rope_for_layer(0), E, c.max_position_embeddings, T)
        cos, sin = cos_sin(inv_freq, np.arange(T)[None], factor)  # [1, T, E]
        x = t["model.embed_tokens.weight"][tokens]  # [T, D]
        states = [x]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."

            def proj(name, heads):
                y = linear(h, t[p + f"self_attn.{name}.weight"], t.get(p + f"self_attn.{name}.bias"))
                return y.reshape(1, T, heads, E)

            h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
            q = apply_rope(proj("q_proj", H), cos, sin)[0]
            k = apply_rope(proj("k_proj", K), cos, sin)[0]
            v = proj("v_proj", K)[0]
            a = self.attention(q, k, v).reshape(T, -1)
            x = x + linear(a, t[p + "self_attn.o_proj.weight"], t.get(p + "self_attn.o_proj.bias"))
            h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
            mlp = [t[p + f"mlp.{name}.weight"] for name in ("gate_proj", "up_proj", "down_proj")]
            biases = [t.get(p + f"mlp.{name}.bias") for name in ("gate_proj", "up_proj", "down_proj")]
            x = x + gated_mlp(h, MLPWeights(*mlp, *biases), act)
            states.append(x)
        return np.stack(states)

    def all_logits(self, tokens):
        """[T] -> [T, V]."""
        tied = self.c.tie_word_embeddings  # tied: the head is the embedding table, whatever else is stored
        head = self.t["model.embed_tokens.weight" if tied else "lm_head.weight"]
        x = rms_norm(self.layer_states(tokens)[-1], self.t["model.norm.weight"], self.c.norms.eps)
        return linear(x, head)

# %% [markdown]
# ## A bug that hides well
#
# Grouped-query attention shares each KV head among $H/K$ query heads: head $h$ reads
# KV head $\lfloor h / (H/K) \rfloor$. Write `np.tile` where `np.repeat` belongs and
# head $h$ reads KV head $h \bmod K$ instead. Shapes stay right, outputs stay plausible,
# and a model with $K = H$ (or $K = 1$) cannot tell.

# %%
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

# %% [markdown]
# ## Where the two part ways, in a picture
#
# `refllm.tracing.trace` records the reference's residual stream after every layer
# (and every op's output). Setting each backend's hidden states beside it, layer by
# layer, shows what the report will say in words: the broken backend is wrong from
# layer 0 on, the correct one agrees to float32 rounding.

# %%
from refllm.tracing import compare, trace

tokens = [3, 17, 5, 9, 22]
reference = trace(checkpoint.reference(), tokens)
truth = [reference.residual_after(i) for i in range(len(reference.layers))]  # leaving each layer


def layer_errors(backend):
    states = backend.layer_states(np.array(tokens))[1:]  # [L, T, D]: leaving each layer
    return [np.abs(state - expected).max() / np.abs(expected).max() for state, expected in zip(states, truth)]


fig, (by_layer, by_op) = plt.subplots(1, 2, figsize=(11, 3.4))
for backend, style in ((ToyBackend, "o-"), (BrokenToyBackend, "s--")):
    by_layer.semilogy(layer_errors(backend(checkpoint)), style, label=backend.__name__)
by_layer.set_xticks(range(len(truth)), [f"after layer {i}" for i in range(len(truth))])
by_layer.set(ylabel="max relative error", title="each backend's hidden states against the reference")
by_layer.legend()

# The same tool between refllm's float32 and float64 (ground truth) runs: op by op, how rounding grows.
errors = compare(reference, trace(checkpoint.reference("float64"), tokens))
by_op.semilogy([max(error, 1e-12) for _, error in errors], ".-")
by_op.set(xlabel="op, in the order the forward pass runs them", ylabel="relative error",
          title="float32 against float64, op by op")
plt.tight_layout()
plt.show()
assert layer_errors(BrokenToyBackend(checkpoint))[0] > 1e-2 > 1e-4 > max(layer_errors(ToyBackend(checkpoint)))

# %% [markdown]
# ## The conformance run
#
# `run_conformance(factory)` calls `factory(checkpoint)` for each drawn model and checks
# every property that applies (this backend has no KV cache, so those needing cache
# ids are skipped, and `long_horizon` hands it sequences of up to 320 tokens in one
# call). Our toy knows Llama only, so we draw Llama models: with and
# without biases, tied embeddings, every RoPE scaling, head dims apart from
# `D / H`, GQA ratios 1 to 3. A fixed seed makes the run reproducible; one thread is
# fastest for tiny models.
#
# First the broken backend. Hypothesis finds a failing case and shrinks it; the report
# names the model, the input, the first layer that diverges, and the comparison that failed.

# %%
options = dict(architectures=("llama",), max_examples=10, seed=0, threads=1)
results = run_conformance(BrokenToyBackend, properties=["logits"], **options)
print(results[0].detail)
assert results[0].status == "failed" and "layer 0" in results[0].detail

# %% [markdown]
# The report points at layer 0 of a model with fewer KV heads than query heads, on a
# single token: attention's head mapping. (The `repro` line re-runs exactly that case
# from a shell when the factory lives in a module Python can import; here it was
# defined in the notebook.) Now the correct backend, on every property:

# %%
results = run_conformance(ToyBackend, **options)
for result in results:
    print(result.line())
assert {r.name for r in results if r.status == "passed"} == {"logits", "long_horizon", "greedy"}
assert all(r.status == "skipped" for r in results if r.name not in ("logits", "long_horizon", "greedy"))

# %% [markdown]
# Green. The same run from the command line, against a factory in your own package:
#
# ```
# pytest -p refllm.testing.plugin --refllm-backend mybackend.oracle:factory --refllm-arch llama
# ```
#
# A backend with a KV cache (the `prefill` / `decode` / `release` contract) also gets
# the properties skipped here: chunked prefill, decode, batching, forks, truncation,
# memory reuse and error handling.
