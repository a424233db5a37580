"""What a family module declares: the model types it reads from config.json, and the GGUF architectures it reads.

A family module (``refllm/families/<name>.py``) holds everything refllm knows of
one family of models: for each Hugging Face ``model_type`` an ``Architecture``
(its config.json reader, its tensor table, the transformers class that builds
it, a tiny config for tests), and for each GGUF ``general.architecture`` llama.cpp writes it as a
``GgufArchitecture`` (the config.json keys its metadata implies, its tensor
names, and what llama.cpp's converter did to the tensors). The registry
(``refllm/families/__init__.py``) collects them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from refllm.families.keys import HFKeys
from refllm.families.tables import ExpertNames, Tensor


@dataclass(frozen=True)
class Architecture:
    """A config.json ``model_type`` refllm runs."""

    model_type: str
    read: Callable[[HFKeys], dict[str, Any]]  # config.json -> ModelConfig's fields
    # (ModelConfig, layer, experts' layout) -> the layer's tensors: its table (refllm/families/tables.py)
    layer_tensors: Callable[[Any, int, str | None], list[Tensor]]
    hf_class: str  # the transformers causal-LM class, config.json's "architectures"
    # Keys over the oracle kit's shared tiny base (refllm/testing/configs.py) that switch on what the
    # family does differently; a "sliding_window" here takes the window the kit asks for. None: the
    # model type has no tiny config of its own (Gemma 3's multimodal wrapper).
    tiny_config: dict[str, Any] | None = None
    experts: ExpertNames | None = None  # where its files put a sparse layer's tensors
    # config.json keys of its own the kit's hypothesis draws vary (refllm/testing/strategies.py), each
    # drawn from the values given; families with a branch of their own there leave it empty
    drawn_keys: dict[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class GgufFacts:
    """What a GGUF file says, for a GgufArchitecture's ``config``: sizes already read, its metadata by key,
    and the Hugging Face names of its tensors."""

    architecture: str
    layers: int
    window: int | None  # attention.sliding_window, None when absent or 0
    hidden_size: int
    num_heads: int
    head_dim: int
    tensor_names: tuple[str, ...]
    value: Callable[..., Any]  # (key, default=None): a metadata value
    number: Callable[..., float]  # (key, default=None): a value checked to be a finite number
    size: Callable[..., int]  # (key, default=None): a value checked to be a positive integer


@dataclass(frozen=True)
class GgufArchitecture:
    """A GGUF ``general.architecture`` refllm reads, as llama.cpp's converter (``convert_hf_to_gguf.py``) writes it."""

    name: str
    # config.json keys the file implies beyond those every architecture shares: its model_type at least,
    # and the hyper-parameters llama.cpp fixes in code for it (``src/llama-model.cpp``)
    config: Callable[[GgufFacts], dict[str, Any]]
    # GGUF layer tensor names (after blk.N.) whose Hugging Face name is the family's own
    layer_names: dict[str, str] = field(default_factory=dict)
    permuted_qk: bool = False  # q/k rows permuted for llama.cpp's interleaved RoPE (LlamaModel.permute)
    norms_plus_one: bool = False  # every *norm.weight stored with 1 added (Gemma)
