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
import refllm
from refllm.runtime import LLM, Engine, LLMExecutor, SamplingParams

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
