"""Hugging Face checkpoints written as GGUF files the way llama.cpp's ``convert_hf_to_gguf.py`` writes them.

``convert`` uses llama.cpp's metadata keys, gguf's own tensor-name map, the q/k row permutation
of ``llama`` and ``smollm3`` files, the +1 on Gemma's norm weights and the experts stacked into
one tensor per projection: loading the result must give back the model transformers' reference
outputs were recorded from (tests/io/test_gguf_source.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np

from refllm import ModelConfig
from refllm.io.gguf import permute
from refllm.io.safetensors import HFDirectorySource
from tests.helpers.paths import HF_DATA

GGUF_ARCHITECTURES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3_text": "gemma3",
    "gemma2": "gemma2", "smollm3": "smollm3", "olmo2": "olmo2",
    "mixtral": "llama", "qwen3_moe": "qwen3moe",  # convert_hf_to_gguf.py writes Mixtral as llama with experts
}  # fmt: skip


def convert(case: str | Path, path, tensor_type: str = "F32", *, skip: tuple[str, ...] = (), extra=None, more=None):
    """Write the Hugging Face fixture ``case`` (or the model directory at a Path) as a GGUF file at ``path``, as
    llama.cpp would; ``more(writer)``, if given, writes more metadata (a tokenizer, say)."""
    source = HFDirectorySource(case if isinstance(case, Path) else HF_DATA / case)
    c = source.config
    a = c.attention
    arch = GGUF_ARCHITECTURES[c.model_type]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.mlp.intermediate_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_head_count(a.num_heads)
    writer.add_head_count_kv(a.num_kv_heads)
    writer.add_layer_norm_rms_eps(c.norms.eps)
    writer.add_key_length(a.head_dim)
    writer.add_value_length(a.head_dim)
    writer.add_bos_token_id(c.bos_token_id)
    writer.add_eos_token_id(c.eos_token_ids[0])
    global_rope = c.rope["full_attention"] if "full_attention" in c.rope else next(iter(c.rope.values()))
    writer.add_rope_freq_base(global_rope.theta)
    if global_rope.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(global_rope.factor)
    if arch not in ("gemma3", "gemma2"):
        writer.add_rope_dimension_count(int(a.head_dim * global_rope.partial_rotary_factor))
    if arch == "phi3":
        writer.add_rope_scaling_orig_ctx_len(global_rope.original_max_position_embeddings)
    if arch in ("phi3", "gemma3", "gemma2"):
        writer.add_sliding_window(c.sliding_window or 0)
    if c.final_logit_softcapping:
        writer.add_final_logit_softcapping(c.final_logit_softcapping)
    if a.softcap:
        writer.add_attn_logit_softcapping(a.softcap)
    if c.experts is not None:
        writer.add_expert_count(c.experts.num_experts)
        writer.add_expert_used_count(c.experts.experts_per_token)
        if arch == "qwen3moe":
            writer.add_expert_feed_forward_length(c.experts.moe_intermediate_size)
            writer.add_expert_weights_norm(c.experts.norm_topk_prob)
    for key, value in (extra or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    if more is not None:
        more(writer)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    # gguf's qwen3moe map has no dense MLP (llama.cpp builds every qwen3moe layer sparse); a dense
    # layer of a model with mlp_only_layers takes the names every other architecture gives it
    dense_names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    for name, tensor in _experts_stacked(source):
        suffixes = (".weight", ".bias")
        gguf_name = names.get_name(name, try_suffixes=suffixes) or dense_names.get_name(name, try_suffixes=suffixes)
        if gguf_name in skip:
            continue
        data, kwargs = _stored(_converted(arch, c, name, tensor), tensor_type)
        writer.add_tensor(gguf_name, data, **kwargs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_EXPERT = re.compile(r"(model\.layers\.\d+\.)(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight")
_STACKED_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's names of its projections


def _experts_stacked(source):
    """(name, tensor) of a checkpoint, each layer's per-expert projections stacked into one [X, ...] tensor
    per projection under the names gguf's tensor map gives ffn_{gate,up,down}_exps, as the converter does."""
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name in source.tensor_names():
        match = _EXPERT.fullmatch(name)
        if match is None:
            yield name, source.tensor(name)
            continue
        prefix, expert, projection = match.groups()
        stacked_name = f"{prefix}mlp.experts.{_STACKED_NAMES.get(projection, projection)}.weight"
        stacks.setdefault(stacked_name, {})[int(expert)] = source.tensor(name)
    for name, experts in stacks.items():
        yield name, np.stack([experts[e] for e in sorted(experts)])


def _converted(arch: str, c: ModelConfig, name: str, weights: np.ndarray) -> np.ndarray:
    """What convert_hf_to_gguf.py's modify_tensors does to a tensor before storing it."""
    if arch in ("llama", "smollm3") and ".q_proj." in name:
        return permute(weights, c.attention.num_heads)  # LlamaModel.permute(data, n_head, n_head)
    if arch in ("llama", "smollm3") and ".k_proj." in name:
        return permute(weights, c.attention.num_kv_heads)  # LlamaModel.permute(data, n_head, n_kv_head)
    if arch in ("gemma3", "gemma2") and name.endswith("norm.weight"):
        return weights + np.float32(1.0)  # Gemma3Model, Gemma2Model: data_torch + 1
    return weights


def _stored(weights: np.ndarray, tensor_type: str) -> tuple[np.ndarray, dict]:
    """The array and add_tensor arguments that store ``weights`` as ``tensor_type`` (1-D tensors stay F32)."""
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    if weights.ndim == 1 or tensor_type == "F32":
        return (weights, {})
    if tensor_type == "F16":
        return (weights.astype(np.float16), {})
    qtype = gguf.GGMLQuantizationType[tensor_type]
    return (gguf.quants.quantize(weights, qtype), {"raw_dtype": qtype})


def float32_eps(config: ModelConfig) -> ModelConfig:
    """``config`` with its norms' epsilon rounded to float32, as a GGUF file stores it."""
    return config.with_overrides(norms=replace(config.norms, eps=float(np.float32(config.norms.eps))))
