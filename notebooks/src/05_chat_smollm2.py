# %% [markdown]
# # 05 · Chat with SmolLM2 on the CPU
#
# SmolLM2-135M-Instruct is small enough to chat with in plain NumPy. The pieces:
#
# 1. the model's **chat template** (Jinja, stored in the GGUF file) renders the
#    conversation into one prompt string;
# 2. the tokenizer turns it into ids;
# 3. the **Engine** (`refllm/runtime/engine.py`) schedules the request, runs prefill
#    and decode steps over the paged KV arena, samples, and streams text back as
#    it is generated, never half a character at a time.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

import refllm
from refllm.runtime import LLM, Engine, LLMExecutor, SamplingParams
from refllm.tracing import trace

model = refllm.load_model("smollm2-135m")
tokenizer = model.tokenizer
llm = LLM(model)
engine = Engine(LLMExecutor(llm), tokenizer)

messages = [{"role": "user", "content": "What is the capital of France?"}]
prompt = tokenizer.apply_chat_template(messages)  # add_generation_prompt=True: ends where the reply starts
print(prompt)

# %% [markdown]
# Each delta the engine yields carries the text its token added. Greedy decoding
# (temperature 0, the default) makes the replies reproducible; up to 24 tokens each.

# %%
def reply(messages, max_tokens=24):
    """Stream the assistant's answer to the conversation so far; append it to messages."""
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    text = ""
    for delta in engine.submit(prompt_ids, SamplingParams(max_tokens=max_tokens)):
        print(delta.text, end="", flush=True)
        text += delta.text
    print(f"\n[{delta.finish_reason}]")
    messages.append({"role": "assistant", "content": text})
    return text


answer = reply(messages)
assert "Paris" in answer

# %% [markdown]
# ## Inside the answer
#
# `refllm.tracing.trace` runs the conversation and the answer through the model once
# more, on the spec ops, keeping what each of the 30 layers computed. Two pictures from
# it (the web page of `refllm serve` draws the same ones, live, beside every answer).
#
# **How sure the model was, layer by layer** (the *logit lens*): each layer's residual
# stream put through the final norm and the LM head, as if the model stopped there. A
# cell is the probability that layer gives the token the model finally wrote. The early
# layers have no idea; the answer forms in the last third.

# %%
prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages[:1]), add_special_tokens=False)
answer_ids = tokenizer.encode(answer, add_special_tokens=False)
traced = trace(model, prompt_ids + answer_ids)
producing = np.arange(len(prompt_ids) - 1, len(prompt_ids) + len(answer_ids) - 1)  # position p wrote token p + 1
words = [tokenizer.decode([i]) for i in answer_ids]

logits = np.stack([traced.lens(layer, producing) for layer in range(len(traced.layers))]).astype(np.float64)
probs = np.exp(logits - logits.max(-1, keepdims=True))
probs /= probs.sum(-1, keepdims=True)  # [L, answer tokens, V]
sure = probs[:, np.arange(len(answer_ids)), answer_ids]  # [L, answer tokens]

fig, ax = plt.subplots(figsize=(9, 5.5))
image = ax.imshow(sure, aspect="auto", cmap="magma", vmin=0, vmax=1, origin="lower")
ax.set_xticks(range(len(words)), [repr(w)[1:-1] for w in words], rotation=60, fontsize=8)
ax.set(xlabel="the token written", ylabel="layer", title="logit lens: each layer's probability of the token written")
fig.colorbar(image, label="probability")
plt.tight_layout()
plt.show()
assert sure[-1].mean() > sure[0].mean()

# %% [markdown]
# **Where it looked**: the attention of one head of a late layer as the answer was
# written, one row per token written, one column per token of the conversation.

# %%
layer, head = 24, 3
conversation = [repr(tokenizer.decode([i]))[1:-1] for i in prompt_ids + answer_ids[:-1]]
weights = traced.layers[layer].attention[head][producing][:, : len(conversation)]
fig, ax = plt.subplots(figsize=(11, 3.6))
image = ax.imshow(weights, aspect="auto", cmap="Blues", vmin=0)
ax.set_xticks(range(len(conversation)), conversation, rotation=90, fontsize=7)
ax.set_yticks(range(len(words)), [repr(w)[1:-1] for w in words], fontsize=7)
ax.set(title=f"layer {layer}, head {head}: what each token written looked at")
fig.colorbar(image, label="attention weight")
plt.tight_layout()
plt.show()

# %% [markdown]
# A second turn. The new prompt starts with the whole first exchange, and the arena
# still holds those blocks (prefix caching, notebook 03), so only the new part is
# computed.

# %%
hits_before = llm.stats().prefix_hit_tokens
messages.append({"role": "user", "content": "And of Italy?"})
answer = reply(messages)
reused = llm.stats().prefix_hit_tokens - hits_before
print(f"prompt tokens served from the prefix cache: {reused}")
assert answer and reused > 0

# %%
print(engine.stats)
engine.close()
