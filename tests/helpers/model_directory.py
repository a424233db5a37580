"""A tiny model on disk, as a person would point the command line or the server at one.

``write_tiny_model(path)`` writes a random-weight Llama as a Hugging Face directory, with a
byte-level BPE tokenizer trained in memory on ``CORPUS`` and a ChatML chat template, so every
command over it runs in well under a second. The ``tiny`` fixture (tests/conftest.py) is one per
test module.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from safetensors.numpy import save_file
from tokenizers import decoders, models, pre_tokenizers, trainers

from refllm import ModelConfig
from refllm.models.random import random_tensors

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today?",
    "tiny models say odd things",
]


def write_tiny_model(path: Path, chat_template: str | None = CHATML) -> Path:
    """A random-weight Llama directory: config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(CORPUS, trainer)
    path.mkdir(parents=True)
    backend.save(str(path / "tokenizer.json"))
    tokenizer_config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "add_bos_token": True}
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = dict(
        model_type="llama",
        vocab_size=backend.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        bos_token_id=backend.token_to_id("<s>"),
        eos_token_id=backend.token_to_id("<|im_end|>"),
    )
    (path / "config.json").write_text(json.dumps(config))
    save_file(random_tensors(ModelConfig.from_hf(config), seed=3, std=0.3), str(path / "model.safetensors"))
    return path
