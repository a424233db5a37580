"""One decoder layer of a dense model in one compiled call: norms, projections, q/k norms, RoPE,
the cache write, attention over the paged arena, the MLP and both residual adds, with no return
to Python between them.

Spec: the layer as ``refllm/nn`` composes it (``residual.residual_block`` around attention and
around the gated MLP); its fast twin is the same layer run op by op through the fast op set
(``refllm/models/ops.py``). Both are property-tested against this call in
tests/kernels/test_decoder_layer.py: against the fast ops bit for bit (every step here is the same
kernel in the same order: ``norm.py``, ``dense_matmul.py`` or ``quant_matmul.py``, ``rope.py``,
``attention.py``, ``activation.py``), against the spec within float32 rounding.

Why: a decode step of a small model is mostly calls. SmolLM2-135M's 30 layers made some 400
kernel calls a token, each wrapped in Python (shape checks, reshapes, the op set, the cache's
bookkeeping); here a layer is one call, and the arrays it needs are built once per model and
once per step.

The interface is arrays only, so that any model whose layer has this shape can call it:

    x                [N, D] float32, the residual stream: N = B sequences x T new tokens, token-major
    norms            (before attention, after attention, before the MLP, after the MLP), each
                     [D] float32, or [0] where the layer has no such norm (``residual.py``)
    projections      (q, k, v, o, gate, up, down): each a float32 matrix [R, C], or a quantized
                     one's blocks [R, R_bytes] uint8 with its code in ``codes`` (``quant_formats``)
    biases           the seven biases, [R] float32 or [0]
    int8             quantized projections take int8 activations where their format has an int8
                     product (``int8_matmul.py``), as ``QuantizedTensor(..., activations="int8")``
    q_norm, k_norm   [E] (each head), [H E] / [K E] (the whole projection), or [0]
    cos, sin         [N, R] float32 of each token's position; R = 0 for a layer without RoPE
    key_cache, value_cache  [blocks, Z, K, E] float32, this layer's part of the arena
    block_tables     [B, max blocks] int32; lengths [B] int64 (committed tokens); slots [B, T] int64
    scale, window, softcap  as the attention kernels take them (0: no window, no soft-cap)
    residual_scale   what each sublayer's output is multiplied by before its residual add (Granite's;
                     1.0 for the others)

-> the new residual stream [N, D]. The cache's keys and values of the N tokens are written.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from refllm.kernels.activation import _gated_rows
from refllm.kernels.attention import paged_decode_attention, paged_prefill_attention, write_kv
from refllm.kernels.dense_matmul import dense_matmul
from refllm.kernels.fused_products import joint_products
from refllm.kernels.int8_matmul import INT8_CODES, INT8_TOKENS, int8_matmul, int8_matmul_serial, quantize_activations
from refllm.kernels.norm import _rms_norm_rows
from refllm.kernels.quant_matmul import quant_matmul, quant_matmul_serial, quant_matvec, quant_matvec_serial
from refllm.kernels.rope import _rope_rows

# The indices of the projections in ``projections``, ``codes`` and ``biases``.
Q, K, V, O, GATE, UP, DOWN = range(7)
# The indices of the norms in ``norms``.
BEFORE_ATTENTION, AFTER_ATTENTION, BEFORE_MLP, AFTER_MLP = range(4)


def project(weights, code, x, bias, int8, parallel_min):
    """x [N, C] @ weights.T (+ bias) -> [N, R]: the fast op set's ``linear``, chosen by the weights' type."""


@overload(project)
def _project(weights, code, x, bias, int8, parallel_min):
    if weights.dtype == types.float32:

        def dense(weights, code, x, bias, int8, parallel_min):
            return _add_bias(dense_matmul(x, weights), bias)

        return dense

    def quantized(weights, code, x, bias, int8, parallel_min):
        # as ``QuantizedTensor.matmul``: one token decodes in registers, more take the tiles; a
        # product too small to repay waking the pool stays on this thread
        parallel = x.shape[0] * weights.shape[0] * x.shape[1] >= parallel_min
        if int8 and INT8_CODES[code] and x.shape[0] < INT8_TOKENS:
            q, d, quads, sums = quantize_activations(x)
            product = int8_matmul(weights, code, q, d, quads, sums) if parallel else int8_matmul_serial(
                weights, code, q, d, quads, sums
            )
            return _add_bias(product, bias)
        if x.shape[0] == 1:
            row = quant_matvec(weights, code, x[0]) if parallel else quant_matvec_serial(weights, code, x[0])
            out = row.reshape((1, row.shape[0]))
        else:
            out = quant_matmul(weights, code, x) if parallel else quant_matmul_serial(weights, code, x)
        return _add_bias(out, bias)

    return quantized


def project_jointly(projections, codes, which, x, biases, int8, parallel_min):
    """The projections ``which`` (a tuple of indices) of one input x -> a tuple of outputs: quantized
    matrices of one type in one parallel region (``fused_products.py``), others one at a time."""


@overload(project_jointly)
def _project_jointly(projections, codes, which, x, biases, int8, parallel_min):
    if not all(isinstance(index, types.IntegerLiteral) for index in which.types):
        return None
    chosen = [projections.types[index.literal_value] for index in which.types]
    if all(m == chosen[0] for m in chosen) and chosen[0].dtype == types.uint8:
        if len(chosen) == 3:

            def joint3(projections, codes, which, x, biases, int8, parallel_min):
                a, b, c = which
                first, second, third = joint_products(
                    (projections[a], projections[b], projections[c]), (codes[a], codes[b], codes[c]), x, int8
                )
                return _add_bias(first, biases[a]), _add_bias(second, biases[b]), _add_bias(third, biases[c])

            return joint3

        def joint2(projections, codes, which, x, biases, int8, parallel_min):
            a, b = which
            first, second = joint_products((projections[a], projections[b]), (codes[a], codes[b]), x, int8)
            return _add_bias(first, biases[a]), _add_bias(second, biases[b])

        return joint2
    if len(chosen) == 3:

        def apart3(projections, codes, which, x, biases, int8, parallel_min):
            a, b, c = which
            return (
                project(projections[a], codes[a], x, biases[a], int8, parallel_min),
                project(projections[b], codes[b], x, biases[b], int8, parallel_min),
                project(projections[c], codes[c], x, biases[c], int8, parallel_min),
            )

        return apart3

    def apart2(projections, codes, which, x, biases, int8, parallel_min):
        a, b = which
        return (
            project(projections[a], codes[a], x, biases[a], int8, parallel_min),
            project(projections[b], codes[b], x, biases[b], int8, parallel_min),
        )

    return apart2


@njit(cache=True)
def _add_bias(out: np.ndarray, bias: np.ndarray) -> np.ndarray:
    if bias.shape[0] == 0:
        return out
    for n in range(out.shape[0]):
        for r in range(out.shape[1]):
            out[n, r] += bias[r]
    return out


@njit(cache=True)
def _norm(x: np.ndarray, weight: np.ndarray, eps: np.float32, offset: np.float32) -> np.ndarray:
    """rms_norm over the rows of x [M, W], or x itself where ``weight`` is empty (no such norm)."""
    return x if weight.shape[0] == 0 else _rms_norm_rows(x, weight, eps, offset)


@njit(cache=True)
def _head_norm(x: np.ndarray, weight: np.ndarray, heads: int, eps: np.float32, offset: np.float32) -> np.ndarray:
    """A q/k norm of x [N, heads E]: over each head ([E] weight), over the whole row ([heads E]), or none."""
    if weight.shape[0] == 0 or weight.shape[0] == x.shape[1]:
        return _norm(x, weight, eps, offset)
    rows = np.ascontiguousarray(x).reshape((x.shape[0] * heads, x.shape[1] // heads))
    return _rms_norm_rows(rows, weight, eps, offset).reshape(x.shape)


@njit(cache=True)
def _residual_add(x: np.ndarray, h: np.ndarray, scale: np.float32) -> np.ndarray:
    """x + h * scale (a scale of 1 changes nothing: h * 1 is h, bit for bit)."""
    out = np.empty_like(x)
    for n in range(x.shape[0]):
        for d in range(x.shape[1]):
            out[n, d] = x[n, d] + h[n, d] * scale
    return out


@njit(cache=True)
def _attention_block(
    h, projections, codes, biases, q_norm, k_norm, cos, sin, key_cache, value_cache, block_tables, lengths, slots,
    num_heads, scale, window, softcap, eps, offset, int8, parallel_min,
):  # fmt: skip
    """h [N, D] (normed) -> the attention sublayer's output [N, D], its keys and values written."""
    batch, num_new = slots.shape
    _, _, num_kv_heads, head_dim = key_cache.shape
    q, k, v = project_jointly(projections, codes, (Q, K, V), h, biases, int8, parallel_min)
    q = _head_norm(q, q_norm, num_heads, eps, offset).reshape((h.shape[0], num_heads, head_dim))
    k = _head_norm(k, k_norm, num_kv_heads, eps, offset).reshape((h.shape[0], num_kv_heads, head_dim))
    if cos.shape[1] > 0:
        q, k = _rope_rows(q, cos, sin), _rope_rows(k, cos, sin)
    write_kv(
        key_cache, value_cache, slots, k.reshape((batch, num_new, num_kv_heads, head_dim)),
        v.reshape((batch, num_new, num_kv_heads, head_dim)),
    )  # fmt: skip
    if num_new == 1:
        out = paged_decode_attention(
            q, key_cache, value_cache, block_tables, lengths + 1, scale, window, softcap
        ).reshape((h.shape[0], num_heads * head_dim))
    else:
        out = paged_prefill_attention(
            q.reshape((batch, num_new, num_heads, head_dim)), key_cache, value_cache, block_tables, lengths,
            scale, window, softcap,
        ).reshape((h.shape[0], num_heads * head_dim))  # fmt: skip
    return project(projections[O], codes[O], out, biases[O], int8, parallel_min)


