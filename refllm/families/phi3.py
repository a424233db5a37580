"""Phi-3: config.json to ``ModelConfig`` fields, and llama.cpp's phi3 files.

Mistral's keys, with q/k/v stored as one ``qkv_proj`` and gate/up as one
``gate_up_proj`` (split at load, so the forward pass sees Llama's layout), and
RoPE over a part of each head (``partial_rotary_factor``).
"""

from __future__ import annotations

from typing import Any

from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
from refllm.families.keys import HFKeys
from refllm.families.llama import read_mistral


def read_phi3(keys: HFKeys) -> dict[str, Any]:
    return read_mistral(keys) | dict(fused_qkv=True, fused_gate_up=True)


def phi3_file(facts: GgufFacts) -> dict[str, Any]:
    return {"model_type": "phi3", "sliding_window": facts.window}


ARCHITECTURES = (
    Architecture("phi3", read_phi3, "Phi3ForCausalLM", tiny_config=dict(partial_rotary_factor=0.5)),
)
# The fused [gate | up] projection is stored whole as ffn_up.
GGUF = (GgufArchitecture("phi3", phi3_file, layer_names={"ffn_up": "mlp.gate_up_proj"}),)
