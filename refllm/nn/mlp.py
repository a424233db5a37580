"""The gated MLP: SwiGLU (Llama, Qwen, Mistral, Phi-3) and GeGLU (Gemma).

    mlp(x) = down( act(gate(x)) * up(x) )

with act = SiLU for SwiGLU, and the tanh approximation of GELU for GeGLU.
gpt-oss's experts use a clamped SwiGLU of their own (``clamped_swiglu``).
Phi-3 stores gate and up as one ``gate_up_proj``; refllm splits it at load, so
the function below is the only MLP there is.
"""

from __future__ import annotations

import math

import numpy as np

from refllm import config
from refllm.nn.linear import linear


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, -0
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU(x) ~= 0.5 x (1 + tanh( sqrt(2/pi) (x + 0.044715 x^3) ))."""
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


# The functions of the activations a config may name, in the order config.ACTIVATIONS names them.
ACTIVATIONS = dict(zip(config.ACTIVATIONS, (silu, gelu_tanh), strict=True))


def gated_mlp(
    x: np.ndarray,
    gate_proj: np.ndarray,
    up_proj: np.ndarray,
    down_proj: np.ndarray,
    activation: str = "silu",
    gate_bias: np.ndarray | None = None,
    up_bias: np.ndarray | None = None,
    down_bias: np.ndarray | None = None,
) -> np.ndarray:
    """x: [..., D], gate_proj/up_proj: [F, D], down_proj: [D, F] -> [..., D]."""
    hidden = gated(linear(x, gate_proj, gate_bias), linear(x, up_proj, up_bias), activation)  # [..., F]
    return linear(hidden, down_proj, down_bias)


def gated(gate: np.ndarray, up: np.ndarray, activation: str = "silu") -> np.ndarray:
    """act(gate) * up: the activated gate scales each up feature. gate, up: [..., F] -> [..., F]."""
    return ACTIVATIONS[activation](gate) * up


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's gate: gate, up [..., F] -> [..., F].

        g = min(gate, limit)                   u = clip(up, -limit, limit)
        out = (u + 1) * g * sigmoid(alpha * g)

    The clamps bound the activations of a checkpoint trained with them; the
    ``+ 1`` lets an expert pass g through when u is near 0.
    """
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    with np.errstate(over="ignore"):  # exp(-alpha g) -> inf for very negative g: sigmoid -> 0, the right limit
        glu = g / (1.0 + np.exp(-alpha * g))
    return (u + 1) * glu