@njit(cache=True)
def _mlp_block(h, projections, codes, biases, gelu, int8, parallel_min):
    """h [N, D] (normed) -> down(act(gate(h)) * up(h)) [N, D]."""
    gate, up = project_jointly(projections, codes, (GATE, UP), h, biases, int8, parallel_min)
    activated = _gated_rows(gate.reshape(-1), up.reshape(-1), gelu).reshape(gate.shape)
    return project(projections[DOWN], codes[DOWN], activated, biases[DOWN], int8, parallel_min)


@njit(cache=True)
def decoder_layer(
    x, norms, projections, codes, biases, q_norm, k_norm, cos, sin, key_cache, value_cache, block_tables, lengths,
    slots, num_heads, scale, window, softcap, eps, offset, gelu, int8, parallel_min, residual_scale=1.0,
):  # fmt: skip
    """One dense decoder layer (the module's docstring has the arrays) -> the new residual stream [N, D].

    x + residual_scale * norm_after(attention(norm_before(x))), then the same around the gated MLP:
    each norm skipped where its weight is empty (``refllm.nn.residual.residual_block``)."""
    eps, offset, residual_scale = np.float32(eps), np.float32(offset), np.float32(residual_scale)
    h = _norm(x, norms[BEFORE_ATTENTION], eps, offset)
    attended = _attention_block(
        h, projections, codes, biases, q_norm, k_norm, cos, sin, key_cache, value_cache, block_tables, lengths,
        slots, num_heads, scale, window, softcap, eps, offset, int8, parallel_min,
    )  # fmt: skip
    x = _residual_add(x, _norm(attended, norms[AFTER_ATTENTION], eps, offset), residual_scale)
    h = _norm(x, norms[BEFORE_MLP], eps, offset)
    mlp = _mlp_block(h, projections, codes, biases, gelu, int8, parallel_min)
    return _residual_add(x, _norm(mlp, norms[AFTER_MLP], eps, offset), residual_scale)
