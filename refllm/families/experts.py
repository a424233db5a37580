"""What the mixture-of-experts families share: their GGUF files' expert metadata.

llama.cpp's converter (``convert_hf_to_gguf.py``) stacks each sparse layer's experts
into one tensor per projection and names them after gguf-py's ``tensor_mapping.py``:

    blk.N.ffn_gate_inp    [X, D]      the router             -> mlp.gate.weight
    blk.N.ffn_gate_exps   [X, M, D]   every expert's gate    -> mlp.experts.gate_proj.weight
    blk.N.ffn_up_exps     [X, M, D]   every expert's up      -> mlp.experts.up_proj.weight
    blk.N.ffn_down_exps   [X, D, M]   every expert's down    -> mlp.experts.down_proj.weight

(the "stacked" layout of ``refllm/models/expert_weights.py``). Mixtral is stored as a
``llama`` file with ``llama.expert_count`` set (its q/k rows permuted like any llama
file's); Qwen3-MoE as ``qwen3moe``. gpt-oss files (``gpt-oss``) hold their experts in
MXFP4, a block format refllm does not dequantize, and are refused as an unsupported
architecture.
"""

from __future__ import annotations

from typing import Any

from refllm.families.family import GgufFacts

ROUTER_SUFFIX = ".mlp.gate.weight"


def gguf_moe_keys(facts: GgufFacts, model_type: str) -> dict[str, Any]:
    """config.json keys of a mixture of experts, from ``{arch}.expert_*`` metadata; {} for a dense file."""
    arch = facts.architecture
    if facts.value(f"{arch}.expert_count") is None:
        return {}
    return dict(
        model_type=model_type,
        num_local_experts=facts.size(f"{arch}.expert_count"),
        num_experts_per_tok=facts.size(f"{arch}.expert_used_count"),
    )


def routed_layers(facts: GgufFacts) -> set[int]:
    """The layers whose router a GGUF file holds (model.layers.N.mlp.gate.weight)."""
    return {int(name.split(".")[2]) for name in facts.tensor_names if name.endswith(ROUTER_SUFFIX)}
