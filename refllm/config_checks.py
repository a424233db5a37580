"""Bounds on a model's hyper-parameters, checked before anything is built from them.

A config.json or GGUF file is data from anywhere: a layer count of 2**28 would build
per-layer tables of gigabytes, zero heads would divide by zero, a NaN scale would turn
every logit into NaN. Each settings class declares what its fields may hold in a table
of ``Bound``s (``MODEL_BOUNDS`` here, ``NORMS_BOUNDS`` and the others of the recipe's parts
in ``recipe.py``, ``ROPE_BOUNDS`` in ``rope_parameters.py``, ``MOE_BOUNDS`` in
``moe_parameters.py``) and checks it with ``check_bounds`` when it is made; the sources
check the layer count (and the experts, ``families.check_expert_count``)
against the tensors they hold, so a refusal names the field and its value instead.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from refllm.errors import ConfigError

MAX_LAYERS = 1024  # past the deepest published decoder (a few hundred layers)
MAX_SIZE = 2**31 - 1  # widths, vocabularies and context lengths: int32, as llama.cpp keeps them

_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Bound:
    """What one field may hold: a number of ``kind`` in [low, high] (``above``: strictly above low).

    ``int``: an integer; ``float``: a finite number, an integer included (made a float).
    A bool is neither. ``optional``: None too (the field is unset).
    """

    kind: type = float
    low: float = -math.inf
    high: float = math.inf
    above: bool = False
    optional: bool = False

    def describe(self) -> str:
        low, high = (int(x) if math.isfinite(x) and x == int(x) else x for x in (self.low, self.high))
        if self.kind is int:
            return f"an integer in [{low}, {high}]"
        if self.high < math.inf:
            return f"a finite number in {'(' if self.above else '['}{low}, {high}]"
        if self.low > -math.inf:
            return f"a finite number {'>' if self.above else '>='} {low}"
        return "a finite number"

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value) or abs(value) > sys.float_info.max:
            return False  # NaN, an infinity, or an integer past every float
        if value > self.high:
            return False
        return value > self.low if self.above else value >= self.low


SIZE = Bound(int, 1, MAX_SIZE)
COUNT = Bound(int, 0, MAX_SIZE)
FINITE = Bound()
POSITIVE = Bound(float, 0, above=True)
OPTIONAL_POSITIVE = Bound(float, 0, above=True, optional=True)


def checked(value: Any, name: str, bound: Bound) -> Any:
    """``value`` if ``bound`` holds it (a float for a float bound), else a ConfigError naming ``name`` and the value."""
    if value is None and bound.optional:
        return None
    if not bound.holds(value):
        raise ConfigError(f"{name} must be {bound.describe()}{' or null' if bound.optional else ''}; got {value!r:.60}")
    return float(value) if bound.kind is float else value


def check_bounds(holder: Any, bounds: dict[str, Bound], prefix: str = "", keys: dict[str, str] | None = None) -> None:
    """Every field of the frozen dataclass ``holder`` named in ``bounds`` within its bound; floats made floats.

    A refusal names the field as ``prefix`` + its config.json key (``keys``, where it differs from the field's name)."""
    for name, bound in bounds.items():
        key = prefix + (keys or {}).get(name, name)
        object.__setattr__(holder, name, checked(getattr(holder, name), key, bound))


def check_size(value: Any, name: str, high: int = MAX_SIZE) -> int:
    """An integer in [1, high], or a ConfigError naming ``name`` and the value."""
    return checked(value, name, Bound(int, 1, high))


def check_number(value: Any, name: str, *, positive: bool = False) -> float:
    """A finite number (a positive one if asked), or a ConfigError naming ``name`` and the value."""
    return checked(value, name, POSITIVE if positive else FINITE)


# config.json's yes-or-no keys: each true, false or null (``bool`` would read "false", 3 or [0] as true).
FLAG_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window", "norm_topk_prob",
             "rope_interleave")  # fmt: skip


