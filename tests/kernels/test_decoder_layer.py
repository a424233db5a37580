"""The compiled decoder layer (refllm/kernels/decoder_layer.py) against the layer run op by op.

Each example draws a dense layer (heads and KV heads, head size, partial or no RoPE, norms
before, around or after each sublayer, biases, q/k norms per head or over the projection, a
sliding window, a soft-cap, SiLU or GELU), its weights as float32 or in a quantized format,
and a batch of sequences whose cached prefixes cross block and key-partition boundaries, then
checks, for the new tokens:

- against the fast op set run one op at a time (``fast_ops()``: the same kernels, called from
  Python as the forward pass calls them): the output and the keys and values written into the
  arena are the same bit for bit;
- against the spec (``refllm/nn``, float32, the NumPy attention over gathered keys): within
  float32 rounding, the bound tests/helpers/op_sets.py derives, four times the float32 spec's own
  error against the same layer in float64 (truth); with int8 activations (drawn for the formats
  that have them) the fast ops are the reference, bit for bit;
- a layer with its bias dropped is far outside that bound (the bound sees a real bug).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.config import RopeParameters
from refllm.kernels.decoder_layer import decoder_layer
from refllm.kernels.int8_matmul import INT8_FORMATS
from refllm.kernels.quant_formats import FORMAT_CODES
from refllm.kv import CacheConfig
from refllm.kv.base import CacheShape
from refllm.kv.paged import PagedKVArena
from refllm.models.ops import SPEC_OPS, fast_ops
from refllm.nn.residual import residual_block
from refllm.kernels.rope import RopeTable
from refllm.quant.formats import dequantize
from refllm.quant.linear import PARALLEL_MIN_WEIGHTS, QuantizedTensor
from refllm.testing.truth import relative_error
from tests.helpers.op_sets import ROUNDING_MULTIPLE, ULP_FLOOR

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
FORMATS = ("F32", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # those gguf-py quantizes; the kernels share one dispatch
NORM_PLACES = {  # which of (before attention, after it, before the MLP, after it) a layer has
    "pre": (True, False, True, False),
    "sandwich": (True, True, True, True),
    "post": (False, True, False, True),
}


@st.composite
def layers(draw: st.DrawFn) -> dict:
    kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    weight_format = draw(st.sampled_from(FORMATS))
    head_dim = draw(st.sampled_from([16, 32] if weight_format == "F32" else [32]))  # whole blocks of 32 per row
    return {
        "kv_heads": kv_heads,
        "heads": kv_heads * group,
        "head_dim": head_dim,
        "hidden": 32 * draw(st.integers(1, 3)),
        "intermediate": 32 * draw(st.integers(1, 4)),
        "format": weight_format,
        "int8": weight_format in INT8_FORMATS and draw(st.booleans()),  # int8 activations
        "rotary": draw(st.sampled_from([0, head_dim // 2, head_dim])),  # 0: a NoPE layer
        "norms": draw(st.sampled_from(sorted(NORM_PLACES))),
        "residual_scale": draw(st.sampled_from([None, None, 0.22])),  # Granite multiplies a sublayer's output
        "biases": draw(st.booleans()),
        "qk_norm": draw(st.sampled_from(["none", "head", "whole"])),
        "window": draw(st.sampled_from([0, 0, 3, 17])),
        "softcap": draw(st.sampled_from([0.0, 0.0, 5.0])),
        "gelu": draw(st.booleans()),
        "block_size": draw(st.sampled_from([4, 16])),
        "prefixes": draw(st.lists(st.integers(0, 80), min_size=1, max_size=3)),  # cached tokens per sequence
        "new_tokens": draw(st.sampled_from([1, 1, 2, 3])),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def draw_weights(case: dict) -> dict:
    """Weights in float64 (truth), float32 (the spec's and the fast path's), and as the fast path holds them."""
    rng = np.random.default_rng(case["seed"])
    D, F, E = case["hidden"], case["intermediate"], case["head_dim"]
    H, K = case["heads"], case["kv_heads"]
    shapes = {"q": (H * E, D), "k": (K * E, D), "v": (K * E, D), "o": (D, H * E), "gate": (F, D), "up": (F, D),
              "down": (D, F)}  # fmt: skip
    held, float32, float64 = {}, {}, {}
    for name, shape in shapes.items():
        weights = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        if case["format"] == "F32":
            held[name], float32[name], float64[name] = weights, weights, weights.astype(np.float64)
        else:
            blocks = gguf.quants.quantize(weights, gguf.GGMLQuantizationType[case["format"]])
            held[name] = QuantizedTensor(blocks, case["format"], shape, "int8" if case["int8"] else "float32")
            float32[name] = dequantize(blocks, case["format"], shape)
            float64[name] = dequantize(blocks, case["format"], shape, np.float64)
        bias = (rng.standard_normal(shape[0]) * 0.5).astype(np.float32) if case["biases"] else None
        for table in (held, float32, float64):
            dtype = np.float64 if table is float64 else np.float32
            table[name + "_bias"] = None if bias is None else bias.astype(dtype)
    norm_width = {"none": 0, "head": E, "whole": None}[case["qk_norm"]]
    for name, heads in (("q_norm", H), ("k_norm", K)):
        width = heads * E if norm_width is None else norm_width
        weight = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32) if width else None
        for table in (held, float32, float64):
            table[name] = None if weight is None else weight.astype(np.float64 if table is float64 else np.float32)
    for place, present in zip(("before_attention", "after_attention", "before_mlp", "after_mlp"),
                              NORM_PLACES[case["norms"]]):  # fmt: skip
        weight = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if present else None
        for table in (held, float32, float64):
            table[place] = None if weight is None else weight.astype(np.float64 if table is float64 else np.float32)
    return {"held": held, "float32": float32, "float64": float64}


def arena_with_prefixes(case: dict, dtype: str, rng: np.random.Generator) -> PagedKVArena:
    """An arena of one layer holding each sequence's random cached prefix (the same values in any dtype)."""
    shape = CacheShape(1, case["kv_heads"], case["head_dim"], dtype)
    arena = PagedKVArena(shape, CacheConfig(block_size=case["block_size"], num_blocks=64), 256)
    for seq_id, length in enumerate(case["prefixes"]):
        if length:
            k, v = rng.standard_normal((2, 1, length, case["kv_heads"], case["head_dim"]))
            arena.reserve([seq_id], length)
            arena.write(0, [seq_id], k.astype(dtype), v.astype(dtype))
            arena.commit([seq_id], length)
    return arena


