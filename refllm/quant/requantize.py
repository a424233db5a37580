"""Float weights -> GGML blocks, as llama.cpp's reference quantizers make them.

For float checkpoints (safetensors) loaded with ``quantize="q8_0"`` or
``"q4_0"``: each 32-weight block gets one float16 scale d, chosen from the
block's largest magnitude, and integer q = x / d rounded. The arithmetic is
``ggml-quants.c``'s ``quantize_row_*_ref`` (and gguf-py's copy of it) in
float32, step for step, so the bytes are the same as theirs.

Dimension letters: R rows, C columns (a multiple of 32), N blocks.
"""

from __future__ import annotations

import numpy as np

from refllm.quant.formats import UnsupportedFormatError, block_format

REQUANTIZE_FORMATS = ("Q8_0", "Q4_0")


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (NumPy's round goes to even).

    floor(|v|) + floor(2 frac) is exact in float32, where floor(|v| + 0.5) would round
    0.49999997 up to 1.
    """
    magnitude = np.abs(values)
    whole = np.floor(magnitude)
    return np.sign(values) * (whole + np.floor(2 * (magnitude - whole)))


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """1 / d, and 0 where d is 0 (an all-zero block stores q = 0)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0.0), np.float32(1.0) / d)


def quantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """[N, 32] float32 -> [N, 34] Q8_0 bytes: d = max |x| / 127, q = roundf(x / d)."""
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # [N, 1]
    q = _round_half_away(blocks * _reciprocal(d)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)


def quantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """[N, 32] float32 -> [N, 18] Q4_0 bytes: d = (the signed x of largest |x|) / -8, q = x / d + 8 truncated to 0..15.

    Dividing by -8 maps the extreme weight to q = 0 exactly; the other end reaches only q = 15,
    7/8 of the way, which is why the extreme weight is the one kept exact.
    """
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)  # [N, 1]
    d = extreme / np.float32(-8)
    q = np.trunc(blocks * _reciprocal(d) + np.float32(8.5)).astype(np.uint8).clip(0, 15)
    packed = q[:, :16] | (q[:, 16:] << np.uint8(4))  # byte j: weight j low, weight j + 16 high
    return np.concatenate([d.astype(np.float16).view(np.uint8), packed], axis=1)


_QUANTIZERS = {"Q8_0": quantize_q8_0, "Q4_0": quantize_q4_0}


def requantize(weights: np.ndarray, name: str) -> np.ndarray:
    """A float matrix [R, C] -> its blocks [R, C / 32 * type_size] uint8 in format ``name``."""
    if name not in _QUANTIZERS:
        raise UnsupportedFormatError(
            f"cannot quantize to {name}; refllm quantizes float weights to {', '.join(REQUANTIZE_FORMATS)}"
        )
    fmt = block_format(name)
    if weights.ndim != 2 or weights.shape[1] % fmt.block_size:
        raise UnsupportedFormatError(
            f"{name} needs a matrix whose rows are whole {fmt.block_size}-weight blocks; got shape {weights.shape}"
        )
    rows = weights.shape[0]
    blocks = np.ascontiguousarray(weights, dtype=np.float32).reshape(-1, fmt.block_size)  # [N, 32]
    return _QUANTIZERS[name](blocks).reshape(rows, -1)
