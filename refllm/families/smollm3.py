"""SmolLM3: config.json to ``ModelConfig`` fields, and llama.cpp's smollm3 files.

Llama's recipe and tensors (``refllm/families/llama.py``), in a model whose
every ``no_rope_layer_interval``-th layer (4 in the released checkpoints) runs
without RoPE. transformers spells this ``no_rope_layers``: one flag per layer, 1
where the layer *uses* RoPE and 0 where it does not, derived from the interval
when absent. No GGUF key names the NoPE layers; llama.cpp fixes the interval at
4, and so does refllm. Its converter permutes q/k rows as for llama files.
"""

from __future__ import annotations

from typing import Any

from refllm.errors import ConfigError
from refllm.families.family import Architecture, GgufArchitecture
from refllm.families.keys import (
    HFKeys,
    common_fields,
    gated_mlp,
    grouped_query_attention,
    rms_norms,
    rope_for_types,
    single_rope,
)
from refllm.families.llama import layer_tensors
from refllm.rope_parameters import FULL_ATTENTION, SLIDING_ATTENTION

SMOLLM3_ROPE_THETA = 2_000_000.0  # transformers' SmolLM3Config default
SMOLLM3_NO_ROPE_LAYER_INTERVAL = 4


def nope_layers(keys: HFKeys, num_layers: int) -> tuple[int, ...]:
    """The layers that skip RoPE, from ``no_rope_layers`` or, when absent, ``no_rope_layer_interval``."""
    flags = keys.get("no_rope_layers")
    if flags is None:
        interval = keys.size("no_rope_layer_interval", SMOLLM3_NO_ROPE_LAYER_INTERVAL)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if not isinstance(flags, list) or len(flags) != num_layers or any(f not in (0, 1) for f in flags):
        raise ConfigError(
            f"no_rope_layers must be {num_layers} flags of 0 or 1 (1: the layer uses RoPE); got {flags!r:.80}"
        )
    return tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)


def read_smollm3(keys: HFKeys) -> dict[str, Any]:
    common = common_fields(keys)
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    n = common["num_hidden_layers"]
    skipped = nope_layers(keys, n)
    # transformers slides only where use_sliding_window is on; its derived layer_types put the windows on NoPE layers
    window = keys.get("sliding_window") if keys.get("use_sliding_window", False) else None
    if window is None:
        layer_types = (FULL_ATTENTION,) * n
    elif keys.items("layer_types") is not None:
        layer_types = keys.items("layer_types")
    else:
        layer_types = tuple(SLIDING_ATTENTION if i in skipped else FULL_ATTENTION for i in range(n))
    bias = bool(keys.get("attention_bias", False))
    return dict(
        **common,
        attention=grouped_query_attention(keys, bias=bias, output_bias=bias),
        mlp=gated_mlp(keys, bias=bool(keys.get("mlp_bias", False))),
        norms=rms_norms(keys),
        sliding_window=window if SLIDING_ATTENTION in layer_types else None,
        layer_types=layer_types,
        nope_layers=skipped,
        rope=rope_for_types(layer_types, single_rope(keys, SMOLLM3_ROPE_THETA)),
    )


ARCHITECTURES = (
    # the second of the two layers runs without RoPE
    Architecture(
        "smollm3", read_smollm3, layer_tensors, "SmolLM3ForCausalLM", tiny_config=dict(no_rope_layer_interval=2)
    ),
)
GGUF = (
    GgufArchitecture(
        "smollm3",
        lambda facts: {"model_type": "smollm3", "no_rope_layer_interval": SMOLLM3_NO_ROPE_LAYER_INTERVAL},
        permuted_qk=True,
    ),
)
