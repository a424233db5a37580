"""llama.cpp as a backend, through llama-cpp-python (``pip install "refllm[llamacpp]"``).

    pytest -p refllm.testing.plugin --refllm-backend refllm.testing.llamacpp:llamacpp_backend \\
        --refllm-arch llama,qwen2,qwen3,phi3

``llamacpp_backend(checkpoint)`` writes the drawn checkpoint as a GGUF file
with ``gguf``'s writer (float32 or float16 tensors, the metadata llama.cpp
reads, a placeholder vocabulary of the right size: the kit feeds token ids,
never text) and opens one ``llama_cpp.Llama`` context per cache id, fed with
``eval`` and read from ``scores``; with float32 tensors the KV cache is float32
too (llama.cpp's default is float16), with float16 it is llama.cpp's default. ``truncate`` rolls a context back
(``n_tokens``, whose KV llama.cpp drops at the next ``eval``); there is no
``fork`` (the binding has no sequence copy), so ``branches`` is skipped. For failure reports the
hidden states of every layer, and what enters and leaves its attention and MLP, come from a run observed op
by op through llama.cpp's eval callback (``refllm/testing/ggml/graph_trace.py``).

What the adapter cannot express is refused with ``Unsupported`` and the kit
draws another model: Gemma 3 (llama.cpp fixes its layer pattern and local
RoPE base), sliding windows (the llama arch has none), RoPE scalings other
than linear, logit soft-capping, activations other than SiLU, q/k/v biases on
Qwen3, and any file llama.cpp refuses to load (such as MLP biases on Llama). llama.cpp aborts the process on a token
id outside the vocabulary, so the adapter refuses those itself: ``errors``
checks the adapter there, not llama.cpp.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from refllm.errors import InvalidInputError, UnknownSequenceError
from refllm.testing.backends import Backend, Unsupported
from refllm.testing.checkpoint import Checkpoint

ARCHES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}
PER_LAYER = {  # Hugging Face suffix -> GGUF name
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
FILE_TYPES = {"float32": "ALL_F32", "float16": "MOSTLY_F16", "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1",
              "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1", "Q8_0": "MOSTLY_Q8_0", "Q2_K": "MOSTLY_Q2_K",
              "Q3_K": "MOSTLY_Q3_K_M", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K"}  # fmt: skip
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def unsupported_reason(checkpoint: Checkpoint) -> str | None:
    c = checkpoint.config
    if c.model_type not in ARCHES:
        return f"{c.model_type} is not mapped to a llama.cpp architecture here"
    if "sliding_attention" in c.layer_types:
        return "sliding windows"
    if any(p.rope_type not in ("default", "linear") for p in c.rope.values()):
        return "RoPE scaling other than linear"
    if c.final_logit_softcapping or c.attention.softcap:
        return "soft-capping"
    if c.mlp.activation != "silu":
        return f"{c.mlp.activation} (these llama.cpp architectures gate with SiLU)"
    if c.model_type == "qwen3" and c.attention.bias:
        return "q/k/v biases on qwen3"
    return None


def _permute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rotate-half q/k rows (Hugging Face) -> llama.cpp's interleaved pairs, per head (as convert_hf_to_gguf)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf_name: str) -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem in GLOBAL:
        return f"{GLOBAL[stem]}.{kind}"
    _, _, rest = stem.partition("model.layers.")
    layer, _, suffix = rest.partition(".")
    return f"blk.{layer}.{PER_LAYER[suffix]}.{kind}"


def write_gguf(
    checkpoint: Checkpoint, path: str | Path, dtype: str = "float32", encode: Callable | None = None
) -> None:
    """The checkpoint as a GGUF file llama.cpp loads: matrices in ``dtype`` (float32, float16, or a block
    format gguf quantizes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), norms in float32. ``encode(array, dtype)`` ->
    (stored array, ggml type or None), in place of that, decides what each matrix is stored as (a test's
    random blocks of a format gguf cannot quantize, say)."""
    import gguf

    c, arch = checkpoint.config, ARCHES[checkpoint.config.model_type]
    H, K, E = c.attention.num_heads, c.attention.num_kv_heads, c.attention.head_dim
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.mlp.intermediate_size)
    writer.add_head_count(H)
    writer.add_head_count_kv(K)
    writer.add_key_length(E)
    writer.add_value_length(E)
    writer.add_layer_norm_rms_eps(c.norms.eps)
    rope = c.rope_for_layer(0)
    writer.add_rope_freq_base(rope.theta)
    writer.add_rope_dimension_count(int(E * rope.partial_rotary_factor))
    if rope.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope.factor)
    writer.add_tokenizer_model("llama")
    V = c.vocab_size
    writer.add_token_list([f"<t{i}>" for i in range(V)])
    writer.add_token_scores([0.0] * V)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (V - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_file_type(gguf.LlamaFileType[FILE_TYPES[dtype]])
    for name, array in sorted(checkpoint.tensors.items()):
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue  # tied: the head is the embedding table
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = H if ".q_proj." in name else K
            array = _permute_rows(array, heads)
        if array.ndim == 1:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array, np.float32))
        else:
            stored, kind = (encode or _encoded)(array, dtype)
            writer.add_tensor(gguf_name(name), stored, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _encoded(array: np.ndarray, dtype: str) -> tuple[np.ndarray, int | None]:
    """A matrix as ``dtype`` stores it -> (array, ggml type of raw blocks or None)."""
    import gguf

    if dtype in ("float32", "float16"):
        return np.ascontiguousarray(array, dtype), None
    kind = gguf.GGMLQuantizationType[dtype]  # a ggml block format gguf's quantizer writes
    return gguf.quants.quantize(np.asarray(array, np.float32), kind), kind


class LlamaCppBackend(Backend):
    """One llama.cpp context per cache id over a GGUF file; idle contexts are reused."""

    can_truncate = True

    def __init__(self, path: str | Path, vocab_size: int, context: int, kv_float32: bool, name: str = "llama.cpp"):
        self.path, self.vocab_size, self.context, self.name = str(path), vocab_size, context, name
        self.kv_float32 = kv_float32
        # a deliberately broken op, for tests of the failure report: rewrites a node's output (graph_trace.Node ->
        # array or None) in every run, which then goes op by op through the eval callback
        self.alter = None
        self._kv_type = {"type_k": 0, "type_v": 0} if kv_float32 else {}  # GGML_TYPE_F32; llama.cpp's default is F16
        self._contexts: dict[int, object] = {}
        self._idle: list[object] = []

    def _fresh(self):
        from llama_cpp import Llama

        llm = self._idle.pop() if self._idle else Llama(
            self.path, n_ctx=self.context, n_batch=self.context, logits_all=True, n_threads=1, verbose=False,
            **self._kv_type,
        )  # fmt: skip
        llm.reset()
        return llm

    def _checked(self, tokens) -> list[int]:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise InvalidInputError("tokens must hold at least one token id")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidInputError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return tokens

    def _eval(self, llm, tokens) -> np.ndarray:
        start = llm.n_tokens
        llm.eval(self._checked(tokens))
        return np.array(llm.scores[start : llm.n_tokens], np.float32)

    def _run_graph(self, tokens):
        from refllm.testing.ggml.graph_trace import run_graph

        return run_graph(self.path, self._checked(tokens), self.alter, self.kv_float32)

    def layer_states(self, tokens):
        from refllm.testing.ggml.graph_trace import layer_points

        return layer_points(self._run_graph(tokens)[0])[0]

    def sublayer_states(self, tokens):
        from refllm.testing.ggml.graph_trace import layer_points

        return layer_points(self._run_graph(tokens)[0])[1]

    def all_logits(self, tokens):
        if self.alter is not None:
            return self._run_graph(tokens)[1]
        llm = self._fresh()
        try:
            return self._eval(llm, tokens)
        finally:
            self._idle.append(llm)

    def prefill(self, cache_id, tokens):
        self._checked(tokens)
        llm = self._contexts.get(cache_id) or self._fresh()
        self._contexts[cache_id] = llm
        return self._eval(llm, tokens)[-1]

    def _live(self, cache_id):
        if cache_id not in self._contexts:
            raise UnknownSequenceError(f"unknown cache id {cache_id}")
        return self._contexts[cache_id]

    def decode(self, cache_id, token):
        return self._eval(self._live(cache_id), [token])[-1]

    def release(self, cache_id):
        self._idle.append(self._live(cache_id))
        del self._contexts[cache_id]

    def reset(self):
        for cache_id in list(self._contexts):
            self.release(cache_id)

    def truncate(self, cache_id, length):
        llm = self._live(cache_id)
        if not 0 <= length <= llm.n_tokens:
            raise InvalidInputError(f"cannot truncate cache id {cache_id} of {llm.n_tokens} tokens to {length}")
        llm.n_tokens = length


def llamacpp_backend(checkpoint: Checkpoint, dtype: str = "float32") -> LlamaCppBackend:
    """The factory: ``checkpoint`` through llama.cpp (raises ``Unsupported`` for what it cannot express)."""
    reason = unsupported_reason(checkpoint)
    if reason:
        raise Unsupported(f"llama.cpp adapter: {reason}")
    directory = Path(tempfile.mkdtemp(prefix="refllm-gguf-"))
    path = directory / "model.gguf"
    write_gguf(checkpoint, path, dtype)
    c = checkpoint.config
    backend = LlamaCppBackend(path, c.vocab_size, c.max_position_embeddings, dtype == "float32", f"llama.cpp ({dtype})")
    weakref.finalize(backend, shutil.rmtree, directory, ignore_errors=True)
    try:  # load it once: a file llama.cpp refuses shows here
        backend.prefill(0, [0])
    except ValueError as error:
        raise Unsupported(f"llama.cpp does not load this model ({error})") from None
    backend.release(0)
    return backend


def llamacpp_float16(checkpoint: Checkpoint) -> LlamaCppBackend:
    return llamacpp_backend(checkpoint, "float16")
