"""Backends that emulate a lower-precision engine: refllm's spec path with the rounding such an engine does.

Each is a factory ``checkpoint -> backend`` for the kit, correct in every
other respect, so it must pass the tolerance profile named after its
arithmetic at every horizon the kit draws (``benchmarks/calibrate_profiles.py``
measures them; tests/testing/test_oracle_emulated.py runs them):

    bfloat16_activations  profile bfloat16: weights stored in bfloat16; the input and output of every
                          operation (embedding, norms, RoPE, projections, the MLP's activation,
                          attention's q, k, v and output, the logits) and the residual stream after every
                          layer rounded to bfloat16; sums and softmax in float32, as a bfloat16 GPU
                          engine runs them (tensor cores accumulate in float32)
    float16_activations   profile float16: the same with float16 (11 bits) in place of bfloat16
    float16_logits        profile float16: exact float32, logits rounded to float16
    float16_kv            profile float16: exact float32, keys and values (DeepSeek's latents) stored in
                          float16
    int8_activations      profile int8: exact float32 weights, every projection's input quantized in
                          blocks of 32 along its last axis as llama.cpp's Q8_0 does (scale absmax / 127
                          stored in float16, levels rounded half to even)

Rounding is to nearest, ties to even, as the hardware does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from refllm.kv import CacheConfig
from refllm.models.contract import InMemorySource
from refllm.models.decoder import DecoderModel
from refllm.models.ops import SPEC_OPS, OpSet
from refllm.testing.backends import ModelBackend
from refllm.testing.checkpoint import Checkpoint

Q8_0_BLOCK = 32


def bfloat16_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even), kept in float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def float16_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest float16 (ties to even), kept in float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def q8_0_round(x: np.ndarray) -> np.ndarray:
    """Quantize along the last axis in blocks of 32 (or the whole axis) as Q8_0, dequantized to float32."""
    x = np.asarray(x, np.float32)
    width = x.shape[-1]
    block = Q8_0_BLOCK if width % Q8_0_BLOCK == 0 else width
    blocks = x.reshape(*x.shape[:-1], width // block, block)
    scale = float16_round(np.abs(blocks).max(-1, keepdims=True) / np.float32(127))
    levels = np.clip(np.round(blocks / np.where(scale == 0, 1, scale)), -127, 127)
    return (levels * scale).astype(np.float32).reshape(x.shape)


def _rounded_outputs(ops: OpSet, round_to: Callable) -> OpSet:
    """``ops`` with every operation's inputs and outputs rounded by ``round_to``."""

    def rope_angles(*args, **options):
        angles = ops.rope_angles(*args, **options)
        return lambda positions: tuple(round_to(a) for a in angles(positions))

    def attention(q, k, v, *args, **options):
        return round_to(ops.attention(round_to(q), round_to(k), round_to(v), *args, **options))

    def latent_attention(q, latent, values, *args, **options):
        return round_to(ops.latent_attention(round_to(q), round_to(latent), values, *args, **options))

    return replace(
        ops,
        name=f"{ops.name}, rounded",
        embed=lambda *args, **options: round_to(ops.embed(*args, **options)),
        rms_norm=lambda x, *args, **options: round_to(ops.rms_norm(round_to(x), *args, **options)),
        layer_norm=lambda x, *args, **options: round_to(ops.layer_norm(round_to(x), *args, **options)),
        rope_angles=rope_angles,
        apply_rope=lambda x, *args, **options: round_to(ops.apply_rope(round_to(x), *args, **options)),
        linear=lambda x, *args, **options: round_to(ops.linear(round_to(x), *args, **options)),
        gated=lambda gate, up, *args, **options: round_to(ops.gated(round_to(gate), round_to(up), *args, **options)),
        attention=attention,
        latent_attention=latent_attention,
    )


def _rounded_kv(ops: OpSet, round_to: Callable) -> OpSet:
    """``ops`` reading keys and values (or latents) as a cache that stores them rounded would hand them out."""

    def attention(q, k, v, *args, **options):
        return ops.attention(q, round_to(k), round_to(v), *args, **options)

    def latent_attention(q, latent, values, *args, **options):
        return ops.latent_attention(q, round_to(latent), values, *args, **options)

    return replace(ops, name=f"{ops.name}, rounded KV", attention=attention, latent_attention=latent_attention)


def _quantized_inputs(ops: OpSet) -> OpSet:
    """``ops`` with every projection's input quantized to Q8_0 blocks."""

    def linear(x, *args, **options):
        return ops.linear(q8_0_round(x), *args, **options)

    return replace(ops, name=f"{ops.name}, Q8_0 inputs", linear=linear)


class _RoundedLayer:
    """A layer whose output, the residual stream, is rounded."""

    def __init__(self, layer: Callable, round_to: Callable):
        self.layer, self.round_to = layer, round_to

    def __call__(self, *args, **options):
        return self.round_to(self.layer(*args, **options))


class _RoundedLogits(DecoderModel):
    """A model whose logits are rounded by ``round_logits``."""

    round_logits: Callable = staticmethod(float16_round)

    def logits(self, hidden):
        return self.round_logits(super().logits(hidden))


def _backend(model: DecoderModel, name: str) -> ModelBackend:
    return ModelBackend(model, CacheConfig(kind="contiguous"), name)


def _rounded_engine(checkpoint: Checkpoint, round_to: Callable, name: str) -> ModelBackend:
    """Weights, activations and the residual stream rounded by ``round_to``; float32 sums and softmax."""
    weights = {tensor: round_to(array) for tensor, array in checkpoint.tensors.items()}
    source = InMemorySource(checkpoint.config, weights)
    model = DecoderModel.load(source, ops=_rounded_outputs(SPEC_OPS, round_to))
    model.layers = [_RoundedLayer(getattr(layer, "op_by_op", layer), round_to) for layer in model.layers]
    return _backend(model, name)


def bfloat16_activations(checkpoint: Checkpoint) -> ModelBackend:
    """A bfloat16 engine: bfloat16 weights, activations and residual stream; float32 sums and softmax."""
    return _rounded_engine(checkpoint, bfloat16_round, "bfloat16 activations")


def float16_activations(checkpoint: Checkpoint) -> ModelBackend:
    """A float16 engine: float16 weights, activations and residual stream; float32 sums and softmax."""
    return _rounded_engine(checkpoint, float16_round, "float16 activations")


def float16_logits(checkpoint: Checkpoint) -> ModelBackend:
    """An exact float32 engine that hands out float16 logits."""
    return _backend(_RoundedLogits.load(checkpoint, ops=SPEC_OPS), "float16 logits")


def float16_kv(checkpoint: Checkpoint) -> ModelBackend:
    """An exact float32 engine whose KV cache stores float16."""
    return _backend(DecoderModel.load(checkpoint, ops=_rounded_kv(SPEC_OPS, float16_round)), "float16 KV")


def int8_activations(checkpoint: Checkpoint) -> ModelBackend:
    """An engine that quantizes every projection's input to Q8_0 blocks, float32 weights and sums."""
    return _backend(DecoderModel.load(checkpoint, ops=_quantized_inputs(SPEC_OPS)), "int8 activations")


# name -> (factory, the profile it must pass)
EMULATED: dict[str, tuple[Callable[[Checkpoint], ModelBackend], str]] = {
    "bfloat16 activations": (bfloat16_activations, "bfloat16"),
    "float16 activations": (float16_activations, "float16"),
    "float16 logits": (float16_logits, "float16"),
    "float16 KV": (float16_kv, "float16"),
    "int8 activations": (int8_activations, "int8"),
}
