# %% [markdown]
# # 04 · Sampling and speculative decoding
#
# The model gives logits $z \in \mathbb{R}^V$; choosing the next token is a chain of
# pure functions over them (`refllm/runtime/sampling.py`):
#
# $$p_i = \frac{e^{z_i / T}}{\sum_j e^{z_j / T}} \quad\text{(temperature } T\text{)}
#   \;\to\; \text{top-}k \;\to\; \text{top-}p \;\to\; \text{min-}p \;\to\; \text{draw}$$
#
# This notebook takes the next-token distribution of a real model, SmolLM2-135M-Instruct
# (about 100 MB, fetched once into `~/.cache/refllm`), and shows what each knob does to it.

# %%
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

# %% [markdown]
# ## Temperature, top-p, min-p
#
# - **Temperature** divides the logits by $T$: $T < 1$ sharpens, $T > 1$ flattens.
# - **Top-p** keeps the most likely tokens until their probability reaches $p$, and
#   renormalises.
# - **Min-p** keeps the tokens with $p_i \ge p_\text{min} \cdot \max_j p_j$: the cut
#   follows the model's confidence.
#
# `probabilities(logits, params)` is the exact distribution the sampler draws from.

# %%
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
    ax.set_title(f"{name}\n{np.count_nonzero(p)} tokens possible", fontsize=10)
    ax.set_xticks(range(len(shown)), labels, rotation=90, fontsize=8)
axes[0].set_ylabel("probability")
plt.tight_layout()
plt.show()

# %% [markdown]
# What the pictures show, checked:

# %%
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

# %% [markdown]
# ## Speculative decoding
#
# Each decoding step runs the whole model for one token. Speculative decoding lets a
# cheap **drafter** guess $k$ tokens and checks them all in *one* forward pass of the
# model over $k + 1$ positions. Greedy decoding accepts drafts from the left while they
# equal the model's argmax, then adds the model's own next token, so its output is
# exactly plain greedy decoding's, in fewer forward passes when the guesses are good.
#
# The `PromptLookupDrafter` needs no second model: it finds the last few tokens
# earlier in the context and proposes what followed them there. Text that repeats
# the prompt drafts well.
#
# What it saves is forward passes. Whether that saves time depends on the machine:
# a pass over $k + 1$ positions costs more than a pass over one, and a busy CPU makes
# any timing noisy (`benchmarks/bench_runtime.py` measures the speed-up properly).

# %%
request = "Repeat after me: Alice was beginning to get very tired of sitting by her sister on the bank."
prompt_ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": request}]),
                              add_special_tokens=False)
max_tokens, eos = 32, model.metadata.eos_token_ids


def plain_greedy(prompt_ids, max_tokens):
    """One forward pass per token: the argmax after the prompt, then after each new token."""
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
