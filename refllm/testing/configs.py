"""Tiny ``config.json`` dicts for tests, one per architecture refllm supports.

Hugging Face spellings, so that refllm (``ModelConfig.from_hf``) and
transformers (``AutoConfig.for_model``) both build the model they describe:
a shared tiny base, and over it the keys that switch on what each family does
differently (its family module's ``tiny_config``, ``refllm/families/``).
The hypothesis strategies in ``strategies.py`` draw variations of these.
"""

from __future__ import annotations

import copy
from typing import Any

from refllm.errors import InvalidInputError
from refllm.families import MODEL_TYPES

# every model type with a tiny config of its own (gemma3 wraps gemma3_text and idefics3 a llama: their
# images are refllm/testing/vision.py's)
ARCHITECTURES = tuple(name for name, architecture in MODEL_TYPES.items() if architecture.tiny_config is not None)


class UnknownArchitectureError(InvalidInputError):
    """An architecture name the kit has no tiny config for."""


def check_architectures(names) -> tuple[str, ...]:
    """-> the non-empty names as a tuple; refuses one not in ARCHITECTURES."""
    names = tuple(name for name in names if name)
    for name in names:
        if name not in ARCHITECTURES:
            raise UnknownArchitectureError(f"architecture {name!r} is not one of {', '.join(ARCHITECTURES)}")
    if not names:
        raise UnknownArchitectureError(f"no architecture named; choose from {', '.join(ARCHITECTURES)}")
    return names


CLASS_NAMES = {  # the transformers causal-LM class of each architecture, for config.json's "architectures"
    model_type: MODEL_TYPES[model_type].hf_class for model_type in ARCHITECTURES
}
# config.json keys of its own each family's draws vary (strategies.py), with the values to draw from
DRAWN_KEYS = {model_type: MODEL_TYPES[model_type].drawn_keys for model_type in ARCHITECTURES}


def tiny_config_json(model_type: str, sliding_window: int = 5) -> dict[str, Any]:
    """A fixed tiny ``config.json`` dict per architecture, each with its distinguishing flags on."""
    check_architectures([model_type])
    base = dict(
        model_type=model_type,
        architectures=[CLASS_NAMES[model_type]],
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    extra = copy.deepcopy(MODEL_TYPES[model_type].tiny_config)
    if "sliding_window" in extra:
        extra["sliding_window"] = sliding_window
    return base | extra
