"""LlamaFamilyModel: one forward pass for Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3, SmolLM3, OLMo 2,
the mixtures of experts (Mixtral, Qwen3-MoE, gpt-oss) and DeepSeek-V3.

The architectures differ only by flags in ``ModelConfig``; ``_forward`` follows
one token's path and each step is a call into the model's op set
(``refllm/models/ops.py``): the functions of ``refllm/nn`` themselves (``spec``)
or their Numba twins (``fast``). Attention runs behind the cache, with the op
set's attention or, for ``fast``, the cache's own kernels.

    ids -> embed -> for each layer:
                        (norm) -> q, k, v projections -> (q/k norm) -> (RoPE)
                        -> write K/V into the cache -> attention over the cache (soft-capped scores)
                        -> output projection -> (post-attention norm) -> residual
                        -> norm -> MLP (or mixture of experts) -> (post-MLP norm) -> residual
        -> final norm -> LM head -> (soft-cap) -> logits

DeepSeek-V3 swaps two blocks (``refllm/models/deepseek.py``): latent attention for
the q/k/v attention, and in its sparse layers routed experts for the MLP.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import ContextLengthError, InvalidInputError, PositionError, TokenOutOfRangeError
from refllm.kv import CacheConfig, CacheShape, KVCache, create_cache
from refllm.models.contract import ModelMetadata, ModelSource
from refllm.models.deepseek import grouped_experts_mlp, latent_self_attention
from refllm.models.moe_layer import mixture_of_experts
from refllm.kv.base import OWN_ATTENTION
from refllm.models.ops import SPEC_OPS, OpSet, fast_ops
from refllm.models.weights import LayerWeights, ModelWeights, assemble, weight_leaves
from refllm.nn.attention import attention as spec_attention
from refllm.nn.logits import output_logits
from refllm.nn.mlp import MLPWeights, gated_mlp
from refllm.nn.moe_grouped import grouped_topk_routing
from refllm.nn.residual import residual_block

DTYPES = ("float32", "float64")


class ModelDtypeError(InvalidInputError):
    """A dtype, or a dtype and op set together, that a model cannot run in."""


class LlamaFamilyModel:
    """A decoder-only transformer whose weights and flags come from a ``ModelSource``."""

    supports_decode_all_logits = True
    supports_hidden_states = True
    # DeepSeek-V3's router, (router_logits [T, X], correction_bias [X], ...) -> (expert_ids, expert_weights)
    route_experts = staticmethod(grouped_topk_routing)

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        tokenizer: Any = None,
        dtype: str = "float32",
        reference: bool | None = None,
    ):
        """dtype: "float32", or "float64" (ground truth: every step in float64; ``weights`` must be float64).
        reference: run the spec ops (``refllm/nn`` alone) instead of their kernel twins; the default is
        False for float32 and True for float64, whose only op set is the spec's."""
        self.config = config
        self.weights = weights
        self.tokenizer = tokenizer
        self.dtype = _check_dtype(dtype, weights)
        reference = self.dtype == np.float64 if reference is None else reference
        self.ops: OpSet = _spec_ops_for(weights) if reference else _fast_ops_for(self.dtype)
        self.rope_angles = {
            layer_type: self.ops.rope_angles(params, config.head_dim, config.max_position_embeddings, self.dtype)
            for layer_type, params in config.rope.items()
        }

    @classmethod
    def load(cls, source: ModelSource, dtype: str = "float32", reference: bool | None = None) -> LlamaFamilyModel:
        """Build the model from a ModelSource (``refllm.load_model`` opens one from a path or a catalog name)."""
        weights = assemble(source.config, source, np.dtype(dtype_name(dtype)))
        return cls(source.config, weights, source.tokenizer, dtype, reference)

    @property
    def metadata(self) -> ModelMetadata:
        c = self.config
        return ModelMetadata(
            architecture=c.model_type,
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            num_layers=c.num_hidden_layers,
            context_length=c.context_length,
            num_parameters=c.num_parameters,
            bos_token_id=c.bos_token_id,
            eos_token_ids=tuple(self.tokenizer.eos_token_ids) if self.tokenizer is not None else c.eos_token_ids,
            dtype=self.dtype.name,
        )

    @property
    def cache_shape(self) -> CacheShape:
        return cache_shape_for(self.config, self.dtype.name)

    def create_kv_cache(self, config: CacheConfig | None = None) -> KVCache:
        return create_cache(self.cache_shape, config or CacheConfig(), self.config.context_length)

    # ---- the public contract: validate, then run -------------------------------------------

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """tokens: [B, T] int -> [B, T, D]."""
        tokens = self._check_tokens(tokens)
        return self.ops.embed(tokens, self.weights.embed_tokens, self.config.embedding_scale)

    def embed_multimodal(self, tokens: np.ndarray, images: list[Any] | None) -> np.ndarray:
        if images:
            raise InvalidInputError(f"{self.config.model_type} is a text-only model; got {len(images)} image(s)")
        return self.embed(tokens)

    def prefill(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        """-> logits of the last position, [B, V]."""
        hidden = self._forward_positions(x, cache, pos)
        return self.logits(hidden[:, -1])

    def decode(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """x: one position per sequence, [B, 1] ids or [B, 1, D] -> [B, V]."""
        x = self._check_x(x)
        if x.shape[1] != 1:
            raise InvalidInputError(f"decode takes one position per sequence; x has {x.shape[1]}")
        return self.prefill(x, cache, self._next_positions(cache, x))

    def prefill_all_logits(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        """-> [B, T, V]."""
        return self.logits(self._forward_positions(x, cache, pos))

    def decode_all_logits(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """x: n new positions per sequence -> [B, n, V]."""
        x = self._check_x(x)
        return self.prefill_all_logits(x, cache, self._next_positions(cache, x))

    def prefill_hidden(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        """-> final hidden states, [B, T, D]."""
        return self._forward_positions(x, cache, pos)

    def forward_step(self, x: np.ndarray, cache: KVCache, seq_ids: Sequence[int]) -> np.ndarray:
        """The ragged step: x [B, T, D] embeddings, row b continuing sequence seq_ids[b] of ``cache`` at
        its own length (a new id starts empty) -> final hidden states [B, T, D]."""
        x = self._check_x(x)
        if np.issubdtype(x.dtype, np.integer):
            raise InvalidInputError("forward_step takes embeddings [B, T, D]; embed the token ids first")
        seq_ids = list(seq_ids)
        if len(seq_ids) != x.shape[0] or len(set(seq_ids)) != len(seq_ids):
            raise InvalidInputError(f"forward_step needs one distinct sequence id per row of x; got {seq_ids}")
        for seq_id in seq_ids:
            end = (cache.length(seq_id) if seq_id in cache else 0) + x.shape[1]
            if end > self.config.context_length:
                raise ContextLengthError(
                    f"sequence {seq_id} would reach {end} positions,"
                    f" past the context length {self.config.context_length}"
                )
        return self._forward(x, cache, seq_ids)

    def _forward_positions(self, x: np.ndarray, cache: KVCache, pos: range) -> np.ndarray:
        """The contract's positional form: rows 0 .. B-1 of the cache at positions ``pos`` -> hidden [B, T, D]."""
        x = self._check_x(x)
        seq_ids = list(range(x.shape[0]))
        self._check_positions(cache, seq_ids, x.shape[1], pos)
        if np.issubdtype(x.dtype, np.integer):
            x = self.ops.embed(x, self.weights.embed_tokens, self.config.embedding_scale)
        return self._forward(x, cache, seq_ids)

    # ---- the forward pass: no checks below this line -----------------------------------------

    def _forward(self, x: np.ndarray, cache: KVCache, seq_ids: list[int]) -> np.ndarray:
        """x: [B, T, D] embeddings of row b at positions cache.length(b) .. + T -> final hidden [B, T, D]."""
        num_new = x.shape[1]
        starts = np.array([cache.length(s) if s in cache else 0 for s in seq_ids])
        positions = starts[:, None] + np.arange(num_new)  # [B, T]
        cache.reserve(seq_ids, num_new)
        with self.ops.running():
            for layer_index, layer_weights in enumerate(self.weights.layers):
                x = self.decoder_layer(layer_index, layer_weights, x, positions, cache, seq_ids)
            cache.commit(seq_ids, num_new)
            return self._norm(x, self.weights.norm)

    def decoder_layer(
        self, layer_index: int, w: LayerWeights, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list
    ) -> np.ndarray:
        """x: [B, T, D] -> [B, T, D]: attention, then the MLP, each a residual block whose norms sit
        before (Llama), around (Gemma's sandwich) or after (OLMo 2) it (``refllm/nn/residual.py``)."""
        c = self.config

        def norm(weight: np.ndarray | None):
            return None if weight is None else (lambda h: self._norm(h, weight))

        def attend(h: np.ndarray) -> np.ndarray:
            return self.self_attention(layer_index, w, h, positions, cache, seq_ids)

        # Llama's post_attention_layernorm is its pre-MLP norm; Gemma and OLMo 2 apply it to attention's output.
        norm_after_attention = w.post_attention_layernorm if c.sandwich_norms or c.post_norms else None
        x = residual_block(x, attend, norm(w.input_layernorm), norm(norm_after_attention))
        if c.post_norms:
            norm_before_mlp = None
        else:  # Gemma names its pre-MLP norm pre_feedforward_layernorm
            norm_before_mlp = w.pre_feedforward_layernorm if c.sandwich_norms else w.post_attention_layernorm
        return residual_block(x, lambda h: self.mlp(w, h), norm(norm_before_mlp), norm(w.post_feedforward_layernorm))

    def mlp(self, w: LayerWeights, h: np.ndarray) -> np.ndarray:
        """h: [B, T, D] (normed) -> [B, T, D]: the gated MLP, or a sparse layer's mixture of experts."""
        if w.experts is not None and self.config.grouped_experts is not None:
            return grouped_experts_mlp(self, w, h)  # DeepSeek-V3: its own router, plus shared experts
        if w.experts is not None:
            return mixture_of_experts(h, w, self.config, self.ops)
        mlp = MLPWeights(w.gate_proj, w.up_proj, w.down_proj, w.gate_proj_bias, w.up_proj_bias, w.down_proj_bias)
        gate = functools.partial(self.ops.gated, activation=self.config.hidden_act)
        return gated_mlp(h, mlp, gate, self.ops.linear)

    def self_attention(
        self, layer_index: int, w: LayerWeights, x: np.ndarray, positions: np.ndarray, cache: KVCache, seq_ids: list
    ) -> np.ndarray:
        """x: [B, T, D] (normed, unless post-norms) -> attention output projected back to [B, T, D]."""
        c, ops = self.config, self.ops
        if w.latent is not None:
            return latent_self_attention(self, layer_index, w.latent, x, positions, cache, seq_ids)
        B, T, _ = x.shape
        q = ops.linear(x, w.q_proj, w.q_proj_bias)  # [B, T, H*E]
        k = ops.linear(x, w.k_proj, w.k_proj_bias)  # [B, T, K*E]
        if c.qk_norm_whole:  # OLMo 2: one norm over every head's dims at once
            q, k = self._norm(q, w.q_norm), self._norm(k, w.k_norm)
        q = q.reshape(B, T, c.num_attention_heads, c.head_dim)
        k = k.reshape(B, T, c.num_key_value_heads, c.head_dim)
        v = ops.linear(x, w.v_proj, w.v_proj_bias).reshape(B, T, c.num_key_value_heads, c.head_dim)
        if c.qk_norm and not c.qk_norm_whole:  # Qwen3, Gemma 3: each head on its own
            q, k = self._norm(q, w.q_norm), self._norm(k, w.k_norm)
        if c.uses_rope(layer_index):  # a NoPE layer (SmolLM3) leaves positions to the causal mask
            cos, sin = self.rope_angles[c.layer_types[layer_index]](positions)
            q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        cache.write(layer_index, seq_ids, k, v)
        window = c.window_for_layer(layer_index)
        attend = ops.attention
        if w.sinks is not None:  # the caches' own kernels have no sinks: the spec attention over the gathered keys
            attend = functools.partial(spec_attention if attend is OWN_ATTENTION else attend, sinks=w.sinks)
        out = cache.attention(
            layer_index, seq_ids, q, c.attention_scale, window, c.attn_logit_softcapping, attend
        )  # [B, T, H, E]
        return ops.linear(out.reshape(B, T, -1), w.o_proj, w.o_proj_bias)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """hidden: [..., D] (after the final norm) -> [..., V]."""
        with self.ops.running():
            return output_logits(
                hidden, self.weights.lm_head, softcap=self.config.final_logit_softcapping, linear=self.ops.linear
            )

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return self.ops.rms_norm(x, weight, self.config.rms_norm_eps, self.config.norm_weight_offset)

    # ---- validation -----------------------------------------------------------------------------

    def _check_tokens(self, tokens: Any) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise InvalidInputError(
                f"tokens must be an integer array [batch, seq]; got {tokens.dtype} of shape {tokens.shape}"
            )
        bad = (tokens < 0) | (tokens >= self.config.vocab_size)
        if bad.any():
            raise TokenOutOfRangeError(
                f"token id {tokens[bad][0]} is outside the vocabulary [0, {self.config.vocab_size})"
            )
        return tokens

    def _check_x(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        D = self.config.hidden_size
        if x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
            x = self._check_tokens(x)
        elif not (x.ndim == 3 and x.dtype == self.dtype and x.shape[2] == D):
            raise InvalidInputError(
                f"x must be token ids [batch, seq] of an integer dtype or embeddings [batch, seq, {D}]"
                f" {self.dtype.name}; got {x.dtype} of shape {x.shape}"
            )
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise InvalidInputError(f"x must hold at least one position of one sequence; got shape {x.shape}")
        return x

    def _next_positions(self, cache: KVCache, x: np.ndarray) -> range:
        start = cache.length(0) if 0 in cache else 0
        return range(start, start + x.shape[1])

    def _check_positions(self, cache: KVCache, seq_ids: list[int], num_new: int, pos: range) -> None:
        if not isinstance(pos, range) or pos.step != 1:
            raise PositionError(f"pos must be a range with step 1; got {pos!r}")
        if len(pos) != num_new:
            raise PositionError(f"pos {pos} covers {len(pos)} positions but x has {num_new}")
        live = sorted(cache.sequence_ids())
        if live and live != seq_ids:
            raise InvalidInputError(
                f"the cache holds sequences {live}; a batch of {len(seq_ids)} uses ids {seq_ids}"
            )
        for seq_id in seq_ids:
            length = cache.length(seq_id) if live else 0
            if pos.start != length:
                raise PositionError(f"pos starts at {pos.start} but the cache holds {length} positions")
        if pos.stop > self.config.context_length:
            raise ContextLengthError(f"position {pos.stop - 1} is past the context length {self.config.context_length}")


def cache_shape_for(config: ModelConfig, dtype: str = "float32") -> CacheShape:
    """What a KV cache stores per token for ``config``: K keys and values of E per layer, or for latent
    attention one latent of C + P per layer (a single key "head", no values)."""
    c = config
    if c.latent_attention is not None:
        return CacheShape(c.num_hidden_layers, 1, c.latent_attention.cache_width, dtype, value_dim=0)
    return CacheShape(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, dtype)


def dtype_name(dtype: Any) -> str:
    """"float32" or "float64" from any spelling NumPy reads ("float64", np.float64, np.dtype("f8"))."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ModelDtypeError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return name


def _check_dtype(dtype: Any, weights: ModelWeights) -> np.dtype:
    """The model's dtype, refusing weights held in another float type."""
    model_dtype = np.dtype(dtype_name(dtype))
    for name in ("embed_tokens", "norm"):
        array = getattr(weights, name)
        if isinstance(array, np.ndarray) and array.dtype != model_dtype:
            raise ModelDtypeError(
                f"a {model_dtype.name} model needs {model_dtype.name} weights; {name} is {array.dtype}"
            )
    return model_dtype


def _spec_ops_for(weights: ModelWeights) -> OpSet:
    if any(not isinstance(a, np.ndarray) for a in weight_leaves(weights)):
        raise ModelDtypeError("the spec ops read dequantized weights; load the model without quantized=True")
    return SPEC_OPS


def _fast_ops_for(dtype: np.dtype) -> OpSet:
    if dtype != np.float32:
        raise ModelDtypeError(
            f"the fast kernels compute in float32; a {dtype.name} model runs the spec ops (reference=True)"
        )
    return fast_ops()
