"""A llama.cpp run op by op: every quantized matrix product is ggml's arithmetic on its own inputs, bit for bit,
and one that is off by 1e-3 is the one op reported (skips without llama-cpp-python)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from refllm.testing import Checkpoint  # noqa: E402
from refllm.testing.configs import tiny_config_json  # noqa: E402
from refllm.testing.ggml.agreement import random_blocks  # noqa: E402
from refllm.testing.ggml.graph_trace import check_products, layer_points, run_graph  # noqa: E402
from refllm.testing.llamacpp import write_gguf  # noqa: E402

TOKENS = [0, 5, 9, 17, 3, 63, 1]
# rows of 64 and 96 weights: whole blocks of 32; 3 layers
SIZES = {"hidden_size": 64, "intermediate_size": 96, "head_dim": 16, "num_hidden_layers": 3}
# rows of 256 and 512 weights: whole K-quant super-blocks; 70 outputs in the LM head, a ragged tile edge
KQUANT_SIZES = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 70, "attention_bias": False}  # fmt: skip


def quantized_model(tmp_path, arch: str, dtype: str) -> str:
    config = tiny_config_json(arch) | SIZES | {"use_sliding_window": False, "attention_bias": arch != "qwen3"}
    path = str(tmp_path / f"{arch}-{dtype}.gguf")
    write_gguf(Checkpoint.random(config, 0), path, dtype)
    return path


@pytest.mark.parametrize(("arch", "dtype"), [("llama", "Q4_1"), ("qwen2", "Q5_1"), ("qwen3", "Q8_0")])
def test_every_quantized_product_of_a_llama_cpp_run_is_ggml_arithmetic_bit_for_bit(tmp_path, arch, dtype):
    path = quantized_model(tmp_path, arch, dtype)
    for tokens in (TOKENS, TOKENS[:1]):  # a prompt, and one token as a decode step sees it
        checks = check_products(run_graph(path, tokens)[0])
        assert len(checks) == 7 * 3 + 1  # q, k, v, o, gate, up, down per layer; the LM head
        kernel = "llamafile" if dtype == "Q8_0" and len(tokens) > 1 else "vec_dot"  # a prompt's Q8_0: tinyBLAS
        assert {(c.kernel, c.identical) for c in checks} == {(kernel, True)}


def test_a_kernel_off_by_a_thousandth_is_caught_at_its_op(tmp_path):
    path = quantized_model(tmp_path, "llama", "Q4_1")

    def off(node):
        return node.value * np.float32(1 + 1e-3) if (node.name, node.op) == ("ffn_gate-1", "MUL_MAT") else None

    checks = check_products(run_graph(path, TOKENS, alter=off)[0])
    assert [(c.node, c.identical) for c in checks if not c.identical] == [("ffn_gate-1", False)]
    assert 0 < next(c for c in checks if c.node == "ffn_gate-1").largest_difference < 1e-2


@pytest.mark.parametrize("tokens", [1, 5, 17])  # gemv; gemm on 4 rows and gemv on 1; AVX-512 groups of 16
def test_repacked_q4_0_products_are_ggml_arithmetic_and_so_are_they_unpacked(tmp_path, tokens):
    path = quantized_model(tmp_path, "llama", "Q4_0")
    packed = check_products(run_graph(path, (TOKENS * 3)[:tokens])[0])
    assert {(c.kernel, c.buffer, c.identical) for c in packed} == {("repacked", "CPU_REPACK", True)}  # rows of 8
    unpacked = check_products(run_graph(path, [7], repack=False)[0], repack=False)
    assert {(c.kernel, c.buffer, c.identical) for c in unpacked} == {("vec_dot", "CPU_Mapped", True)}  # the file


@pytest.mark.parametrize("kquant", ["Q2_K", "Q4_K"])
def test_repacked_k_quant_products_are_ggml_arithmetic(tmp_path, kquant):
    path = str(tmp_path / f"{kquant}.gguf")
    write_gguf(Checkpoint.random(tiny_config_json("llama") | KQUANT_SIZES, 0), path, kquant, random_blocks(kquant))
    for tokens in (1, 9):
        checks = check_products(run_graph(path, list(range(tokens)))[0])
        head = "vec_dot" if tokens == 1 else "tiled"  # 70 rows, not a multiple of 8: the LM head is not repacked
        assert {(c.kernel, c.identical) for c in checks} == {("repacked", True), (head, True)}


def test_the_layer_points_are_the_hidden_states_of_every_layer(tmp_path):
    path = quantized_model(tmp_path, "llama", "Q4_1")
    nodes, logits = run_graph(path, TOKENS)
    states, sublayers = layer_points(nodes)
    assert states.shape == (SIZES["num_hidden_layers"] + 1, len(TOKENS), SIZES["hidden_size"])
    assert len(sublayers) == SIZES["num_hidden_layers"]
    for layer, inside in enumerate(sublayers):  # the layer's output is its MLP's input residual plus its output
        residual = states[layer] + inside["attention output"]
        assert np.array_equal(states[layer + 1], residual + inside["MLP output"])
    assert logits.shape == (len(TOKENS), 64)


@pytest.mark.parametrize("kquant", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_products_on_the_vec_dot_and_tiled_paths_are_ggml_arithmetic(tmp_path, kquant):
    config = tiny_config_json("llama") | KQUANT_SIZES
    path = str(tmp_path / f"{kquant}.gguf")
    write_gguf(Checkpoint.random(config, 0), path, kquant, encode=random_blocks(kquant))  # random blocks
    for tokens, kernel in (([7], "vec_dot"), (list(range(17)), "tiled")):  # tiled from 8 tokens on
        checks = check_products(run_graph(path, tokens, repack=False)[0], repack=False)
        assert {(c.weight_type, c.kernel, c.identical) for c in checks} == {(kquant, kernel, True)}
