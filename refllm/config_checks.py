"""Bounds on a model's hyper-parameters, checked before anything is built from them.

A config.json or GGUF file is data from anywhere: a layer count of 2**28 would build
per-layer tables of gigabytes, zero heads would divide by zero. ``ModelConfig``
checks every field here when it is made, and the sources check the layer count
against the tensors they hold, so a refusal names the field and its value instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from refllm.errors import ConfigError

MAX_LAYERS = 1024  # past the deepest published decoder (a few hundred layers)
MAX_SIZE = 2**31 - 1  # widths, vocabularies and context lengths: int32, as llama.cpp keeps them

_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")


def check_size(value: Any, name: str, high: int = MAX_SIZE) -> int:
    """An integer in [1, high], or a ConfigError naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigError(f"{name} must be an integer in [1, {high}]; got {value!r:.60}")
    return value


def check_number(value: Any, name: str, *, positive: bool = False) -> float:
    """A finite number (a positive one if asked), or a ConfigError naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number; got {value!r:.60}")
    if positive and value <= 0:
        raise ConfigError(f"{name} must be positive; got {value!r:.60}")
    return float(value)


def check_token_id(value: Any, name: str) -> int | None:
    """A token id (an integer >= 0) or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise ConfigError(f"{name} must be a token id (an integer >= 0); got {value!r:.60}")
    return value


def check_fields(config: Any) -> None:
    """Every size of a ModelConfig a positive integer in bounds, its numbers finite (its parts check their own
    when they are made: ``refllm/recipe.py``, ``refllm/moe_parameters.py``)."""
    for name in ("vocab_size", "hidden_size"):
        check_size(getattr(config, name), name)
    check_size(config.num_hidden_layers, "num_hidden_layers", MAX_LAYERS)
    check_size(config.max_position_embeddings, "max_position_embeddings")
    for name in ("embedding_scale", "residual_scale", "logit_scale", "final_logit_softcapping"):
        if getattr(config, name) is not None:
            check_number(getattr(config, name), name)
    if config.sliding_window is not None:
        check_size(config.sliding_window, "sliding_window")
    check_token_id(config.bos_token_id, "bos_token_id")
    for token_id in config.eos_token_ids:
        check_token_id(token_id, "eos_token_id")
    for rope in config.rope.values():
        for name in ("theta", "factor", "partial_rotary_factor"):
            check_number(getattr(rope, name), f"rope {name}", positive=True)
        if rope.partial_rotary_factor > 1:
            raise ConfigError(f"partial_rotary_factor must be at most 1 (all of head_dim); got {rope.partial_rotary_factor}")


def check_layer_count(num_layers: int, tensor_names: Iterable[str], where: str, extra_layers: int = 0) -> None:
    """Refuse a layer count other than the layers ``tensor_names`` (Hugging Face names) hold tensors for.

    ``extra_layers``: layers past the last the checkpoint may also hold, unused (DeepSeek-V3's
    multi-token-prediction layers)."""
    present = {int(match.group(1)) for name in tensor_names if (match := _LAYER_NAME.match(name))}
    present -= set(range(num_layers, num_layers + extra_layers))
    if len(present) != num_layers or max(present, default=-1) != num_layers - 1:  # layers 0 to num_layers - 1
        held = f"{len(present)} layers numbered up to {max(present)}" if present else "no layers"
        raise ConfigError(f"{where} gives {num_layers!r:.30} layers, but its tensors hold {held}")
