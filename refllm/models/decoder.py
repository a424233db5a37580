"""DecoderModel: the forward pass of every family, composed of the blocks its recipe names.

A family (``refllm/families/``) is a config reader, a tensor table and a recipe:
the typed parts of its ``ModelConfig`` (``refllm/recipe.py``). At load the model
turns the recipe into block objects (``refllm/models/blocks.py``) through its op
set (``refllm/models/ops.py``): the functions of ``refllm/nn`` themselves
(``spec``) or their twins (``fast``). ``_forward`` is then one token's path, the
same for every family:

    ids -> embed -> for each layer: layer(x)      norms, attention over the cache, MLP or experts, residuals
        -> final norm -> LM head -> logits

and each layer is the path its recipe names (``DecoderLayer``, ``ParallelDecoderLayer``):

    x = x + norm_after(attention(norm_before(x)))     q, k, v -> (q/k norm) -> (RoPE) -> cache -> attention -> o
    x = x + norm_after(mlp(norm_before(x)))           the gated MLP, or the mixture of experts
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import ContextLengthError, InvalidInputError, PositionError, TokenOutOfRangeError
from refllm.kv import CacheConfig, CacheShape, KVCache, create_cache
from refllm.models.attention import Spans
from refllm.models.blocks import Norm, build_layers, norm_function
from refllm.models.contract import ModelMetadata, ModelSource
from refllm.models.ops import SPEC_OPS, OpSet, fast_ops
from refllm.models.weights import ModelWeights, assemble, weight_leaves
from refllm.nn.logits import output_logits
from refllm.recipe import LatentAttention

DTYPES = ("float32", "float64")


class ModelDtypeError(InvalidInputError):
    """A dtype, or a dtype and op set together, that a model cannot run in."""


class DecoderModel:
    """A decoder-only transformer whose weights and recipe come from a ``ModelSource``."""

    supports_decode_all_logits = True
    supports_hidden_states = True

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        tokenizer: Any = None,
        dtype: str = "float32",
        reference: bool | None = None,
        ops: OpSet | None = None,
    ):
        """dtype: "float32", or "float64" (ground truth: every step in float64; ``weights`` must be float64).
        reference: run the spec ops (``refllm/nn`` alone) instead of their kernel twins; the default is
        False for float32 and True for float64, whose only op set is the spec's.
        ops: an op set of one's own instead (a test's, with one operation changed)."""
        self.config = config
        self.tokenizer = tokenizer
        self.dtype = _check_dtype(dtype, weights)
        if ops is None:
            reference = self.dtype == np.float64 if reference is None else reference
            ops = _spec_ops_for(weights) if reference else _fast_ops_for(self.dtype)
        self._build(ops, weights)

    def _build(self, ops: OpSet, weights: ModelWeights) -> None:
        """The blocks of the recipe, over ``weights`` through ``ops``: every choice made here, once."""
        config = self.config
        self.ops: OpSet = ops
        self.weights = weights
        self.layers = build_layers(config, weights, ops, self.dtype)
        self.final_norm = Norm(weights.norm, norm_function(config, ops))
        self.lm_head = functools.partial(
            output_logits,
            lm_head=weights.lm_head,
            scale=config.logit_scale,
            softcap=config.final_logit_softcapping,
            linear=ops.linear,
        )

    def with_ops(self, ops: OpSet, weights: ModelWeights | None = None) -> DecoderModel:
        """The same model on another op set (a recording one, the spec's), and optionally other weights of the
        same shapes (dequantized copies): its blocks built anew; this model is left as it is."""
        twin = copy.copy(self)  # the config, tokenizer and dtype shared
        twin._build(ops, self.weights if weights is None else weights)
        return twin

    @classmethod
    def load(
        cls, source: ModelSource, dtype: str = "float32", reference: bool | None = None, ops: OpSet | None = None
    ) -> DecoderModel:
        """Build the model from a ModelSource (``refllm.load_model`` opens one from a path or a catalog name)."""
        weights = assemble(source.config, source, np.dtype(dtype_name(dtype)))
        return cls(source.config, weights, source.tokenizer, dtype, reference, ops)

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

    def prefill(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        """-> logits of the last position, [B, V]. image_spans: per row, runs of image tokens that see each
        other (a vision-language model's; ``KVCache.attention``)."""
        hidden = self._forward_positions(x, cache, pos, image_spans)
        return self.logits(hidden[:, -1])

    def decode(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """x: one position per sequence, [B, 1] ids or [B, 1, D] -> [B, V]."""
        x = self._check_x(x)
        if x.shape[1] != 1:
            raise InvalidInputError(f"decode takes one position per sequence; x has {x.shape[1]}")
        return self.prefill(x, cache, self._next_positions(cache, x))

    def prefill_all_logits(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        """-> [B, T, V]."""
        return self.logits(self._forward_positions(x, cache, pos, image_spans))

    def decode_all_logits(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """x: n new positions per sequence -> [B, n, V]."""
        x = self._check_x(x)
        return self.prefill_all_logits(x, cache, self._next_positions(cache, x))

    def prefill_hidden(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        """-> final hidden states, [B, T, D]."""
        return self._forward_positions(x, cache, pos, image_spans)

    def forward_step(
        self, x: np.ndarray, cache: KVCache, seq_ids: Sequence[int], image_spans: Spans = None
    ) -> np.ndarray:
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
        return self._forward(x, cache, seq_ids, image_spans)

    def _forward_positions(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        """The contract's positional form: rows 0 .. B-1 of the cache at positions ``pos`` -> hidden [B, T, D]."""
        x = self._check_x(x)
        seq_ids = list(range(x.shape[0]))
        self._check_positions(cache, seq_ids, x.shape[1], pos)
        if np.issubdtype(x.dtype, np.integer):
            x = self.ops.embed(x, self.weights.embed_tokens, self.config.embedding_scale)
        return self._forward(x, cache, seq_ids, image_spans)

    # ---- the forward pass: no checks below this line -----------------------------------------

    def _forward(self, x: np.ndarray, cache: KVCache, seq_ids: list[int], image_spans: Spans = None) -> np.ndarray:
        """x: [B, T, D] embeddings of row b at positions cache.length(b) .. + T -> final hidden [B, T, D]."""
        num_new = x.shape[1]
        positions = self._positions(cache, seq_ids, num_new)
        cache.reserve(seq_ids, num_new)
        with self.ops.running():
            for layer in self.layers:
                x = layer(x, positions, cache, seq_ids, image_spans)
            cache.commit(seq_ids, num_new)
            return self.final_norm(x)

    def _positions(self, cache: KVCache, seq_ids: list[int], num_new: int) -> np.ndarray:
        """[B, T]: the positions of row b's new tokens, from the length its sequence has in ``cache``."""
        starts = np.array([cache.length(s) if s in cache else 0 for s in seq_ids])
        return starts[:, None] + np.arange(num_new)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """hidden: [..., D] (after the final norm) -> [..., V]."""
        with self.ops.running():
            return self.lm_head(hidden)

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
    a = config.attention
    if isinstance(a, LatentAttention):
        return CacheShape(config.num_hidden_layers, 1, a.cache_width, dtype, value_dim=0)
    return CacheShape(config.num_hidden_layers, a.num_kv_heads, a.head_dim, dtype)


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
