"""The dense decoder layer in one compiled call: the fast op set's variant of ``DecoderLayer``.

A decode step of a small model is mostly calls: SmolLM2-135M's layer ran some fifteen
kernels, each wrapped in Python. ``refllm/kernels/decoder_layer.py`` runs a whole dense
layer (norms, projections, q/k norms, RoPE, the cache write, attention over the paged
arena, the MLP, both residual adds) in one call over arrays; this module makes those
arrays once, at load, from the layer's weights and its recipe, and hands the call to the
cache (``KVCache.run_layer``): a float32 paged arena runs it for steps of fewer than
``FUSED_TOKENS`` new tokens a sequence without images (decode steps, batches of them,
speculative verification), and every other case runs the same layer op by op
(``DecoderLayer``). The compiled layer calls the fast op set's kernels in the fast op set's
order, so the two give the same numbers bit for bit (tests/models/test_fused_layer.py).

``fused_layer`` builds one where the recipe has what the compiled layer computes: grouped-query
attention without sinks, RMSNorms before, around or after the sublayers, a dense gated MLP
(SiLU or GELU-tanh), q/k norms with one weight for every head or for the whole projection;
elsewhere it returns the layer as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refllm.config import ModelConfig
from refllm.models.weights import LayerWeights
from refllm.nn.mlp import MLPWeights
from refllm.recipe import GroupedQueryAttention, NormKind, NormPlacement

NORM_ROLES = ("attention_norm", "attention_output_norm", "mlp_norm", "mlp_output_norm")  # the kernel's order


def _fixed(array: np.ndarray | None) -> np.ndarray:
    """A float32 array as the compiled layer takes it: C-contiguous and read-only (one compiled type for every
    layer and model), or an empty one for what a layer does not have."""
    fixed = np.ascontiguousarray(np.zeros(0, np.float32) if array is None else array, np.float32).view()
    fixed.flags.writeable = False
    return fixed


def _matrix(weight) -> tuple[np.ndarray, int]:
    """(a float32 matrix or a quantized one's blocks, its format code; 0 for float32)."""
    return (weight.blocks, weight.code) if hasattr(weight, "blocks") else (_fixed(weight), 0)  # a QuantizedTensor


def _no_rotation(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A NoPE layer's angles: none, [B, T, 0]."""
    empty = np.zeros((*positions.shape, 0), np.float32)
    return empty, empty


class FusedLayerCall:
    """One layer's arrays and numbers, made at load; called with the cache's arrays of this layer."""

    def __init__(self, config: ModelConfig, index: int, w: LayerWeights, angles: Callable):
        from refllm.quant.linear import PARALLEL_MIN_WEIGHTS  # the fast op set's: Numba is loaded by now

        attention, mlp = w.attention, w.mlp
        weights = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj, mlp.up_proj,
                   mlp.down_proj)  # fmt: skip
        matrices = [_matrix(m) for m in weights]
        self.projections, self.codes = tuple(m for m, _ in matrices), tuple(code for _, code in matrices)
        self.biases = tuple(_fixed(b) for b in (attention.q_proj_bias, attention.k_proj_bias, attention.v_proj_bias,
                                                attention.o_proj_bias, mlp.gate_proj_bias, mlp.up_proj_bias,
                                                mlp.down_proj_bias))  # fmt: skip
        self.norms = tuple(_fixed(getattr(w, role)) for role in NORM_ROLES)
        self.q_norm, self.k_norm = _fixed(attention.q_norm), _fixed(attention.k_norm)
        self.angles = angles if config.uses_rope(index) else _no_rotation
        recipe = config.attention
        window = config.window_for_layer(index)
        self.numbers = (
            recipe.num_heads, recipe.scale, window or 0, float(recipe.softcap or 0.0), config.norms.eps,
            config.norms.weight_offset, config.mlp.activation == "gelu_pytorch_tanh",
            any(getattr(m, "activations", "float32") == "int8" for m in weights),
            PARALLEL_MIN_WEIGHTS, 1.0 if config.residual_scale is None else config.residual_scale,
        )  # fmt: skip

    def __call__(self, x: np.ndarray, keys: np.ndarray, values: np.ndarray, view, positions: np.ndarray) -> np.ndarray:
        """x [B, T, D] float32 at ``positions`` [B, T]; keys, values: this layer's blocks; view: the batch's
        block tables, lengths and slots (``refllm.kv.block_attention.BatchView``) -> [B, T, D]."""
        from refllm.kernels.compiler_memory import release
        from refllm.kernels.decoder_layer import decoder_layer

        B, T, D = x.shape
        heads, scale, window, softcap, eps, offset, gelu, int8, parallel_min, residual_scale = self.numbers
        cos, sin = self.angles(positions)
        out = decoder_layer(
            np.ascontiguousarray(x.reshape(B * T, D), np.float32), self.norms, self.projections, self.codes,
            self.biases, self.q_norm, self.k_norm, np.ascontiguousarray(cos.reshape(B * T, -1), np.float32),
            np.ascontiguousarray(sin.reshape(B * T, -1), np.float32), keys, values, view.block_tables,
            view.lengths, view.slots, heads, scale, window, softcap, eps, offset, gelu, int8, parallel_min,
            residual_scale,
        )  # fmt: skip
        release()  # the first call loads the compiled layer: the compiler's pages out before the next layer's weights
        return out.reshape(B, T, D)


class FusedDecoderLayer:
    """x [B, T, D] -> the dense layer in one compiled call where the cache can take it, else op by op."""

    def __init__(self, index: int, op_by_op: Callable, fused: FusedLayerCall):
        self.index, self.op_by_op, self.fused = index, op_by_op, fused

    def __call__(self, x: np.ndarray, positions: np.ndarray, cache, seq_ids: list, image_spans=None) -> np.ndarray:
        return cache.run_layer(self.index, self.op_by_op, self.fused, x, positions, seq_ids, image_spans)


def fusable(config: ModelConfig, w: LayerWeights) -> bool:
    """Whether the compiled layer computes this layer's recipe."""
    recipe, norms = config.attention, config.norms
    if not (isinstance(recipe, GroupedQueryAttention) and isinstance(w.mlp, MLPWeights)) or recipe.sinks:
        return False
    if norms.kind is not NormKind.RMS or norms.placement is NormPlacement.PARALLEL:
        return False
    widths = {None, (recipe.head_dim,)}  # a q/k norm: one weight for every head, or one over the whole projection
    q_norm, k_norm = (None if n is None else n.shape for n in (w.attention.q_norm, w.attention.k_norm))
    return (
        config.mlp.activation in ("silu", "gelu_pytorch_tanh")
        and q_norm in widths | {(recipe.num_heads * recipe.head_dim,)}
        and k_norm in widths | {(recipe.num_kv_heads * recipe.head_dim,)}
    )


def fused_layer(config: ModelConfig, index: int, w: LayerWeights, layer: Callable, angles: Callable) -> Callable:
    """``layer`` (a ``DecoderLayer`` on the fast op set) as a FusedDecoderLayer where the recipe allows, else itself."""
    return FusedDecoderLayer(index, layer, FusedLayerCall(config, index, w, angles)) if fusable(config, w) else layer
