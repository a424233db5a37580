"""A llama.cpp model run op by op through the scheduler's eval callback (``cb_eval``), and what that shows:
the hidden states after each layer and around its attention and MLP (for failure reports), and every
matrix product recomputed from its own inputs with ggml's arithmetic (``products.py``), so that a kernel
that is off by 1e-3 shows as the one op that is not bit-identical.

llama.cpp names the nodes it builds: ``embd`` (the embeddings looked up), then per layer i ``attn_norm-i``
(what enters the attention), ``ffn_norm-i`` (what enters the MLP), ``ffn_out-i`` (what leaves it) and
``l_out-i`` (the layer's output). What leaves the attention is the other operand of the residual sum that adds the layer's
input back. ``alter`` rewrites a node's output before later nodes read it: the way a test injects a broken op.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from refllm.testing.ggml.blocks import BLOCKS, type_name
from refllm.testing.ggml.dispatch import x86_kernel
from refllm.testing.ggml.library import installed_library
from refllm.testing.ggml.products import spec_product

F32 = 0


class _Tensor(ctypes.Structure):  # struct ggml_tensor (ggml.h), as far as these fields
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]  # fmt: skip


@dataclass(frozen=True)
class Product:
    weight_type: str
    weights: np.ndarray  # [N, row bytes] uint8
    x: np.ndarray  # [T, K] float32, the activations as the product read them
    buffer: str  # the weight's buffer: "CPU_REPACK" where llama.cpp repacked it


@dataclass
class Node:
    index: int  # the order llama.cpp computed it in
    name: str
    op: str  # ggml's op name: MUL_MAT, ADD, RMS_NORM, ...
    value: np.ndarray | None  # [rows, ne0] float32 (rows = ne1 * ne2 * ne3), where contiguous float32
    address: int  # the tensor's address, by which other nodes name it as a source
    sources: tuple[int, ...]
    product: Product | None = None  # a MUL_MAT of a quantized weight


def _contiguous_f32(t: _Tensor) -> bool:
    return t.type == F32 and t.nb[0] == 4 and all(t.nb[i] == t.nb[i - 1] * t.ne[i - 1] for i in range(1, 4))


def _float_view(t: _Tensor) -> np.ndarray:
    rows = t.ne[1] * t.ne[2] * t.ne[3]
    return np.ctypeslib.as_array((ctypes.c_float * (rows * t.ne[0])).from_address(t.data)).reshape(rows, t.ne[0])


def _product(t: _Tensor, buffer_name: Callable, stored: dict) -> Product | None:
    weight, x = (_Tensor.from_address(t.src[i]) for i in (0, 1))
    if weight.type == F32 or type_name(weight.type) not in BLOCKS or not _contiguous_f32(x):
        return None
    # the blocks as the file has them: a repacked weight's memory holds them interleaved
    weights = np.asarray(stored[weight.name.decode()].data).reshape(weight.ne[1], weight.nb[1])
    return Product(type_name(weight.type), weights, _float_view(x).copy(), buffer_name(weight.buffer).decode())


def run_graph(path: str | Path, tokens: Sequence[int], alter: Callable[[Node], np.ndarray | None] | None = None,
              kv_float32: bool = True, repack: bool = True, threads: int = 1) -> tuple[list[Node], np.ndarray]:
    """Prefill ``tokens`` in one batch -> (every node as computed, in order; logits [T, V])."""  # fmt: skip
    import llama_cpp as lc

    stored = {tensor.name: tensor for tensor in GGUFReader(str(path)).tensors}
    library = installed_library()
    op_name, buffer_name = library.base.ggml_op_name, library.base.ggml_backend_buffer_name
    nodes: list[Node] = []
    errors: list[BaseException] = []

    def observe(pointer, ask, _user_data):
        if ask:
            return True  # see every node: llama.cpp then computes the graph one node at a time
        try:
            t = _Tensor.from_address(pointer)
            product = _product(t, buffer_name, stored) if op_name(t.op) == b"MUL_MAT" else None
            value = _float_view(t).copy() if _contiguous_f32(t) else None
            node = Node(len(nodes), t.name.decode(), op_name(t.op).decode(), value, pointer,
                        tuple(s for s in t.src if s), product)  # fmt: skip
            nodes.append(node)
            replacement = alter(node) if alter and node.value is not None else None
            if replacement is not None:
                _float_view(t)[:] = replacement
                node.value = np.array(replacement, np.float32)
        except BaseException as error:  # an exception cannot cross into C: raised after the run
            errors.append(error)
        return True

    callback = lc.ggml_backend_sched_eval_callback(observe)
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # where llama-cpp-python sends llama.cpp's log
    model_params = lc.llama_model_default_params()
    model_params.use_extra_bufts = repack
    model = lc.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise ValueError(f"llama.cpp could not load {path}")
    params = lc.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = max(len(tokens), 8)
    params.n_threads = params.n_threads_batch = threads
    params.cb_eval, params.cb_eval_user_data = callback, None
    # off, as llama_cpp.Llama has it by default (on, the attention outputs moved by ~3e-4 of their size)
    params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if kv_float32:
        params.type_k = params.type_v = F32
    context = lc.llama_init_from_model(model, params)
    batch = lc.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(token), i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        if lc.llama_decode(context, batch) != 0:
            raise ValueError("llama_decode failed")
        vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(lc.llama_get_logits(context), shape=(len(tokens), vocab)).copy()
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(context)
        lc.llama_model_free(model)
    if errors:
        raise errors[0]
    return nodes, logits


def layer_points(nodes: list[Node]) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    """-> (hidden states [L + 1, T, D]: the embeddings, then each layer's output; per layer, what enters
    and leaves its attention and MLP, as ``refllm.testing.layer_trace.SUBLAYER_POINTS`` names them)."""
    named = {node.name: node for node in reversed(nodes)}  # a name's first node (reshapes may repeat it)
    by_address = {node.address: node for node in nodes}
    states, sublayers = [named.get("inp_embd") or named["embd"]], []
    for i in range(sum(node.name.startswith("l_out-") for node in nodes)):
        # the layer's input, and its rows picked for output (the last layer picks them: all, in order, here)
        layer_input = {states[-1].address} | {
            node.address for node in nodes if node.op == "GET_ROWS" and node.sources[0] == states[-1].address
        }
        attention_input = named[f"attn_norm-{i}"]
        residual = next(node for node in nodes[attention_input.index:]
                        if node.op == "ADD" and layer_input & set(node.sources))  # fmt: skip
        attention_output = by_address[next(s for s in residual.sources if s not in layer_input)]
        sublayers.append({
            "attention input": attention_input.value, "attention output": attention_output.value,
            "MLP input": named[f"ffn_norm-{i}"].value, "MLP output": named[f"ffn_out-{i}"].value,
        })  # fmt: skip
        states.append(named[f"l_out-{i}"])
    return np.stack([node.value for node in states]), sublayers


@dataclass(frozen=True)
class ProductCheck:
    node: str  # llama.cpp's name of the product, e.g. "ffn_down-1"
    weight_type: str
    kernel: str  # dispatch.x86_kernel's answer
    buffer: str  # where llama.cpp keeps the weight: "CPU_REPACK" for a repacked one
    identical: bool | None  # None: the kernel is not one specified here
    largest_difference: float = 0.0


def check_products(nodes: list[Node], repack: bool = True) -> list[ProductCheck]:
    """Every quantized matrix product recomputed with ggml's arithmetic from the inputs llama.cpp gave it."""
    isa = installed_library().isa()
    checks = []
    for node in nodes:
        product = node.product
        if product is None or node.value is None:
            continue
        kernel = x86_kernel(product.weight_type, len(product.weights), len(product.x), isa, repack)
        want = spec_product(kernel, product.weight_type, product.weights, product.x)
        if want is None:
            checks.append(ProductCheck(node.name, product.weight_type, kernel, product.buffer, None))
            continue
        difference = float(np.abs(want.astype(np.float64) - node.value).max())
        identical = np.array_equal(want, node.value)
        checks.append(ProductCheck(node.name, product.weight_type, kernel, product.buffer, identical, difference))
    return checks
