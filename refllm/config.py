"""ModelConfig: what a model is, in typed parts, each the setting of one kind of block.

    sizes       vocabulary, hidden size, layers, context, tied embeddings, special tokens
    norms       where the norms sit and which they are                    (refllm/recipe.py)
    attention   grouped-query or latent attention, with its options       (refllm/recipe.py)
    mlp         the dense MLP                                              (refllm/recipe.py)
    experts     the sparse layers' mixture of experts, or None            (refllm/moe_parameters.py)
    rope        RoPE per layer type, which layers slide or skip RoPE      (refllm/rope_parameters.py)
    multipliers the embedding scale, a residual scale, the logits' scale and soft-cap

Together the parts are a family's recipe; the forward pass builds its blocks from
them once, at load (``refllm/models/blocks.py``).

``ModelConfig.from_hf(config_json)`` reads a Hugging Face ``config.json`` through
the reader of its family (``refllm/families/``), in both spellings found in
the wild: the long-standing keys (``rope_theta``, ``rope_scaling``,
``rope_local_base_freq``, ``sliding_window_pattern``) and the transformers 5 keys
(``rope_parameters``, per layer type for Gemma 3, and ``layer_types``). Unknown
keys are ignored; a missing required key is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from refllm.config_checks import MAX_LAYERS, check_fields, check_layer_indices, check_layer_types, check_layers
from refllm.errors import ConfigError
from refllm.families import MODEL_TYPES, parameter_count
from refllm.families.keys import HFKeys
from refllm.moe_parameters import GroupedExperts, MoeParameters
from refllm.recipe import ACTIVATIONS, GatedMLP, GroupedQueryAttention, LatentAttention, Norms, QKNorm
from refllm.rope_parameters import FULL_ATTENTION, LAYER_TYPES, ROPE_TYPES, SLIDING_ATTENTION, RopeParameters

__all__ = [
    "ACTIVATIONS", "FULL_ATTENTION", "ROPE_TYPES", "SLIDING_ATTENTION", "SUPPORTED_MODEL_TYPES",
    "ConfigError", "ModelConfig", "RopeParameters", "UnsupportedArchitectureError",
]

SUPPORTED_MODEL_TYPES = tuple(MODEL_TYPES)  # config.json's model_type (GGUF architectures: refllm/io/gguf.py)


class UnsupportedArchitectureError(ConfigError):
    """A ``model_type`` refllm does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model.

    Dimension letters used across refllm: ``D`` hidden size, ``H`` query heads,
    ``K`` KV heads, ``E`` head dim, ``F`` MLP size, ``V`` vocabulary, ``L`` layers.
    """

    model_type: str
    vocab_size: int  # V
    hidden_size: int  # D
    num_hidden_layers: int  # L
    max_position_embeddings: int
    attention: GroupedQueryAttention | LatentAttention
    mlp: GatedMLP  # the dense layers' MLP
    norms: Norms = Norms()
    experts: MoeParameters | GroupedExperts | None = None  # the sparse layers'; None when every MLP is dense
    layer_types: tuple[str, ...] = ()  # full_attention or sliding_attention, per layer
    rope: dict[str, RopeParameters] = field(default_factory=dict)  # keyed by layer type
    sliding_window: int | None = None  # the window of the sliding_attention layers
    nope_layers: tuple[int, ...] = ()  # SmolLM3: layers whose queries and keys skip RoPE
    embedding_scale: float = 1.0  # Gemma: sqrt(D); Granite: embedding_multiplier
    residual_scale: float | None = None  # Granite: each sublayer's output times residual_multiplier
    logit_scale: float | None = None  # Cohere: logit_scale; Granite: 1 / logits_scaling
    final_logit_softcapping: float | None = None  # Gemma: logits soft-capped
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Layers a checkpoint holds past the last that plain decoding never runs (DeepSeek-V3's
    # multi-token-prediction module, num_nextn_predict_layers): their tensors are skipped.
    unused_layers: int = 0

    def __post_init__(self) -> None:
        check_fields(self)  # before anything is built per layer
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)
        check_layers(self, LAYER_TYPES)
        if isinstance(self.experts, MoeParameters):
            check_layer_indices(self.experts.mlp_only_layers, "mlp_only_layers", self.num_hidden_layers)
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

    def uses_rope(self, layer: int) -> bool:
        """False for a NoPE layer, whose attention sees no positions but the causal mask's."""
        return layer not in self.nope_layers

    def rope_for_layer(self, layer: int) -> RopeParameters:
        return self.rope[self.layer_types[layer]]

    def with_overrides(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts."""
        return self.experts is not None and self.experts.is_sparse(layer)

    def describe(self) -> list[str]:
        """The recipe in words, a part per line: norms, attention, MLP, experts, RoPE, multipliers."""
        a, m, n = self.attention, self.mlp, self.norms
        offset = ", (1 + w) weights" if n.weight_offset else ""
        lines = [f"norms: {n.placement.value} {n.kind.value}, eps {n.eps:g}{offset}"]
        if isinstance(a, LatentAttention):
            query = "full-rank queries" if a.q_lora_rank is None else f"query rank {a.q_lora_rank}"
            lines.append(
                f"attention: latent, {a.num_heads} heads, KV rank {a.kv_lora_rank}, {query}, key dims"
                f" {a.qk_nope_head_dim} + {a.qk_rope_head_dim} RoPE, value dims {a.v_head_dim}, scale {a.scale:.4g}"
                + (", biases" if a.bias else "")
            )
        else:
            options = [f"q/k norm {a.qk_norm.value}"] if a.qk_norm is not QKNorm.NONE else []
            options += ["q/k/v bias"] * a.bias + ["output bias"] * a.output_bias + ["sinks"] * a.sinks
            options += [f"soft-cap {a.softcap:g}"] if a.softcap else []
            lines.append(
                f"attention: grouped-query, {a.num_heads} query / {a.num_kv_heads} KV heads of {a.head_dim},"
                f" scale {a.scale:.4g}" + "".join(f", {option}" for option in options)
            )
        lines.append(f"MLP: gated {m.activation}, {m.intermediate_size} wide" + (", biases" if m.bias else ""))
        for layer_type, rope in sorted(self.rope.items()):
            scaling = "" if rope.rope_type == "default" else f" ({rope.rope_type} x{rope.factor:g})"
            partial = "" if rope.partial_rotary_factor == 1 else f", rotary {rope.partial_rotary_factor:g}"
            label = f" ({layer_type} layers)" if len(self.rope) > 1 else ""
            lines.append(f"RoPE{label}: theta {rope.theta:g}{scaling}{partial}")
        if self.sliding_window is not None and SLIDING_ATTENTION in self.layer_types:
            pattern = "".join("S" if t == SLIDING_ATTENTION else "F" for t in self.layer_types)
            lines.append(f"sliding window: {self.sliding_window} (layers {pattern})")
        if self.nope_layers:
            lines.append(f"no RoPE on layers {', '.join(map(str, self.nope_layers))}")
        scales = [("embeddings", self.embedding_scale if self.embedding_scale != 1 else None),
                  ("each sublayer's output", self.residual_scale), ("logits", self.logit_scale)]  # fmt: skip
        lines += [f"scale: {what} x {value:.4g}" for what, value in scales if value is not None]
        if self.final_logit_softcapping:
            lines.append(f"logits soft-capped at {self.final_logit_softcapping:g}")
        return lines + (["tied embeddings"] if self.tie_word_embeddings else [])

    @property
    def num_parameters(self) -> int:
        """Every weight, all experts included: the sizes of the tensors a checkpoint holds."""
        return parameter_count(self, active=False)

    @property
    def active_parameters(self) -> int:
        """The weights one token's forward pass reads: of each sparse layer, only its k chosen experts
        (DeepSeek-V3's shared experts, which every token runs, included)."""
        return parameter_count(self, active=True)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Build a ModelConfig from the dict of a Hugging Face ``config.json``."""
        if not isinstance(config, dict):
            raise ConfigError(f"config.json must hold a JSON object; got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitectureError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        try:
            keys = HFKeys(config)
            if keys.items("layer_types") is not None:  # even where the family derives its own
                layers = keys.size("num_hidden_layers", high=MAX_LAYERS)
                check_layer_types(keys.items("layer_types"), LAYER_TYPES, layers)
            return cls(**MODEL_TYPES[model_type].read(keys))
        except ConfigError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as error:
            # a value of the wrong kind somewhere the readers take it as it comes (rope settings, say)
            raise ConfigError(f"config.json has a value of the wrong kind for a {model_type} model: {error}") from None
