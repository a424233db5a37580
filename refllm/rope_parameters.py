"""RoPE settings per layer type, as config.json spells them (the maths is in ``refllm/nn/rope.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refllm.config_checks import MAX_SIZE, OPTIONAL_POSITIVE, POSITIVE, Bound, check_bounds
from refllm.errors import ConfigError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

# What each field may hold, whatever the rope type (a field the type does not read is still refused when bad).
ROPE_BOUNDS = {
    "theta": Bound(float, 1, above=True),  # the base: log(theta) divides, theta ** (-i / d) must fall
    "partial_rotary_factor": Bound(float, 0, 1, above=True),
    "factor": Bound(float, 0, MAX_SIZE, above=True),
    "low_freq_factor": POSITIVE,
    "high_freq_factor": POSITIVE,
    "original_max_position_embeddings": Bound(int, 1, MAX_SIZE, optional=True),
    "attention_factor": OPTIONAL_POSITIVE,
    "beta_fast": POSITIVE,
    "beta_slow": POSITIVE,
    # YaRN's 0.1 * mscale * ln(factor) + 1 stays >= 1 for mscale >= 0 (DeepSeek divides by it)
    "mscale": Bound(float, 0, optional=True),
    "mscale_all_dim": Bound(float, 0, optional=True),
}


@dataclass(frozen=True)
class RopeParameters:
    """Rotary embedding settings for one layer type (see ``refllm/nn/rope.py``).

    ``rope_type`` picks how the inverse frequencies are scaled:
    ``default`` (none), ``linear`` (positions / factor), ``dynamic`` (NTK-aware
    base growth past ``max_position_embeddings``), ``llama3`` (wavelength-banded
    interpolation) and ``yarn`` (ramped interpolation plus an attention factor).
    Every field is checked against ``ROPE_BOUNDS`` when the settings are made.
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

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"unsupported rope type {self.rope_type!r:.40}; supported: {', '.join(ROPE_TYPES)}")
        check_bounds(self, ROPE_BOUNDS, "rope ")
        if not isinstance(self.truncate, bool):
            raise ConfigError(f"rope truncate must be true or false; got {self.truncate!r:.40}")
        if self.rope_type in ("llama3", "yarn") and self.original_max_position_embeddings is None:
            raise ConfigError(f"rope type {self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(  # the band between them is divided by their difference
                f"rope high_freq_factor ({self.high_freq_factor}) must be above"
                f" low_freq_factor ({self.low_freq_factor})"
            )
        if self.rope_type == "yarn" and self.beta_fast < self.beta_slow:
            raise ConfigError(  # the ramp would run backwards
                f"rope beta_fast ({self.beta_fast}) must be at least beta_slow ({self.beta_slow})"
            )

    @classmethod
    def from_dict(cls, params: dict[str, Any], default_theta: float, max_position_embeddings: int) -> RopeParameters:
        """From config.json's ``rope_parameters`` (or ``rope_scaling``); a key that is absent or null takes its
        default, any other value is checked as it is (a 0 stays 0, and is refused where it is no value)."""
        rope_type = params.get("rope_type", params.get("type", "default"))
        needs_factor = rope_type in ("linear", "dynamic", "llama3", "yarn")
        if needs_factor and params.get("factor") is None:
            raise ConfigError(f"rope type {rope_type!r} needs the key 'factor'")

        def given(key: str, default: Any) -> Any:
            value = params.get(key)
            return default if value is None else value

        return cls(
            theta=given("rope_theta", default_theta),
            rope_type=rope_type,
            partial_rotary_factor=given("partial_rotary_factor", 1.0),
            factor=given("factor", 1.0),
            low_freq_factor=given("low_freq_factor", 1.0),
            high_freq_factor=given("high_freq_factor", 4.0),
            original_max_position_embeddings=given("original_max_position_embeddings", max_position_embeddings),
            attention_factor=params.get("attention_factor"),
            beta_fast=given("beta_fast", 32.0),
            beta_slow=given("beta_slow", 1.0),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=given("truncate", True),
        )
