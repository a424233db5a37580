"""The families refllm runs, one module each: a new family is its module and a line in ``FAMILY_MODULES``.

Each module (``refllm/families/<name>.py``) declares ``ARCHITECTURES``, the
config.json model types it reads (``family.Architecture``), and ``GGUF``, the GGUF
architectures llama.cpp writes its models as (``family.GgufArchitecture``). Twins
share a module: Mistral is Llama's, Qwen3 is Qwen2's.

The two name spaces differ: ``MODEL_TYPES`` is keyed by config.json's
``model_type`` (``gemma3_text``, ``qwen3_moe``), ``GGUF_ARCHITECTURES`` by a GGUF
file's ``general.architecture`` (``gemma3``, ``qwen3moe``).

``checkpoint_tensors(config)`` is a model's whole tensor table (``tables.py``):
what its checkpoint holds, the shapes a load checks, where each tensor's values
go, and (``parameter_count``) how many weights the model has.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Iterable

from refllm.errors import ConfigError
from refllm.families.experts import FUSED, PER_EXPERT, expert_layout
from refllm.families.family import Architecture, GgufArchitecture
from refllm.families.tables import Tensor, is_routed_expert, layer_prefixed, model_tensors

FAMILY_MODULES = (
    "llama",
    "qwen",
    "phi3",
    "gemma",
    "smollm3",
    "olmo2",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
    "deepseek",
    "granite",
    "cohere",
    "vision",
)
_MODULES = [importlib.import_module(f"refllm.families.{name}") for name in FAMILY_MODULES]

MODEL_TYPES: dict[str, Architecture] = {a.model_type: a for m in _MODULES for a in m.ARCHITECTURES}
GGUF_ARCHITECTURES: dict[str, GgufArchitecture] = {g.name: g for m in _MODULES for g in getattr(m, "GGUF", ())}


def checkpoint_layout(config, tensor_names: Iterable[str] = ()) -> str | None:
    """How a checkpoint holding ``tensor_names`` stores its experts (``experts.py``); None for a dense model.
    Without names: as the family's files on the Hub hold them."""
    names = MODEL_TYPES[config.model_type].experts
    return None if config.experts is None else expert_layout(names, tensor_names)


_EXPERT_NAME = re.compile(r"model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.")


def check_expert_count(config, tensor_names: Iterable[str], where: str) -> None:
    """Refuse, naming ``where`` (the file and its key), a per-expert checkpoint whose tensors hold other experts
    than ``config``'s count, numbered 0 to X - 1: before the table builds a name per expert (a count of 10**7
    would build 3 * 10**7 names per layer, gigabytes, before the first comparison). The fused and stacked
    layouts hold every expert of a projection in one tensor, whose shape the load compares first."""
    names = list(tensor_names)
    if not any(config.is_sparse(layer) for layer in range(config.num_hidden_layers)):
        return  # dense
    if checkpoint_layout(config, names) != PER_EXPERT:
        return
    present = {int(match.group(1)) for name in names if (match := _EXPERT_NAME.match(name))}
    count = config.experts.num_experts
    if len(present) != count or max(present, default=-1) != count - 1:
        held = f"{len(present)} experts numbered up to {max(present)}" if present else "no expert tensors"
        raise ConfigError(f"{where} gives {count} experts per sparse layer, but its tensors hold {held}")


def checkpoint_tensors(config, layout: str | None = None) -> list[Tensor]:
    """Every tensor of a checkpoint of ``config`` (a ModelConfig), its experts (if any) in ``layout``."""
    layout = layout or checkpoint_layout(config)
    layer_tensors = MODEL_TYPES[config.model_type].layer_tensors
    tensors = model_tensors(config)
    for layer in range(config.num_hidden_layers):
        tensors += layer_prefixed(layer_tensors(config, layer, layout), layer)
    return tensors


def parameter_count(config, active: bool = False) -> int:
    """The weights of ``config``'s checkpoint; ``active``: of each sparse layer's routed experts only the
    k a token runs (their share k / X of the experts' weights)."""
    shared, routed = 0, 0
    for tensor in checkpoint_tensors(config):
        if is_routed_expert(tensor.roles[0]):  # a tensor's roles are all a routed expert's, or none
            routed += math.prod(tensor.shape)
        else:
            shared += math.prod(tensor.shape)
    if active and routed:
        routed = routed * config.experts.experts_per_token // config.experts.num_experts
    return shared + routed
