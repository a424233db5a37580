"""A byte-level BPE tokenizer trained in memory (as Llama 3's and Qwen's are), and a ChatML chat template with
a default system message and generation markers, as Qwen's."""

from __future__ import annotations

import functools

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a test of the tokenizer",
    "system user assistant tool call result answer question",
    "Numbers 0123456789 and punctuation: .,;!?()[]{}<>'\"-_/\\|@#$%^&*+=~`",
] * 5

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, EOT, "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>"]


@functools.cache
def _byte_level_json() -> str:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return backend.to_str()


def byte_level_backend(bos_post_processor: bool = False) -> tokenizers.Tokenizer:
    """A fresh byte-level BPE; with `bos_post_processor` it prepends BOS as Llama 3's tokenizer.json does."""
    backend = tokenizers.Tokenizer.from_str(_byte_level_json())
    if bos_post_processor:
        bos_id = backend.token_to_id(BOS)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return backend


CHATML = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' %}{% continue %}{% endif %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'assistant' %}
        {%- if message.reasoning_content is defined %}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n' }}
        {%- endif %}
        {% generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}
    {%- else %}
        {{- message.content + '<|im_end|>' }}
    {%- endif %}
    {{- '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
