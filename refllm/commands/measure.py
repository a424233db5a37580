"""``refllm info`` and ``refllm bench``: what a model is and needs, and how fast it runs here."""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import Counter

import numba
import numpy as np

from refllm import progress
from refllm.commands import common
from refllm.errors import InvalidInputError
from refllm.io.gguf import GGUFSource
from refllm.kv import CacheConfig
from refllm.kv.base import blocks_for
from refllm.machine import cpu_name, seconds_since_start, thread_settings, vector_extensions
from refllm.memory import available_memory, peak_memory, weight_bytes
from refllm.models.contract import ModelSource
from refllm.models.decoder import cache_shape_for
from refllm.moe_parameters import GroupedExperts
from refllm.runtime.llm import LLM

# ---- info --------------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    source = common.open_model(args.model)
    c = source.config
    context = args.context or c.context_length
    if context > c.context_length:
        raise InvalidInputError(f"--context {context} is longer than {args.model}'s context of {c.context_length}")
    kv_per_token = cache_shape_for(c).bytes_per_token
    block_size = CacheConfig().block_size
    kv = blocks_for(context, block_size) * block_size * kv_per_token
    dequantized = weight_bytes(source, quantized=False)
    stored = weight_bytes(source, quantized=True)  # what generate and chat load: the blocks a kernel reads kept
    available = available_memory()
    tokenizer = source.tokenizer
    file, tensor_types = _storage(source)
    if stored < dequantized:
        weights = f"{common.size(stored)} as stored, quantized (generate, chat); {common.size(dequantized)} dequantized"
        weights += " to float32 (--dequantize, serve, perplexity, embed)"
        memory = (
            f"{common.size(stored + kv)} for a run: its quantized weights and the KV cache"
            f" (peak about {common.size(peak_memory(source, True, kv))} with the runtime);"
            f" {common.size(dequantized + kv)} with --dequantize"
        )
    else:
        weights = f"{common.size(dequantized)} as float32"
        memory = f"{common.size(dequantized + kv)} for a run: its float32 weights and the KV cache"
    rows = {
        "model": args.model,
        "architecture": f"{c.model_type}: {c.num_hidden_layers} layers, hidden size {c.hidden_size}",
        "recipe": c.describe(),  # a line per part
        "parameters": f"{c.num_parameters:,} ({c.num_parameters / 1e6:.1f} M)",
        **({} if c.experts is None else {"experts": _experts(c)}),
        **({} if getattr(source, "multimodal", None) is None else {"vision": _vision(source.multimodal)}),
        "vocabulary": f"{c.vocab_size:,} tokens",
        "context": f"{c.context_length:,} tokens",
        "file": file,
        "tensors": tensor_types,
        "tokenizer": "none" if tokenizer is None else f"chat template: {'yes' if tokenizer.chat_template else 'no'}",
        "weights": weights,
        "KV cache": f"{common.size(kv_per_token)} per token; {common.size(kv)} for {context:,} tokens",
        "memory": memory + ("" if available is None else f"; {common.size(available)} available"),
    }
    width = max(map(len, rows))
    for key, value in rows.items():
        for line_key, line in zip([key, *[""] * len(value)], value if isinstance(value, list) else [value]):
            print(f"{line_key:<{width}}  {line}")
    return 0


def _vision(m) -> str:
    """A vision-language model's row: the tower, how patches become image tokens, and its parameters."""
    v = m.vision
    merge = f"{m.connector.value} by {m.scale}"
    return (
        f"{m.model_type}: SigLIP of {v.num_hidden_layers} layers, width {v.hidden_size}, {v.grid_side}x{v.grid_side}"
        f" patches of {v.patch_size} px; {m.tokens_per_image} image tokens per tile ({merge});"
        f" {m.num_parameters:,} parameters"
    )


def _experts(c) -> str:
    """A mixture of experts' row: experts per sparse layer, experts per token, parameters one token reads."""
    experts = c.experts
    sparse = sum(c.is_sparse(layer) for layer in range(c.num_hidden_layers))
    shared = experts.num_shared_experts if isinstance(experts, GroupedExperts) else 0  # every token runs them
    return (
        f"{experts.num_experts} per sparse layer ({sparse} of {c.num_hidden_layers} layers), {experts.experts_per_token}"
        f" per token{f' plus {shared} shared' if shared else ''}:"
        f" {c.active_parameters:,} parameters active per token ({c.active_parameters / 1e6:.1f} M)"
    )


