"""The gated MLP: SwiGLU and GeGLU.

    mlp(x) = down( act(gate(x)) * up(x) )

with act = SiLU for SwiGLU, and the tanh approximation of GELU for GeGLU; some
experts use a clamped SwiGLU (``clamped_swiglu``). A checkpoint that stores gate
and up as one ``gate_up_proj`` is split at load, so ``gated_mlp`` is the only MLP
there is: the forward pass runs it for every dense MLP and every expert, handing
it its op set's ``linear`` and gate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.nn.linear import linear


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, -0
        return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU(x) ~= 0.5 x (1 + tanh( sqrt(2/pi) (x + 0.044715 x^3) ))."""
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


# The activations a config may name (config.json's hidden_act), by that name.
ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh}


def gated(gate: np.ndarray, up: np.ndarray, activation: str = "silu") -> np.ndarray:
    """act(gate) * up: the activated gate scales each up feature. gate, up: [..., F] -> [..., F]."""
    return ACTIVATIONS[activation](gate) * up


@dataclass
class MLPWeights:
    """One gated MLP (a dense layer's, or an expert's), [out, in] as checkpoints store linear layers."""

    gate_proj: np.ndarray  # [F, D]
    up_proj: np.ndarray  # [F, D]
    down_proj: np.ndarray  # [D, F]
    gate_proj_bias: np.ndarray | None = None  # [F]
    up_proj_bias: np.ndarray | None = None  # [F]
    down_proj_bias: np.ndarray | None = None  # [D]


def gated_mlp(x: np.ndarray, w: MLPWeights, gate: Callable = gated, linear: Callable = linear) -> np.ndarray:
    """x: [..., D] -> [..., D]: down( gate(gate_proj x, up_proj x) ), each projection with its bias.

    gate: (gate [..., F], up [..., F]) -> [..., F], ``gated`` (SwiGLU) unless another is given (GeGLU:
    ``gated`` with activation "gelu_pytorch_tanh"; ``clamped_swiglu``). linear: the projection
    (``refllm.nn.linear.linear``, or an op set's twin).
    """
    hidden = gate(linear(x, w.gate_proj, w.gate_proj_bias), linear(x, w.up_proj, w.up_proj_bias))  # [..., F]
    return linear(hidden, w.down_proj, w.down_proj_bias)


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """A clamped SwiGLU gate: gate, up [..., F] -> [..., F].

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
