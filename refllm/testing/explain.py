"""Failures that explain themselves: the model, the input, the first layer that diverges, a repro.

A failing property becomes a report like

    property 'logits' fails on backend 'RopeBaseOff' (profile float32)
      claim:  Logits at every position of a prompt match the reference.
      what:   logits at position 1: max |Δ| 0.000266 at token id 5 (-0.0870186 vs -0.0867527; allowed ...)
      model:  llama, 1 layer, D=16 H=2 K=1 E=4 F=16 V=32, rope theta 10000, eps 1e-06, silu, ...; random weights, seed 0
      input:  {"tokens": [3, 4]}
      layers: prefilling those 2 tokens in one shot, hidden states match the reference through the
              embeddings and first diverge at the output of layer 0 (max |Δ| 6.76e-05 at position 1)
      repro:  python -m refllm.testing.repro --backend tests.helpers.mutants:rope_base_off '{"property":"logits",...}'

Under hypothesis the report printed is the one of the smallest case found.
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
            delta = np.abs(got - want)  # [T, D]
            position = int(np.unravel_index(np.argmax(delta), delta.shape)[0])
            agreed = f"match the reference through {state_name(index - 1)} and " if index else ""
            return (
                f"{prefix} hidden states {agreed}first diverge at {state_name(index)}"
                f" (max |Δ| {delta.max():.3g} at position {position})"
            )
    return (
        f"{prefix} every layer matches the reference, so the difference comes after the last layer"
        " (final norm, LM head, soft-cap) or from how the property feeds the tokens (chunks, cache reuse, batching)"
    )


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
