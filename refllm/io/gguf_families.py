"""What some GGUF architectures leave out of their metadata, as the config.json keys refllm reads.

llama.cpp fixes these hyper-parameters in code when it loads such a file
(``src/llama-model.cpp``); refllm fixes the same values here, from the published
architectures. ``FAMILY_CONFIGS[arch](facts)`` adds them to the keys every
architecture shares (``GGUFSource._hf_config``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Gemma 3 (LLM_ARCH_GEMMA3), from google/gemma_pytorch (gemma/config.py):
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # five sliding-window layers, then one global layer
GEMMA3_LOCAL_ROPE_THETA = 10_000.0  # RoPE base of the sliding-window layers
GEMMA3_27B_LAYERS = 62  # the 27B scales queries by (D / H)^-0.5; the others by E^-0.5
# Gemma 2 (LLM_ARCH_GEMMA2): sliding and global layers alternate, the first one sliding.
GEMMA2_SLIDING_WINDOW_PATTERN = 2
GEMMA2_27B_LAYERS = 46  # as Gemma 3's 27B, it scales queries by (D / H)^-0.5
# SmolLM3 (LLM_ARCH_SMOLLM3): every fourth layer skips RoPE; no GGUF key says so.
SMOLLM3_NO_ROPE_LAYER_INTERVAL = 4


@dataclass(frozen=True)
class FamilyFacts:
    """What the family readers need of a GGUF file: sizes already read, and its metadata by key."""

    architecture: str
    layers: int
    window: int | None  # attention.sliding_window, None when absent or 0
    hidden_size: int
    num_heads: int
    head_dim: int
    value: Callable[[str], Any]  # a metadata value, or None
    number: Callable[[str], float]  # a metadata value checked to be a finite number


def _layer_types(facts: FamilyFacts, pattern: int) -> list[str]:
    """Every ``pattern``-th layer global, the others sliding; all global when the file has no window."""
    if facts.window is None:  # newer converters omit the window of a model without one
        return ["full_attention"] * facts.layers
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(facts.layers)]


def _gemma(facts: FamilyFacts, pattern: int, layers_27b: int) -> dict[str, Any]:
    config: dict[str, Any] = dict(
        layer_types=_layer_types(facts, pattern),
        query_pre_attn_scalar=facts.hidden_size // facts.num_heads if facts.layers == layers_27b else facts.head_dim,
        hidden_activation="gelu_pytorch_tanh",
    )
    if facts.window is not None:
        config["sliding_window"] = facts.window
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if facts.value(f"{facts.architecture}.{cap}"):
            config[cap] = facts.number(f"{facts.architecture}.{cap}")
    return config


def gemma3_config(facts: FamilyFacts) -> dict[str, Any]:
    """Gemma 3 files carry no layer pattern, local RoPE base or query scale (and no attention soft-cap)."""
    config = _gemma(facts, GEMMA3_SLIDING_WINDOW_PATTERN, GEMMA3_27B_LAYERS)
    config.pop("attn_logit_softcapping", None)
    return config | {"rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA}


def gemma2_config(facts: FamilyFacts) -> dict[str, Any]:
    """Gemma 2 files carry no layer pattern or query scale; both soft-caps are keys of their own
    (llama.cpp takes 50 and 30 where they are missing, as transformers does)."""
    return _gemma(facts, GEMMA2_SLIDING_WINDOW_PATTERN, GEMMA2_27B_LAYERS)


def smollm3_config(facts: FamilyFacts) -> dict[str, Any]:
    return {"no_rope_layer_interval": SMOLLM3_NO_ROPE_LAYER_INTERVAL}


FAMILY_CONFIGS: dict[str, Callable[[FamilyFacts], dict[str, Any]]] = {
    "gemma3": gemma3_config,
    "gemma2": gemma2_config,
    "smollm3": smollm3_config,
}
