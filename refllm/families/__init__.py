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
from collections.abc import Iterable

from refllm.families.experts import expert_layout
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
)
_MODULES = [importlib.import_module(f"refllm.families.{name}") for name in FAMILY_MODULES]

MODEL_TYPES: dict[str, Architecture] = {a.model_type: a for m in _MODULES for a in m.ARCHITECTURES}
GGUF_ARCHITECTURES: dict[str, GgufArchitecture] = {g.name: g for m in _MODULES for g in getattr(m, "GGUF", ())}


def checkpoint_layout(config, tensor_names: Iterable[str] = ()) -> str | None:
    """How a checkpoint holding ``tensor_names`` stores its experts (``experts.py``); None for a dense model.
    Without names: as the family's files on the Hub hold them."""
    names = MODEL_TYPES[config.model_type].experts
    return None if config.experts is None else expert_layout(names, tensor_names)


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
        if all(is_routed_expert(role) for role in tensor.roles):
            routed += math.prod(tensor.shape)
        else:
            shared += math.prod(tensor.shape)
    if active and routed:
        routed = routed * config.experts.experts_per_token // config.experts.num_experts
    return shared + routed