def check_flags(config: dict[str, Any]) -> None:
    """Every key of ``FLAG_KEYS`` in ``config`` true, false or null."""
    for key in FLAG_KEYS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise ConfigError(f"{key} must be true or false; got {config[key]!r:.60}")


def check_token_id(value: Any, name: str) -> int | None:
    """A token id (an integer >= 0) or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise ConfigError(f"{name} must be a token id (an integer >= 0); got {value!r:.60}")
    return value


# ModelConfig's own numbers; the layer lists are checked by ``check_layers``, the recipe's parts, RoPE and
# experts by their own tables (``refllm/recipe.py``, ``rope_parameters.py``, ``moe_parameters.py``).
MODEL_BOUNDS = {
    "vocab_size": SIZE,
    "hidden_size": SIZE,
    "num_hidden_layers": Bound(int, 1, MAX_LAYERS),
    "max_position_embeddings": SIZE,
    "embedding_scale": POSITIVE,
    "residual_scale": OPTIONAL_POSITIVE,
    "logit_scale": OPTIONAL_POSITIVE,
    "final_logit_softcapping": OPTIONAL_POSITIVE,
    "sliding_window": Bound(int, 1, MAX_SIZE, optional=True),
    "unused_layers": Bound(int, 0, MAX_LAYERS),
}


def check_fields(config: Any) -> None:
    """Every number of a ModelConfig in its bound (``MODEL_BOUNDS``), its token ids valid (its parts check their
    own when they are made: ``refllm/recipe.py``, ``moe_parameters.py``, ``rope_parameters.py``)."""
    check_bounds(config, MODEL_BOUNDS)
    check_token_id(config.bos_token_id, "bos_token_id")
    for token_id in config.eos_token_ids:
        check_token_id(token_id, "eos_token_id")


def check_layer_indices(indices: Iterable[Any], name: str, num_layers: int) -> None:
    """Layer indices: integers in [0, num_layers), each listed once."""
    seen = set()
    for layer in indices:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ConfigError(f"{name} holds {layer!r:.30}, not a layer of 0 .. {num_layers - 1}")
        if layer in seen:
            raise ConfigError(f"{name} lists layer {layer} twice")
        seen.add(layer)


def check_layer_types(layer_types: tuple[Any, ...], known: tuple[str, ...], num_layers: int) -> None:
    """One attention type per layer, each one of ``known`` (an unknown one would silently run as full attention)."""
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    for layer, layer_type in enumerate(layer_types):
        if layer_type not in known:
            raise ConfigError(f"layer_types gives layer {layer} the type {layer_type!r:.40}; known: {', '.join(known)}")


def check_layers(config: Any, known_types: tuple[str, ...]) -> None:
    """The per-layer lists of a ModelConfig: one known type per layer, layer indices within range (and the
    dense layers of its experts', ``MoeParameters.check_layers``)."""
    check_layer_types(config.layer_types, known_types, config.num_hidden_layers)
    check_layer_indices(config.nope_layers, "nope_layers", config.num_hidden_layers)


def check_layer_count(num_layers: int, tensor_names: Iterable[str], where: str, extra_layers: int = 0) -> None:
    """Refuse a layer count other than the layers ``tensor_names`` (Hugging Face names) hold tensors for.

    ``extra_layers``: layers past the last the checkpoint may also hold, unused (DeepSeek-V3's
    multi-token-prediction layers)."""
    present = {int(match.group(1)) for name in tensor_names if (match := _LAYER_NAME.match(name))}
    present -= set(range(num_layers, num_layers + extra_layers))
    if len(present) != num_layers or max(present, default=-1) != num_layers - 1:  # layers 0 to num_layers - 1
        held = f"{len(present)} layers numbered up to {max(present)}" if present else "no layers"
        raise ConfigError(f"{where} gives {num_layers!r:.30} layers, but its tensors hold {held}")
