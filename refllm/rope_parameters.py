"""RoPE settings per layer type, as config.json spells them (the maths is in ``refllm/nn/rope.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refllm.errors import ConfigError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeParameters:
    """Rotary embedding settings for one layer type (see ``refllm/nn/rope.py``).

    ``rope_type`` picks how the inverse frequencies are scaled:
    ``default`` (none), ``linear`` (positions / factor), ``dynamic`` (NTK-aware
    base growth past ``max_position_embeddings``), ``llama3`` (wavelength-banded
    interpolation) and ``yarn`` (ramped interpolation plus an attention factor).
    """

    theta: float = 10_000.0
    rope_type: str = "default"
    partial_rotary_factor: float = 1.0
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    @classmethod
    def from_dict(cls, params: dict[str, Any], default_theta: float, max_position_embeddings: int) -> RopeParameters:
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ConfigError(f"unsupported rope type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        needs_factor = rope_type in ("linear", "dynamic", "llama3", "yarn")
        if needs_factor and params.get("factor") is None:
            raise ConfigError(f"rope type {rope_type!r} needs the key 'factor'")
        return cls(
            theta=float(params.get("rope_theta", default_theta)),
            rope_type=rope_type,
            partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
            factor=float(params.get("factor") or 1.0),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings") or max_position_embeddings
            ),
            attention_factor=params.get("attention_factor"),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )
