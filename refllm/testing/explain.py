"""Failures that explain themselves: the model, the input, the first layer and op that diverge, a repro.

A failing property becomes a report like

    property 'logits' fails on backend 'RopeBaseOff' (profile float32)
      claim:  Logits at every position of a prompt match the reference.
      what:   logits at position 1: max |Δ| 0.000421 at token id 15 (-0.159447 vs -0.159868; allowed ...)
      model:  llama, 2 layers, D=32 V=64; norms: pre-norm RMSNorm, eps 1e-06; ...; random weights, seed 0
      input:  {"tokens": [3, 4, 9]}
      layers: prefilling those 2 tokens in one shot, hidden states match the reference through the embeddings and
              first diverge at the output of layer 0 (max |Δ| 0.000301 at position 1); in layer 0 the first op to
              diverge is the attention (the attention input matches, the attention output does not: ...)
      truth:  error against float64 truth 0.00022 of the largest logit, 2.27e+03x refllm's float32 spec (9.72e-08)
      repro:  python -m refllm.testing.repro --backend tests.helpers.mutants:rope_base_off '{"property":"logits",...}'

The layer comes from the hidden states a backend exposes (``Backend.layer_states``), the op inside it from
what enters and leaves its attention and MLP (``Backend.sublayer_states``), each compared with refllm's
float32 spec under the profile in use. Under hypothesis the report printed is the one of the smallest case found.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from refllm.testing.backends import Backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import refllm_contiguous
from refllm.testing.layer_trace import SUBLAYER_POINTS
from refllm.testing.properties import PROPERTIES
from refllm.testing.tolerances import Tolerance
from refllm.testing.truth import error_against_truth


@dataclass(frozen=True)
class Case:
    """Everything that reproduces one property run: JSON-ready."""

    property: str
    config_json: dict[str, Any] | None
    seed: int | None
    profile: str
    args: dict[str, Any]
    weights: dict[str, Any] = field(default_factory=dict)  # Checkpoint.random's std, lm_head and router

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls(**json.loads(text))

    def checkpoint(self) -> Checkpoint:
        if self.config_json is None or self.seed is None:
            raise ValueError(f"case for property {self.property!r} has no random checkpoint to rebuild")
        return Checkpoint.random(self.config_json, self.seed, **self.weights)


def count(n: int, noun: str) -> str:
    """count(1, "token") -> "1 token"; count(3, "token") -> "3 tokens"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def describe_model(checkpoint: Checkpoint) -> str:
    """One line with every setting that changes the arithmetic: the sizes, then the recipe."""
    c = checkpoint.config
    sizes = f"{c.model_type}, {count(c.num_hidden_layers, 'layer')}, D={c.hidden_size} V={c.vocab_size}"
    return "; ".join([sizes, *c.describe(), checkpoint.description])


def state_name(index: int) -> str:
    """What entry ``index`` of per-layer hidden states [L + 1, T, D] holds."""
    return "the embeddings" if index == 0 else f"the output of layer {index - 1}"


def first_divergent_layer(backend: Backend, reference: Backend, tokens: list[int], profile: Tolerance) -> str:
    """Compare per-layer hidden states of a one-shot prefill of ``tokens`` and say where they first part."""
    try:
        states = backend.layer_states(tokens)
    except Exception as error:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
        return f"{backend.name} could not give per-layer hidden states ({type(error).__name__}: {error})"
    if states is None:
        return f"{backend.name} exposes no per-layer hidden states"
    expected = reference.layer_states(tokens)
    if np.shape(states) != expected.shape:
        return f"per-layer hidden states have shape {np.shape(states)}, the reference's {expected.shape}"
    subject = "that token" if len(tokens) == 1 else f"those {len(tokens)} tokens in one shot"
    prefix = f"prefilling {subject},"
    for index, (got, want) in enumerate(zip(states, expected)):
        if not profile.close(got, want):
            agreed = f"match the reference through {state_name(index - 1)} and " if index else ""
            report = f"{prefix} hidden states {agreed}first diverge at {state_name(index)} ({_worst(got, want)})"
            return report + (f"; {first_divergent_op(backend, reference, tokens, profile, index - 1)}" if index else "")
    return (
        f"{prefix} every layer matches the reference, so the difference comes after the last layer"
        " (final norm, LM head, soft-cap) or from how the property feeds the tokens (chunks, cache reuse, batching)"
    )


# The ops between one point of SUBLAYER_POINTS and the one before it (the layer's input before the first, its
# output after the last): the first point that diverges convicts the ops just before it.
OPS_BEFORE = {
    "attention input": ("the attention's input norm",),
    "attention output": ("the attention",),
    "MLP input": ("the attention's output norm", "the residual add after the attention", "the MLP's input norm"),
    "MLP output": ("the MLP",),
    "layer output": ("the MLP's output norm", "the residual add after the MLP"),
}


def first_divergent_op(backend: Backend, reference: Backend, tokens: list[int], profile: Tolerance, layer: int) -> str:
    """Inside ``layer``, whose input matches the reference and whose output does not, the first op that diverges."""
    try:
        sublayers = backend.sublayer_states(tokens)
    except Exception as error:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
        return f"{backend.name} could not give its layers' insides ({type(error).__name__}: {error})"
    if sublayers is None:
        return f"{backend.name} exposes nothing inside a layer, so the op is not named"
    expected = reference.sublayer_states(tokens)
    if len(sublayers) != len(expected):
        return f"{backend.name} gave the insides of {count(len(sublayers), 'layer')}, the reference has {len(expected)}"
    got, want = sublayers[layer], expected[layer]
    suspects, agreed = [], "the layer's input"  # the ops since the last point both expose and agree on
    for point in SUBLAYER_POINTS:
        suspects += OPS_BEFORE[point]
        if point not in got or point not in want:
            continue
        if np.shape(got[point]) != np.shape(want[point]):
            return f"in layer {layer} the {point} has shape {np.shape(got[point])}, the reference's {want[point].shape}"
        if not profile.close(got[point], want[point]):
            return (
                f"in layer {layer} the first op to diverge is {_either(suspects)}"
                f" ({agreed} matches, the {point} does not: {_worst(got[point], want[point])})"
            )
        suspects, agreed = [], f"the {point}"
    culprits = _either(suspects + list(OPS_BEFORE["layer output"]))
    return f"in layer {layer} the first op to diverge is {culprits} ({agreed} matches, the layer's output does not)"


def _either(names: list[str]) -> str:
    """["a"] -> "a"; ["a", "b", "c"] -> "a, b or c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _worst(got: np.ndarray, want: np.ndarray) -> str:
    """Where two [T, D] states differ most: "max |Δ| 0.0123 at position 3"."""
    delta = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    return f"max |Δ| {delta.max():.3g} at position {int(np.unravel_index(np.argmax(delta), delta.shape)[0])}"


def _error_against_truth(backend: Backend, checkpoint: Checkpoint, tokens: list[int]) -> str:
    try:
        return error_against_truth(backend, checkpoint, tokens).describe()
    except Exception as error:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
        return f"{backend.name} could not give all-position logits ({type(error).__name__}: {error})"


def explain(
    case: Case, mismatch, backend: Backend, checkpoint: Checkpoint, profile: Tolerance, spec: str | None
) -> str:
    lines = [
        f"property {case.property!r} fails on backend {backend.name!r} (profile {profile.name})",
        f"  claim:  {PROPERTIES[case.property].claim}",
        f"  what:   {mismatch.what}",
        f"  model:  {describe_model(checkpoint)}",
        f"  input:  {json.dumps(case.args, separators=(', ', ': '))}",
    ]
    if mismatch.tokens:
        lines.append(
            f"  layers: {first_divergent_layer(backend, refllm_contiguous(checkpoint), mismatch.tokens, profile)}"
        )
        lines.append(f"  truth:  {_error_against_truth(backend, checkpoint, mismatch.tokens)}")
    if spec and case.seed is not None:
        lines.append(f"  repro:  python -m refllm.testing.repro --backend {spec} {shlex.quote(case.to_json())}")
    elif case.seed is not None:
        lines.append(f"  case:   {case.to_json()}")
    return "\n".join(lines)