def _storage(source: ModelSource) -> tuple[str, str]:
    """-> (file format, size on disk and path; how many tensors of each type: GGML type or safetensors dtype)."""
    if isinstance(source, GGUFSource):
        kind, path, files = "GGUF", source.path, {source.path}
        types = Counter(tensor.type.name for tensor in source.header.tensors)
    else:
        entries = source.checkpoint.entries.values()
        kind, path, files = "safetensors", source.directory, {entry.file for entry in entries}
        types = Counter(entry.dtype for entry in entries)
    counts = ", ".join(f"{n} {name}" for name, n in types.most_common())
    return f"{kind}, {common.size(sum(f.stat().st_size for f in files))}: {path}", counts


# ---- bench -------------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    prompt_len, new_tokens, batches = args.prompt_tokens, args.new_tokens, args.batch
    model = common.load(
        args.model,
        text=False,
        quantized=not args.dequantize,
        activations=args.activations,
        context=prompt_len + new_tokens,
        context_flag="--prompt-tokens plus --new-tokens,",
    )
    block_size = CacheConfig().block_size
    blocks = max(batches) * blocks_for(prompt_len + new_tokens, block_size)
    llm = LLM(model, CacheConfig(block_size=block_size, num_blocks=blocks, prefix_caching=False))
    prompts = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(max(batches), prompt_len))
    decode_rates = {}
    with progress.task("benchmarking", total=1 + len(batches) * new_tokens, unit="step") as bar:
        _greedy(llm, prompts[:1], 1)  # the first token: kernels compiled or loaded, every weight touched
        first_token = seconds_since_start()
        start = time.perf_counter()
        int(np.argmax(llm.prefill(0, prompts[0])))
        prefill_seconds = time.perf_counter() - start
        llm.reset()
        bar.update()
        for batch in batches:
            seconds = _greedy(llm, prompts[:batch], new_tokens, bar.update)
            decode_rates[batch] = batch * new_tokens / seconds
    c = model.config
    print(f"machine   {cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}")
    print(f"vectors   {' '.join(vector_extensions()) or 'unknown'}")
    print(f"software  Python {platform.python_version()}, NumPy {np.__version__}, Numba {numba.__version__}")
    print(f"threads   {thread_settings()}")
    weights = "quantized matrices" if common.has_quantized_weights(model) else "float32 weights"
    print(f"model     {args.model}: {c.model_type}, {c.num_parameters:,} parameters, {weights}")
    if first_token is not None:
        print(
            f"first     token {first_token:.1f} s after the process started (imports, loading the model,"
            " its kernels compiled or loaded from Numba's cache, the prompt)"
        )
    print(
        f"prefill   {prompt_len} tokens in {prefill_seconds:.2f} s: {prompt_len / prefill_seconds:.1f} tokens/s"
        f" (time to first token {prefill_seconds:.2f} s)"
    )
    print(f"decode    {new_tokens} tokens per sequence after a {prompt_len}-token prompt")
    print(f"{'batch':>10}  {'tokens/s':>9}  {'per sequence':>12}  {f'vs batch {batches[0]}':>10}")
    for batch, rate in decode_rates.items():
        speedup = rate / decode_rates[batches[0]]
        print(f"{batch:>10}  {rate:>9.1f}  {rate / batch:>12.1f}  {speedup:>9.2f}x")
    return 0


def _greedy(llm: LLM, prompts: np.ndarray, new_tokens: int, advance=lambda: None) -> float:
    """Prefill each row of prompts [B, T], then decode ``new_tokens`` greedy steps as one batch -> decode seconds."""
    tokens = [int(np.argmax(llm.prefill(b, prompt))) for b, prompt in enumerate(prompts)]
    start = time.perf_counter()
    for step in range(new_tokens):
        rows = llm.decode_batch([(b, token, prompts.shape[1] + step) for b, token in enumerate(tokens)])
        tokens = [int(np.argmax(row)) for row in rows]
        advance()
    seconds = time.perf_counter() - start
    llm.reset()
    return seconds
