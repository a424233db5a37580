"""Greedy goldens for the catalog's real GGUF models, recorded with Hugging Face transformers.

Run ``python tests/tools/make_gguf_goldens.py`` (needs torch, transformers and
accelerate; the models are pulled into ``$REFLLM_HOME`` if absent) to rewrite
``tests/data/gguf/<model>.json``. transformers reads the GGUF file on its own:
it dequantizes with gguf, undoes llama.cpp's q/k permutation and Gemma's +1
itself, and takes Gemma 3's missing hyper-parameters from its config
defaults, so it is an independent oracle for ``refllm/io/gguf.py``.

For each prompt the file records the prompt's token ids (from transformers'
tokenizer, built from the GGUF), the greedy continuation of ``NEW_TOKENS``
tokens decoded through transformers' KV cache in a written-out loop
(``generate`` would apply logits processors), the top-5 ids and logits at each
step (to tell near-ties from real divergence), and the first step's logits at
its top-64 ids plus 64 fixed random ones. The model runs in float32 with eager
attention.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.helpers

from tests.helpers.paths import GGUF_GOLDENS  # noqa: E402
from tests.helpers.real_models import CHAT_MESSAGES, real_model_path  # noqa: E402

NEW_TOKENS = 40  # past the ~20 tokens after which a wrong RoPE layout turns to gibberish
TOP_K = 5
FIRST_STEP_TOP = 64
FIRST_STEP_SAMPLED = 64
SEED = 1234

PLAIN_PROMPTS = {
    "capital": "The capital of France is",
    "story": "Once upon a time, in a small village by the sea, there lived",
    "code": "def fibonacci(n):\n",
    "list": "Here are three tips for staying healthy:\n1.",
}
# Gemma 3 270M is the base model: its GGUF carries no chat template, so it has no chat prompt.
MODELS = {"smollm2-135m": True, "gemma3-270m": False}  # name -> record the chat prompt


def load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval(), tokenizer


def chat_template(path: Path) -> str:
    """The chat template stored in the GGUF file itself."""
    import gguf

    return gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()


def greedy(model, prompt_ids: list[int], vocab_size: int) -> dict:
    """Greedy decoding through transformers' KV cache, one token a step, no logits processors."""
    import torch

    sampled_ids = np.random.default_rng(SEED).choice(vocab_size, FIRST_STEP_SAMPLED, replace=False)
    tokens, top_ids, top_logits = [], [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        for step in range(NEW_TOKENS):
            logits = out.logits[0, -1].float().numpy()
            if step == 0:
                ids = np.concatenate([np.argsort(-logits, kind="stable")[:FIRST_STEP_TOP], sampled_ids])
                first_step = {"ids": ids.tolist(), "logits": logits[ids].tolist()}
            order = np.argsort(-logits, kind="stable")[:TOP_K]
            top_ids.append(order.tolist())
            top_logits.append(logits[order].tolist())
            tokens.append(int(order[0]))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return {"greedy_ids": tokens, "top_ids": top_ids, "top_logits": top_logits, "first_step": first_step}


def record(name: str, with_chat: bool) -> None:
    from importlib.metadata import version

    path = real_model_path(name)
    model, tokenizer = load(path)
    prompts = {key: (text, tokenizer(text).input_ids) for key, text in PLAIN_PROMPTS.items()}
    if with_chat:
        tokenizer.chat_template = chat_template(path)
        text = tokenizer.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
        prompts["chat"] = (text, tokenizer(text, add_special_tokens=False).input_ids)
    cases = []
    for key, (text, ids) in prompts.items():
        result = greedy(model, list(ids), model.config.vocab_size)
        result["greedy_text"] = tokenizer.decode(result["greedy_ids"])
        kind = "chat" if key == "chat" else "plain"
        cases.append({"name": key, "kind": kind, "text": text, "prompt_ids": list(ids)} | result)
        print(f"{name} {key}: {result['greedy_text']!r}")
    golden = {
        "model": name,
        "file": path.name,
        "recorded_with": {package: version(package) for package in ("transformers", "torch", "gguf")},
        "dtype": "float32",
        "attention": "eager",
        "new_tokens": NEW_TOKENS,
        "top_k": TOP_K,
        "prompts": cases,
    }
    GGUF_GOLDENS.mkdir(parents=True, exist_ok=True)
    (GGUF_GOLDENS / f"{name}.json").write_text(json.dumps(golden, indent=1) + "\n")


def main(names: list[str]) -> None:
    for name in names or list(MODELS):
        record(name, MODELS[name])


if __name__ == "__main__":
    main(sys.argv[1:])
