"""The compiled decoder layer inside the model (refllm/models/fused_layer.py) against the same layers op by op.

The fast op set builds a dense recipe's layers as ``FusedDecoderLayer``; the model on a copy of
the fast op set (not the fast op set itself) keeps them op by op. On every fixture family the
two give the same logits bit for bit through a prompt, decode steps, a batch of sequences, a
ragged step, a speculative verification and a prompt long enough to run op by op inside the
fused model, on the paged arena and on the contiguous cache (which runs every layer op by op);
and so with quantized weights, float32 or int8 activations. Families whose recipe the compiled
layer does not compute (mixtures of experts, latent attention, a parallel layer) keep their
layers as they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import refllm
from refllm.kv import CacheConfig
from refllm.models.fused_layer import FusedDecoderLayer
from refllm.models.ops import fast_ops
from tests.helpers.paths import HF_DATA

ARCHITECTURES = sorted(p.name for p in HF_DATA.iterdir() if (p / "config.json").exists())
NOT_FUSED = {"cohere", "cohere-no-qk-norm", "deepseek_v3", "deepseek_v3-plain-q", "gpt_oss", "mixtral", "qwen3_moe"}


def op_by_op(model):
    """The same model on a copy of the fast op set: no layer is fused."""
    return model.with_ops(dataclasses.replace(fast_ops()))


def every_kind_of_step(model, kind: str) -> np.ndarray:
    """Logits of: a 5-token prompt, 3 decode steps, a batch of two (a new sequence beside), a ragged step,
    a 4-token verification, and a 20-token chunk (op by op in either model) -> rows [N, V]."""
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    rows = [model.prefill(np.array([[3, 17, 99, 5, 64]]), cache, range(5))]
    for token in (2, 8, 120):
        rows.append(model.decode(np.array([[token]]), cache))
    rows.append(model.decode_all_logits(np.array([[7, 11, 13, 17]]), cache)[0])
    rows.append(model.prefill_all_logits(np.array([list(range(30, 50))]), cache, range(12, 32))[0])
    if kind == "paged":  # sequences of their own lengths side by side
        cache.fork(0, 1)
        hidden = model.forward_step(model.embed(np.array([[4], [9]])), cache, [0, 1])
        rows.append(model.logits(hidden[:, -1]))
    return np.concatenate(rows)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fused_layers_give_the_op_by_op_logits_bit_for_bit(name):
    model = refllm.load_model(HF_DATA / name)
    assert all(isinstance(layer, FusedDecoderLayer) for layer in model.layers) == (name not in NOT_FUSED)
    plain = op_by_op(model)
    assert not any(isinstance(layer, FusedDecoderLayer) for layer in plain.layers)
    for kind in ("paged", "contiguous"):
        np.testing.assert_array_equal(every_kind_of_step(model, kind), every_kind_of_step(plain, kind))


@pytest.mark.parametrize("quantize, activations", [("q8_0", "float32"), ("q4_0", "float32"), ("q4_0", "int8")])
def test_quantized_fused_layers_give_the_op_by_op_logits_bit_for_bit(quantize, activations):
    model = refllm.load_model(HF_DATA / "qwen2", quantize=quantize, activations=activations)
    assert all(isinstance(layer, FusedDecoderLayer) for layer in model.layers)
    np.testing.assert_array_equal(every_kind_of_step(model, "paged"), every_kind_of_step(op_by_op(model), "paged"))


def test_int8_activations_reach_the_fused_layers():
    """The option is set after the blocks are built: the model is rebuilt, so the compiled layers take it."""
    default = refllm.load_model(HF_DATA / "llama", quantize="q4_0")
    int8 = refllm.load_model(HF_DATA / "llama", quantize="q4_0", activations="int8")
    assert not np.array_equal(every_kind_of_step(default, "paged"), every_kind_of_step(int8, "paged"))
