"""Phi-3: config.json to ``ModelConfig`` fields, its tensors, and llama.cpp's phi3 files.

Mistral's recipe and keys (``refllm/families/llama.py``), RoPE over a part of each
head (``partial_rotary_factor``), and q/k/v stored as one ``qkv_proj`` and gate/up
as one ``gate_up_proj``: split by rows at load, so the forward pass sees Llama's
layout.
"""

from __future__ import annotations

from typing import Any

from refllm.families.family import Architecture, GgufArchitecture, GgufFacts
from refllm.families.keys import HFKeys
from refllm.families.llama import read_mistral
from refllm.families.tables import PRE_NORMS, Tensor, norm_tensors, one, rows

PHI3_RMS_NORM_EPS = 1e-5  # transformers' Phi3Config default


def read_phi3(keys: HFKeys) -> dict[str, Any]:
    return read_mistral(keys, PHI3_RMS_NORM_EPS)


def layer_tensors(c, layer: int, layout: str | None = None) -> list[Tensor]:
    D, F = c.hidden_size, c.mlp.intermediate_size
    H, K, E = c.attention.num_heads, c.attention.num_kv_heads, c.attention.head_dim
    qkv = ("attention.q_proj", "attention.k_proj", "attention.v_proj")
    return [
        Tensor("self_attn.qkv_proj.weight", ((H + 2 * K) * E, D), qkv, rows(H * E, K * E, K * E)),  # [q | k | v]
        one("self_attn.o_proj.weight", (D, H * E), "attention.o_proj"),
        Tensor("mlp.gate_up_proj.weight", (2 * F, D), ("mlp.gate_proj", "mlp.up_proj"), rows(F, F)),  # [gate | up]
        one("mlp.down_proj.weight", (D, F), "mlp.down_proj"),
        *norm_tensors(c, PRE_NORMS),
    ]


def phi3_file(facts: GgufFacts) -> dict[str, Any]:
    return {"model_type": "phi3", "sliding_window": facts.window}


ARCHITECTURES = (
    Architecture(
        "phi3", read_phi3, layer_tensors, "Phi3ForCausalLM", tiny_config=dict(partial_rotary_factor=0.5)
    ),
)
# The fused [gate | up] projection is stored whole as ffn_up.
GGUF = (GgufArchitecture("phi3", phi3_file, layer_names={"ffn_up": "mlp.gate_up_proj"}),)
