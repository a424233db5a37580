"""Mixture-of-experts GGUF files: llama.cpp's expert tensors and metadata, as Hugging Face names and keys.

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

from collections.abc import Callable, Iterable
from typing import Any

EXPERT_LAYER_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
ROUTER_SUFFIX = ".mlp.gate.weight"


def moe_config(arch: str, value: Callable[[str, Any], Any], size: Callable[..., int], tensors: Iterable[str]) -> dict:
    """config.json keys of a mixture of experts, from ``{arch}.expert_*`` metadata; {} for a dense file.

    value(key, default) reads a metadata value; size(key[, default]) a positive integer, refused by name.
    """
    if value(f"{arch}.expert_count", None) is None:
        return {}
    layers = size(f"{arch}.block_count")
    routed = {int(name.split(".")[2]) for name in tensors if name.endswith(ROUTER_SUFFIX)}  # model.layers.N.
    config = dict(
        model_type="mixtral" if arch == "llama" else "qwen3_moe",
        num_local_experts=size(f"{arch}.expert_count"),
        num_experts_per_tok=size(f"{arch}.expert_used_count"),
    )
    if arch == "qwen3moe":
        config |= dict(
            moe_intermediate_size=size(f"{arch}.expert_feed_forward_length"),
            # llama.cpp's qwen3moe graph renormalises unless the file says otherwise
            norm_topk_prob=bool(value(f"{arch}.expert_weights_norm", True)),
            mlp_only_layers=[layer for layer in range(layers) if layer not in routed],
        )
    return config
