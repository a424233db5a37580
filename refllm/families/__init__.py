"""The families refllm runs, one module each: a new family is its module and a line in ``FAMILY_MODULES``.

Each module (``refllm/families/<name>.py``) declares ``ARCHITECTURES``, the
config.json model types it reads (``family.Architecture``), and ``GGUF``, the GGUF
architectures llama.cpp writes its models as (``family.GgufArchitecture``). Twins
share a module: Mistral is Llama's, Qwen3 is Qwen2's.

The two name spaces differ: ``MODEL_TYPES`` is keyed by config.json's
``model_type`` (``gemma3_text``, ``qwen3_moe``), ``GGUF_ARCHITECTURES`` by a GGUF
file's ``general.architecture`` (``gemma3``, ``qwen3moe``).
"""

from __future__ import annotations

import importlib

from refllm.families.family import Architecture, GgufArchitecture

FAMILY_MODULES = (
    "llama",
    "qwen",
    "phi3",
    "gemma",
    "smollm3",
    "olmo2",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
    "deepseek",
)
_MODULES = [importlib.import_module(f"refllm.families.{name}") for name in FAMILY_MODULES]

MODEL_TYPES: dict[str, Architecture] = {a.model_type: a for m in _MODULES for a in m.ARCHITECTURES}
GGUF_ARCHITECTURES: dict[str, GgufArchitecture] = {g.name: g for m in _MODULES for g in getattr(m, "GGUF", ())}
