"""ModelConfig: one dataclass for every supported architecture.

Llama, Mistral, Qwen2, Qwen3, Phi-3 and Gemma 3 differ only by the flags below;
the forward pass in ``refllm/models/llama.py`` reads them, it never asks which
architecture it is running.

``ModelConfig.from_hf(config_json)`` reads a Hugging Face ``config.json`` in
both spellings found in the wild: the long-standing keys (``rope_theta``,
``rope_scaling``, ``rope_local_base_freq``, ``sliding_window_pattern``) and the
transformers 5 keys (``rope_parameters``, per layer type for Gemma 3, and
``layer_types``). Unknown keys are ignored; a missing required key is an error
that names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from refllm.config_checks import MAX_LAYERS, check_fields, check_number, check_size
from refllm.errors import ConfigError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma3")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class UnsupportedArchitectureError(ConfigError):
    """A ``model_type`` refllm does not implement."""


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


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model.

    Dimension letters used across refllm: ``D`` hidden size, ``H`` query heads,
    ``K`` KV heads, ``E`` head dim, ``F`` MLP size, ``V`` vocabulary, ``L`` layers.
    """

    model_type: str
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_hidden_layers: int  # L
    num_attention_heads: int  # H
    num_key_value_heads: int  # K
    head_dim: int  # E
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    # Biases: q/k/v projections, the output projection, and the three MLP projections.
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    # Per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    # Gemma stores RMSNorm weights as w - 1 and applies (1 + w).
    norm_weight_offset: float = 0.0
    # Gemma multiplies embeddings by sqrt(D); 1.0 elsewhere.
    embedding_scale: float = 1.0
    # Gemma's sandwich norms: a norm after attention and another pair around the MLP.
    sandwich_norms: bool = False
    # Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj.
    fused_qkv: bool = False
    fused_gate_up: bool = False
    attention_scale: float | None = None  # defaults to E ** -0.5
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    rope: dict[str, RopeParameters] = field(default_factory=dict)  # keyed by layer type
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self)  # before anything is built per layer
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unsupported activation {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        if self.attention_scale is None:
            object.__setattr__(self, "attention_scale", self.head_dim**-0.5)
        for layer_type in set(self.layer_types):
            if layer_type not in self.rope:
                raise ConfigError(f"no rope parameters for layer type {layer_type!r}")

    @property
    def context_length(self) -> int:
        """The longest sequence refllm runs: max_position_embeddings, stretched by dynamic NTK scaling."""
        dynamic = [p.factor for p in self.rope.values() if p.rope_type == "dynamic"]
        return int(self.max_position_embeddings * max(dynamic, default=1.0))

    def window_for_layer(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (keys within the last W positions), or None."""
        return self.sliding_window if self.layer_types[layer] == SLIDING_ATTENTION else None

    def rope_for_layer(self, layer: int) -> RopeParameters:
        return self.rope[self.layer_types[layer]]

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    @property
    def num_parameters(self) -> int:
        D, F, V, E = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        H, K = self.num_attention_heads, self.num_key_value_heads
        attention = D * H * E + 2 * D * K * E + H * E * D
        mlp = 3 * D * F
        norms = (4 if self.sandwich_norms else 2) * D + (2 * E if self.qk_norm else 0)
        per_layer = attention + mlp + norms
        head = 0 if self.tie_word_embeddings else V * D
        return V * D + self.num_hidden_layers * per_layer + D + head

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Build a ModelConfig from the dict of a Hugging Face ``config.json``."""
        if not isinstance(config, dict):
            raise ConfigError(f"config.json must hold a JSON object; got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if model_type == "gemma3":
            # The multimodal Gemma 3 config nests the language model under text_config.
            text_config = config.get("text_config") or {}
            if not isinstance(text_config, dict):
                raise ConfigError(f"config.json's text_config must be an object; got {text_config!r:.60}")
            return cls.from_hf(text_config | {"model_type": "gemma3_text"})
        try:
            return _ARCHITECTURE_READERS[model_type](_Keys(config))
        except ConfigError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as error:
            # a value of the wrong kind somewhere the readers take it as it comes (rope settings, say)
            raise ConfigError(f"config.json has a value of the wrong kind for a {model_type} model: {error}") from None


class _Keys:
    """config.json access that names the missing key in its error."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def require(self, key: str) -> Any:
        if self.config.get(key) is None:
            raise ConfigError(f"config.json has no {key!r} (model_type {self.config.get('model_type')!r})")
        return self.config[key]

    def size(self, key: str, default: int | None = None, high: int | None = None) -> int:
        """A positive integer (required unless ``default`` is given), refused by name otherwise."""
        value = self.require(key) if default is None else self.get(key, default)
        return check_size(value, key) if high is None else check_size(value, key, high)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value


def _eos_ids(keys: _Keys) -> tuple[int, ...]:
    eos = keys.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _common(keys: _Keys) -> dict[str, Any]:
    """The keys every architecture shares."""
    hidden_size = keys.size("hidden_size")
    num_heads = keys.size("num_attention_heads")
    return dict(
        model_type=keys.require("model_type"),
        vocab_size=keys.size("vocab_size"),
        hidden_size=hidden_size,
        intermediate_size=keys.size("intermediate_size"),
        num_hidden_layers=keys.size("num_hidden_layers", high=MAX_LAYERS),
        num_attention_heads=num_heads,
        num_key_value_heads=keys.size("num_key_value_heads", num_heads),
        head_dim=keys.size("head_dim", max(hidden_size // num_heads, 1)),
        max_position_embeddings=keys.size("max_position_embeddings", 2048),
        rms_norm_eps=check_number(keys.get("rms_norm_eps", 1e-6), "rms_norm_eps", positive=True),
        hidden_act=keys.get("hidden_act", keys.get("hidden_activation", "silu")),
        tie_word_embeddings=bool(keys.get("tie_word_embeddings", False)),
        bos_token_id=keys.get("bos_token_id"),
        eos_token_ids=_eos_ids(keys),
    )


def _single_rope(keys: _Keys, default_theta: float = 10_000.0) -> RopeParameters:
    """One RoPE setting for all layers, from either spelling."""
    params = dict(keys.get("rope_parameters") or keys.get("rope_scaling") or {})
    params.setdefault("rope_theta", keys.get("rope_theta", default_theta))
    if keys.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", keys.get("partial_rotary_factor"))
    if keys.get("original_max_position_embeddings") is not None and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = keys.get("original_max_position_embeddings")
    return RopeParameters.from_dict(params, default_theta, int(keys.get("max_position_embeddings", 2048)))


def _window_layer_types(keys: _Keys, window: int | None, first_window_layer: int) -> tuple[str, ...]:
    if keys.get("layer_types") is not None:
        return tuple(keys.get("layer_types"))
    n = keys.size("num_hidden_layers", high=MAX_LAYERS)
    return tuple(
        SLIDING_ATTENTION if window is not None and i >= first_window_layer else FULL_ATTENTION for i in range(n)
    )


def _rope_for_types(layer_types: tuple[str, ...], rope: RopeParameters) -> dict[str, RopeParameters]:
    return {layer_type: rope for layer_type in set(layer_types)}


def _llama(keys: _Keys) -> ModelConfig:
    common = _common(keys)
    bias = bool(keys.get("attention_bias", False))
    return ModelConfig(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bool(keys.get("mlp_bias", False)),
        rope={FULL_ATTENTION: _single_rope(keys)},
    )


def _mistral(keys: _Keys) -> ModelConfig:
    window = keys.get("sliding_window")
    layer_types = _window_layer_types(keys, window, 0)
    return ModelConfig(
        **_common(keys),
        sliding_window=window,
        layer_types=layer_types,
        rope=_rope_for_types(layer_types, _single_rope(keys)),
    )


def _qwen(keys: _Keys) -> ModelConfig:
    # use_sliding_window: false makes the sliding_window value inert.
    window = keys.get("sliding_window") if keys.get("use_sliding_window", False) else None
    layer_types = _window_layer_types(keys, window, int(keys.get("max_window_layers", 28)))
    is_qwen3 = keys.require("model_type") == "qwen3"
    qwen3_bias = bool(keys.get("attention_bias", False))
    return ModelConfig(
        **_common(keys),
        qkv_bias=qwen3_bias if is_qwen3 else True,
        o_proj_bias=qwen3_bias if is_qwen3 else False,
        qk_norm=is_qwen3,
        sliding_window=window if SLIDING_ATTENTION in layer_types else None,
        layer_types=layer_types,
        rope=_rope_for_types(layer_types, _single_rope(keys)),
    )


def _phi3(keys: _Keys) -> ModelConfig:
    window = keys.get("sliding_window")
    layer_types = _window_layer_types(keys, window, 0)
    return ModelConfig(
        **_common(keys),
        fused_qkv=True,
        fused_gate_up=True,
        sliding_window=window,
        layer_types=layer_types,
        rope=_rope_for_types(layer_types, _single_rope(keys)),
    )


GEMMA3_GLOBAL_ROPE_THETA = 1_000_000.0
GEMMA3_LOCAL_ROPE_THETA = 10_000.0
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every sixth layer is global


def _gemma3(keys: _Keys) -> ModelConfig:
    common = _common(keys)
    common["hidden_act"] = keys.get("hidden_activation", keys.get("hidden_act", "gelu_pytorch_tanh"))
    common["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings", True))
    n = common["num_hidden_layers"]
    if keys.get("layer_types") is not None:
        layer_types = tuple(keys.get("layer_types"))
    else:
        pattern = keys.size("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
        layer_types = tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(n))
    max_pos = common["max_position_embeddings"]
    parameters = keys.get("rope_parameters")
    if parameters is not None and FULL_ATTENTION in parameters:
        # transformers 5: one dict per layer type.
        full = dict(parameters.get(FULL_ATTENTION) or {})
        local = dict(parameters.get(SLIDING_ATTENTION) or {})
    else:
        # Long-standing keys: rope_scaling applies to the global layers only.
        full = dict(keys.get("rope_scaling") or {})
        full.setdefault("rope_theta", keys.get("rope_theta", GEMMA3_GLOBAL_ROPE_THETA))
        local = {"rope_theta": keys.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA)}
    rope = {
        FULL_ATTENTION: RopeParameters.from_dict(full, GEMMA3_GLOBAL_ROPE_THETA, max_pos),
        SLIDING_ATTENTION: RopeParameters.from_dict(local, GEMMA3_LOCAL_ROPE_THETA, max_pos),
    }
    bias = bool(keys.get("attention_bias", False))
    return ModelConfig(
        **common,
        qkv_bias=bias,
        o_proj_bias=bias,
        qk_norm=True,
        norm_weight_offset=1.0,
        embedding_scale=math.sqrt(common["hidden_size"]),
        sandwich_norms=True,
        attention_scale=float(keys.get("query_pre_attn_scalar", 256)) ** -0.5,
        # Gemma 3 replaced Gemma 2's attention soft-capping with q/k norm; transformers'
        # Gemma 3 ignores attn_logit_softcapping, and so does refllm.
        attn_logit_softcapping=None,
        final_logit_softcapping=keys.get("final_logit_softcapping"),
        sliding_window=keys.get("sliding_window", 4096),
        layer_types=layer_types,
        rope=rope,
    )


_ARCHITECTURE_READERS = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen,
    "qwen3": _qwen,
    "phi3": _phi3,
    "gemma3_text": _gemma3,
}