def length_of(arena: PagedKVArena, seq_id: int) -> int:
    return arena.length(seq_id) if seq_id in arena else 0


def rope_of(case: dict, positions: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray] | None:
    if case["rotary"] == 0:
        return None
    params = RopeParameters(theta=10000.0, partial_rotary_factor=case["rotary"] / case["head_dim"])
    return RopeTable(params, case["head_dim"], 4096, dtype).lookup(positions)


def layer_op_by_op(ops, case: dict, w: dict, arena: PagedKVArena, x: np.ndarray) -> np.ndarray:
    """x [B, T, D] -> [B, T, D]: the layer as the forward pass composes it from ``ops``."""
    B, T, _ = x.shape
    H, K, E = case["heads"], case["kv_heads"], case["head_dim"]
    seq_ids = list(range(B))
    positions = np.array([length_of(arena, s) for s in seq_ids])[:, None] + np.arange(T)
    rope = rope_of(case, positions, x.dtype)
    eps, offset = 1e-6, 0.0

    def norm(weight):
        return None if weight is None else (lambda h: ops.rms_norm(h, weight, eps, offset))

    def attend(h):
        q, k = ops.linear(h, w["q"], w["q_bias"]), ops.linear(h, w["k"], w["k_bias"])
        v = ops.linear(h, w["v"], w["v_bias"]).reshape(B, T, K, E)
        whole = w["q_norm"] is not None and len(w["q_norm"]) == H * E != E
        if whole:
            q, k = ops.rms_norm(q, w["q_norm"], eps, offset), ops.rms_norm(k, w["k_norm"], eps, offset)
        q, k = q.reshape(B, T, H, E), k.reshape(B, T, K, E)
        if w["q_norm"] is not None and not whole:
            q, k = ops.rms_norm(q, w["q_norm"], eps, offset), ops.rms_norm(k, w["k_norm"], eps, offset)
        if rope is not None:
            q, k = ops.apply_rope(q, *rope), ops.apply_rope(k, *rope)
        arena.write(0, seq_ids, k, v)
        out = arena.attention(
            0, seq_ids, q, E**-0.5, case["window"] or None, case["softcap"] or None, ops.attention
        )
        return ops.linear(out.reshape(B, T, H * E), w["o"], w["o_bias"])

    def mlp(h):
        gate, up = ops.linear(h, w["gate"], w["gate_bias"]), ops.linear(h, w["up"], w["up_bias"])
        activated = ops.gated(gate, up, "gelu_pytorch_tanh" if case["gelu"] else "silu")
        return ops.linear(activated, w["down"], w["down_bias"])

    def residual(x, sublayer, before, after):  # refllm.nn.residual.residual_block, and a residual scale
        if case["residual_scale"] is None:
            return residual_block(x, sublayer, before, after)
        h = sublayer(x if before is None else before(x))
        return x + (h if after is None else after(h)) * case["residual_scale"]

    arena.reserve(seq_ids, T)
    with ops.running():
        x = residual(x, attend, norm(w["before_attention"]), norm(w["after_attention"]))
        x = residual(x, mlp, norm(w["before_mlp"]), norm(w["after_mlp"]))
    arena.commit(seq_ids, T)
    return x


def layer_compiled(case: dict, w: dict, arena: PagedKVArena, x: np.ndarray) -> np.ndarray:
    B, T, D = x.shape
    seq_ids = list(range(B))
    lengths = np.array([length_of(arena, s) for s in seq_ids], np.int64)
    positions = lengths[:, None] + np.arange(T)
    arena.reserve(seq_ids, T)
    tables = np.zeros((B, max(len(arena.block_table(s)) for s in seq_ids)), np.int32)
    for s in seq_ids:
        tables[s, : len(arena.block_table(s))] = arena.block_table(s)
    block_size = case["block_size"]
    slots = np.take_along_axis(tables, positions // block_size, 1) * block_size + positions % block_size
    empty = np.zeros(0, np.float32)

    def array(value):
        return empty if value is None else value

    def matrix(value):
        return value.blocks if isinstance(value, QuantizedTensor) else value

    codes = tuple(FORMAT_CODES.get(case["format"], 0) for _ in PROJECTIONS)
    rope = rope_of(case, positions, np.float32)
    cos, sin = (np.zeros((B * T, 0), np.float32),) * 2 if rope is None else (r.reshape(B * T, -1) for r in rope)
    out = decoder_layer(
        x.reshape(B * T, D),
        tuple(array(w[place]) for place in ("before_attention", "after_attention", "before_mlp", "after_mlp")),
        tuple(matrix(w[name]) for name in PROJECTIONS), codes, tuple(array(w[name + "_bias"]) for name in PROJECTIONS),
        array(w["q_norm"]), array(w["k_norm"]), cos, sin, arena.k[0], arena.v[0], tables, lengths,
        slots.astype(np.int64), case["heads"], case["head_dim"] ** -0.5, case["window"], case["softcap"],
        1e-6, 0.0, case["gelu"], case["int8"], PARALLEL_MIN_WEIGHTS,
        1.0 if case["residual_scale"] is None else case["residual_scale"],
    )  # fmt: skip
    arena.commit(seq_ids, T)
    return out.reshape(B, T, D)


def run_all(case: dict, weights: dict) -> dict:
    rng = np.random.default_rng(case["seed"] + 1)
    x = rng.standard_normal((len(case["prefixes"]), case["new_tokens"], case["hidden"]))
    runs = {}
    for name, ops, dtype, w in (
        ("truth", SPEC_OPS, "float64", weights["float64"]),
        ("spec", SPEC_OPS, "float32", weights["float32"]),
        ("fast", fast_ops(), "float32", weights["held"]),
        ("compiled", None, "float32", weights["held"]),
    ):
        arena = arena_with_prefixes(case, dtype, np.random.default_rng(case["seed"] + 2))
        inputs = x.astype(dtype)
        out = layer_compiled(case, w, arena, inputs) if ops is None else layer_op_by_op(ops, case, w, arena, inputs)
        runs[name] = (out, arena)
    return runs


@settings(max_examples=60, deadline=None)
@given(layers())
def test_the_compiled_layer_is_the_fast_ops_bit_for_bit_and_the_spec_within_rounding(case):
    runs = run_all(case, draw_weights(case))
    (compiled, compiled_arena), (fast, fast_arena) = runs["compiled"], runs["fast"]
    np.testing.assert_array_equal(compiled.view(np.uint32), fast.view(np.uint32))
    np.testing.assert_array_equal(compiled_arena.k.view(np.uint32), fast_arena.k.view(np.uint32))
    np.testing.assert_array_equal(compiled_arena.v.view(np.uint32), fast_arena.v.view(np.uint32))
    truth, spec = runs["truth"][0], runs["spec"][0]
    if not case["int8"]:  # int8 activations are bounded against float32 ones in tests/kernels/test_int8_matmul.py
        assert relative_error(compiled, spec) <= ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)


def test_the_bound_catches_a_dropped_bias():
    case = {"kv_heads": 2, "heads": 4, "head_dim": 16, "hidden": 64, "intermediate": 96, "format": "Q8_0",
            "int8": False, "rotary": 16, "norms": "pre", "residual_scale": None, "biases": True, "qk_norm": "head",
            "window": 0, "softcap": 0.0, "gelu": False, "block_size": 16, "prefixes": [20, 70], "new_tokens": 1,
            "seed": 5}  # fmt: skip
    weights = draw_weights(case)
    weights["held"]["k_bias"] = None
    runs = run_all(case, weights)
    truth, spec, compiled = runs["truth"][0], runs["spec"][0], runs["compiled"][0]
    assert relative_error(compiled, spec) > 100 * ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)


@pytest.mark.parametrize("new_tokens", [1, 4])
def test_float32_and_quantized_weights_mix_in_one_layer(new_tokens):
    """A file may keep some matrices of a layer in F32 beside quantized ones: each projection
    takes the kernel of its own type."""
    case = {"kv_heads": 1, "heads": 2, "head_dim": 32, "hidden": 64, "intermediate": 64, "format": "Q4_1",
            "int8": False, "rotary": 32, "norms": "pre", "residual_scale": None, "biases": False, "qk_norm": "none",
            "window": 0, "softcap": 0.0, "gelu": False, "block_size": 16, "prefixes": [5], "new_tokens": new_tokens,
            "seed": 9}  # fmt: skip
    weights = draw_weights(case)
    weights["held"]["v"], weights["held"]["down"] = weights["float32"]["v"], weights["float32"]["down"]
    runs = run_all(case, weights)
    np.testing.assert_array_equal(runs["compiled"][0], runs["fast"][0])
