"""Tensor tables: every tensor a checkpoint holds, by its Hugging Face name, with its shape and its role.

A family's ``layer_tensors(c, layer, layout)`` lists one layer's tensors (names after
``model.layers.{i}.``); the registry adds the model's own (the embedding, the final
norm, the LM head). The one table serves the shape check, the load and the
parameter count (``refllm/models/weights.py``, ``refllm/families/__init__.py``).

A role says where a tensor's values go in the model's weights
(``refllm/models/weights.py``): ``attention.<name>`` and ``mlp.<name>`` are fields of
the layer's attention and MLP weights (``mlp.experts.<e>.<name>`` of expert e's,
``mlp.shared.<name>`` of the shared experts'), a plain name is one of the layer's
norms (``NORM_ROLES``); in the whole table, ``layers.<i>.`` comes before a layer's.
A fused tensor (Phi-3's ``qkv_proj``, a stacked expert tensor) has several roles
and a ``split`` that cuts it into one part per role; a tensor whose layout differs
from the spec's (interleaved RoPE rows) has a ``split`` that reorders it. Sizes:
``c`` is the model's ``ModelConfig``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from refllm.recipe import NormPlacement, QKNorm

# The norm roles of a layer: before and after its attention, before and after its MLP.
NORM_ROLES = {
    NormPlacement.PRE: ("attention_norm", "mlp_norm"),
    NormPlacement.SANDWICH: ("attention_norm", "attention_output_norm", "mlp_norm", "mlp_output_norm"),
    NormPlacement.POST: ("attention_output_norm", "mlp_output_norm"),
    NormPlacement.PARALLEL: ("attention_norm",),  # one norm, whose output both sublayers read
}
# Hugging Face's norm names, by placement.
PRE_NORMS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
SANDWICH_NORMS = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "attention_output_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_output_norm",
}
POST_NORMS = {"post_attention_layernorm": "attention_output_norm", "post_feedforward_layernorm": "mlp_output_norm"}


@dataclass(frozen=True)
class Tensor:
    """One tensor of a checkpoint: its name, its shape, and where its values go."""

    name: str
    shape: tuple[int, ...]
    roles: Sequence[str]  # a tuple, or PerExpert
    split: Callable[[Any], tuple] | None = None  # the tensor -> one part per role; None: the tensor itself


class PerExpert(Sequence):
    """The roles of every expert's ``names``, ``<prefix>mlp.experts.<e>.<name>``: name by name, e = 0 .. X - 1.

    Made as they are read, so a table of a hostile expert count costs nothing until the tensor's
    shape has been compared with the count."""

    def __init__(self, names: tuple[str, ...], count: int, prefix: str = ""):
        self.names, self.count, self.prefix = names, count, prefix

    def __len__(self) -> int:
        return len(self.names) * self.count

    def __getitem__(self, index: int) -> str:
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        name, expert = divmod(index % len(self), self.count)
        return f"{self.prefix}mlp.experts.{expert}.{self.names[name]}"

    def prefixed(self, prefix: str) -> PerExpert:
        return PerExpert(self.names, self.count, prefix + self.prefix)


@dataclass(frozen=True)
class ExpertNames:
    """Where a family's files put a sparse layer's tensors (names after ``model.layers.{i}.``)."""

    router: str = "mlp.gate"  # the router's, per expert (and fused, when ``interleaved``)
    expert: str | None = "mlp.experts.{e}."  # expert e's prefix; None: the files hold experts fused only
    projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # per expert: gate, up, down
    interleaved: bool = False  # fused gate_up is [X, D, 2M], [in, out], gate and up columns interleaved
    router_bias: bool = False  # the router's linear layer has a bias (gpt-oss)
    expert_bias: bool = False  # every expert projection has a bias (gpt-oss, fused)
    correction_bias: str | None = None  # DeepSeek-V3's router bias that steers the choice only
    shared: str | None = None  # the prefix of DeepSeek-V3's shared experts


def one(name: str, shape: tuple[int, ...], role: str, reorder: Callable[[Any], Any] | None = None) -> Tensor:
    """A tensor with one role, taken as it is or reordered by ``reorder``."""
    return Tensor(name, shape, (role,), None if reorder is None else lambda tensor: (reorder(tensor),))


def rows(*sizes: int) -> Callable[[Any], tuple]:
    """A split into consecutive blocks of rows of ``sizes`` (views, no copy)."""
    starts = np.cumsum((0, *sizes))

    def split(tensor: Any) -> tuple:
        return tuple(tensor[start:stop] for start, stop in zip(starts[:-1], starts[1:]))

    return split


def rotate_half_rows(width: int, rope_dim: int, heads: int, interleaved: bool = True) -> np.ndarray:
    """The row order that makes a projection's RoPE rows rotate-half (``refllm/nn/rope.py``): in each of ``heads``
    blocks of ``width`` rows, the last ``rope_dim`` pair dims (2i, 2i + 1) when ``interleaved``; they become
    (i, i + rope_dim / 2). A common permutation of queries and keys leaves q.k as it was."""
    within = np.arange(width)
    if interleaved:
        start = width - rope_dim
        within[start:] = start + np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
    return (np.arange(heads)[:, None] * width + within).ravel()


def model_tensors(c) -> list[Tensor]:
    """The embedding, the final norm and (unless tied to the embedding) the LM head."""
    D, V = c.hidden_size, c.vocab_size
    tensors = [one("model.embed_tokens.weight", (V, D), "embed_tokens"), one("model.norm.weight", (D,), "norm")]
    return tensors if c.tie_word_embeddings else [*tensors, one("lm_head.weight", (V, D), "lm_head")]


def attention_tensors(c, qk_norm_shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> list[Tensor]:
    """q/k/v/o projections, their biases, the q/k norm and the sinks of grouped-query attention.

    qk_norm_shapes: the q and k norm weights' shapes where they are not [E] (per head) or [H*E] and
    [K*E] (over the projection)."""
    a, D = c.attention, c.hidden_size
    H, K, E = a.num_heads, a.num_kv_heads, a.head_dim
    tensors = [
        one("self_attn.q_proj.weight", (H * E, D), "attention.q_proj"),
        one("self_attn.k_proj.weight", (K * E, D), "attention.k_proj"),
        one("self_attn.v_proj.weight", (K * E, D), "attention.v_proj"),
        one("self_attn.o_proj.weight", (D, H * E), "attention.o_proj"),
    ]
    if a.bias:
        tensors += [
            one("self_attn.q_proj.bias", (H * E,), "attention.q_proj_bias"),
            one("self_attn.k_proj.bias", (K * E,), "attention.k_proj_bias"),
            one("self_attn.v_proj.bias", (K * E,), "attention.v_proj_bias"),
        ]
    if a.output_bias:
        tensors.append(one("self_attn.o_proj.bias", (D,), "attention.o_proj_bias"))
    return tensors + qk_norm_tensors(c, qk_norm_shapes) + sink_tensors(c)


def qk_norm_tensors(c, shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> list[Tensor]:
    a = c.attention
    if a.qk_norm is QKNorm.NONE:
        return []
    if shapes is None:
        whole = a.qk_norm is QKNorm.WHOLE
        shapes = ((a.num_heads * a.head_dim,), (a.num_kv_heads * a.head_dim,)) if whole else ((a.head_dim,),) * 2
    return [
        one("self_attn.q_norm.weight", shapes[0], "attention.q_norm"),
        one("self_attn.k_norm.weight", shapes[1], "attention.k_norm"),
    ]


def sink_tensors(c) -> list[Tensor]:
    return [one("self_attn.sinks", (c.attention.num_heads,), "attention.sinks")] if c.attention.sinks else []


def gated_mlp_tensors(prefix: str, role: str, hidden_size: int, size: int, bias: bool = False) -> list[Tensor]:
    """A gated MLP's gate, up and down projections (and their biases): names after ``prefix``, roles after ``role``."""
    D, F = hidden_size, size
    tensors = [
        one(f"{prefix}gate_proj.weight", (F, D), f"{role}gate_proj"),
        one(f"{prefix}up_proj.weight", (F, D), f"{role}up_proj"),
        one(f"{prefix}down_proj.weight", (D, F), f"{role}down_proj"),
    ]
    if bias:
        tensors += [
            one(f"{prefix}gate_proj.bias", (F,), f"{role}gate_proj_bias"),
            one(f"{prefix}up_proj.bias", (F,), f"{role}up_proj_bias"),
            one(f"{prefix}down_proj.bias", (D,), f"{role}down_proj_bias"),
        ]
    return tensors


def dense_mlp_tensors(c) -> list[Tensor]:
    """The layer's dense MLP."""
    return gated_mlp_tensors("mlp.", "mlp.", c.hidden_size, c.mlp.intermediate_size, c.mlp.bias)


def norm_tensors(c, names: dict[str, str]) -> list[Tensor]:
    """The layer's norms: Hugging Face name -> norm role."""
    return [one(f"{name}.weight", (c.hidden_size,), role) for name, role in names.items()]


def layer_prefixed(tensors: list[Tensor], layer: int) -> list[Tensor]:
    """A layer's tensors under their full names, model.layers.{layer}.<name>, with roles layers.{layer}.<role>."""
    prefix = f"layers.{layer}."

    def roles(tensor: Tensor) -> Sequence[str]:
        return tensor.roles.prefixed(prefix) if isinstance(tensor.roles, PerExpert) else tuple(
            prefix + role for role in tensor.roles
        )

    return [Tensor(f"model.layers.{layer}.{t.name}", t.shape, roles(t), t.split) for t in tensors]


def is_routed_expert(role: str) -> bool:
    """Whether ``role`` is a routed expert's (a token runs only k of them)."""
    return ".mlp.experts." in role
