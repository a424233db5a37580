"""Reading a Hugging Face ``config.json``: key access that names what is missing, and the keys families share.

Each family's reader (a module beside this one) turns the dict into the keyword
arguments of ``ModelConfig``; the shared parts live here: the model-wide keys
(``common_fields``) and the usual reading of the recipe's parts.
"""

from __future__ import annotations

from typing import Any

from refllm.config_checks import MAX_LAYERS, check_flags, check_number, check_size
from refllm.errors import ConfigError
from refllm.recipe import GatedMLP, GroupedQueryAttention, NormKind, NormPlacement, Norms
from refllm.rope_parameters import FULL_ATTENTION, LAYER_TYPES, SLIDING_ATTENTION, RopeParameters


class HFKeys:
    """config.json access that names the missing key in its error."""

    def __init__(self, config: dict[str, Any]):
        check_flags(config)  # on arrival: the readers take them with bool()
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

    def items(self, key: str) -> tuple[Any, ...] | None:
        """A JSON list as a tuple, None when absent or null; anything else refused by name."""
        value = self.config.get(key)
        if value is not None and not isinstance(value, list):
            raise ConfigError(f"{key} must be a list; got {value!r:.60}")
        return None if value is None else tuple(value)

    def mapping(self, key: str) -> dict[str, Any]:
        """A JSON object, {} when absent or null; anything else refused by name."""
        value = self.get(key, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be an object; got {value!r:.60}")
        return value


def eos_ids(keys: HFKeys) -> tuple[int, ...]:
    eos = keys.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)  # each checked as a token id by ModelConfig


def common_fields(keys: HFKeys) -> dict[str, Any]:
    """The model-wide keys every architecture shares: sizes, tied embeddings, special tokens."""
    return dict(
        model_type=keys.require("model_type"),
        vocab_size=keys.size("vocab_size"),
        hidden_size=keys.size("hidden_size"),
        num_hidden_layers=keys.size("num_hidden_layers", high=MAX_LAYERS),
        max_position_embeddings=keys.size("max_position_embeddings", 2048),
        tie_word_embeddings=bool(keys.get("tie_word_embeddings", False)),
        bos_token_id=keys.get("bos_token_id"),
        eos_token_ids=eos_ids(keys),
    )


def grouped_query_attention(keys: HFKeys, **options: Any) -> GroupedQueryAttention:
    """The heads from config.json (K defaults to H, E to D / H), with a family's ``options``."""
    num_heads = keys.size("num_attention_heads")
    return GroupedQueryAttention(
        num_heads=num_heads,
        num_kv_heads=keys.size("num_key_value_heads", num_heads),
        head_dim=keys.size("head_dim", max(keys.size("hidden_size") // num_heads, 1)),
        **options,
    )


def gated_mlp(keys: HFKeys, **options: Any) -> GatedMLP:
    """The dense MLP's size and activation (hidden_act, or Gemma's hidden_activation), with ``options``."""
    options.setdefault("activation", keys.get("hidden_act", keys.get("hidden_activation", "silu")))
    return GatedMLP(intermediate_size=keys.size("intermediate_size"), **options)


def rms_norms(
    keys: HFKeys, placement: NormPlacement = NormPlacement.PRE, default_eps: float = 1e-6, **options: Any
) -> Norms:
    """RMSNorms at ``placement``, their epsilon config.json's rms_norm_eps."""
    eps = check_number(keys.get("rms_norm_eps", default_eps), "rms_norm_eps", positive=True)
    return Norms(placement, NormKind.RMS, eps, **options)


def single_rope(keys: HFKeys, default_theta: float = 10_000.0) -> RopeParameters:
    """One RoPE setting for all layers, from either spelling."""
    params = dict(keys.mapping("rope_parameters") or keys.mapping("rope_scaling"))
    params.setdefault("rope_theta", keys.get("rope_theta", default_theta))
    if keys.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", keys.get("partial_rotary_factor"))
    if keys.get("original_max_position_embeddings") is not None and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = keys.get("original_max_position_embeddings")
    return RopeParameters.from_dict(params, default_theta, keys.size("max_position_embeddings", 2048))


def window_layer_types(keys: HFKeys, window: int | None, first_window_layer: int) -> tuple[str, ...]:
    if keys.items("layer_types") is not None:
        return keys.items("layer_types")
    n = keys.size("num_hidden_layers", high=MAX_LAYERS)
    return tuple(
        SLIDING_ATTENTION if window is not None and i >= first_window_layer else FULL_ATTENTION for i in range(n)
    )


def rope_for_types(layer_types: tuple[str, ...], rope: RopeParameters) -> dict[str, RopeParameters]:
    """``rope`` for each known layer type in ``layer_types`` (an unknown one is refused by ModelConfig)."""
    return {layer_type: rope for layer_type in LAYER_TYPES if layer_type in layer_types}


def expert_count_key(config: dict[str, Any]) -> str:
    """The key of ``config`` that gives its experts per sparse layer: ``n_routed_experts`` (DeepSeek-V3),
    ``num_local_experts`` (Mixtral, gpt-oss; transformers 5 for all) or ``num_experts`` (Qwen3-MoE)."""
    if config.get("model_type") == "deepseek_v3":
        return "n_routed_experts"
    return "num_local_experts" if config.get("num_local_experts") is not None else "num_experts"


def expert_count(keys: HFKeys) -> int:
    """Experts per sparse layer, refused by name unless a positive integer."""
    return keys.size(expert_count_key(keys.config))
