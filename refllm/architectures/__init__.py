"""One reader per architecture family: a config.json dict to the keyword arguments of ``ModelConfig``.

A new family is a module here and a line in ``READERS``; the forward pass reads
only the resulting flags.
"""

from __future__ import annotations

from refllm.architectures.deepseek import read_deepseek_v3
from refllm.architectures.gemma import read_gemma2, read_gemma3, read_gemma3_text
from refllm.architectures.gpt_oss import read_gpt_oss
from refllm.architectures.llama import read_llama, read_mistral, read_phi3, read_qwen
from refllm.architectures.mixtral import read_mixtral
from refllm.architectures.olmo2 import read_olmo2
from refllm.architectures.qwen3_moe import read_qwen3_moe
from refllm.architectures.smollm3 import read_smollm3
from refllm.architectures.vision import read_idefics3

READERS = {  # config.json's model_type -> its reader
    "llama": read_llama,
    "mistral": read_mistral,
    "qwen2": read_qwen,
    "qwen3": read_qwen,
    "phi3": read_phi3,
    "gemma3_text": read_gemma3_text,
    "gemma3": read_gemma3,
    "gemma2": read_gemma2,
    "smollm3": read_smollm3,
    "olmo2": read_olmo2,
    "mixtral": read_mixtral,
    "qwen3_moe": read_qwen3_moe,
    "gpt_oss": read_gpt_oss,
    "deepseek_v3": read_deepseek_v3,
    "idefics3": read_idefics3,  # SmolVLM: its text model here, its vision half in vision.py
}
SUPPORTED_ARCHITECTURES = tuple(READERS)
