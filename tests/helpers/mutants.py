"""The mutation gallery: backends with one deliberate bug each, built from refllm's own model.

Each mutant is a factory ``checkpoint -> backend``, as the conformance kit
takes them, and each bug is a few lines: a subclass of ``DecoderModel``
with one setting, weight, operation or built block changed (its op set is a
constructor argument, its layers plain attributes), or a KV cache with one step
done wrong. The kit
must catch every one (``tests/testing/test_oracle_mutants.py``).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from refllm.kv import OWN_ATTENTION, CacheConfig
from refllm.kv.paged import PagedKVArena
from refllm.models.contract import InMemorySource
from refllm.models.attention import LatentAttentionBlock
from refllm.models.blocks import SparseMLP
from refllm.models.decoder import DecoderModel
from refllm.models.weights import AttentionWeights
from refllm.nn.attention import attention_mask, softmax
from refllm.nn.moe import softmax_then_topk, topk_then_softmax
from refllm.nn.moe_grouped import grouped_topk_routing, sigmoid
from refllm.nn.norm import rms_norm
from refllm.nn.rope import rotary_dims
from refllm.nn.softcap import soft_cap
from refllm.recipe import NormPlacement
from refllm.runtime.llm import LLM
from refllm.testing.backends import LLMBackend, ModelBackend
from refllm.testing.factories import BLOCK_SIZE


def _backend(model_class, checkpoint, kind: str = "contiguous") -> ModelBackend:
    model = model_class.load(checkpoint)
    return ModelBackend(model, CacheConfig(kind=kind, block_size=BLOCK_SIZE), model_class.__name__)


class _CacheProxy:
    """Delegates to a KV cache; subclasses override the step they get wrong."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __contains__(self, seq_id):
        return seq_id in self.inner

    def run_layer(self, layer, op_by_op, fused, x, positions, seq_ids, image_spans=None):
        """Every layer op by op, through this proxy's steps (a compiled layer would go round them)."""
        return op_by_op(x, positions, self, seq_ids, image_spans)


def op_by_op_layers(layers: list) -> list:
    """A model's layers as its blocks compute them one op at a time: a change to the weights or the blocks
    after load reaches no compiled layer (refllm/models/fused_layer.py), which took its arrays at load."""
    return [getattr(layer, "op_by_op", layer) for layer in layers]


# --- RoPE -------------------------------------------------------------------------------


class _OpChanged(DecoderModel):
    """A model whose op set has one operation replaced by ``wrong(ops)``'s."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)  # picks the op set the arguments ask for
        super().__init__(config, weights, tokenizer, self.dtype.name, ops=self.wrong(self.ops))

    def wrong(self, ops):
        raise NotImplementedError


class RopeBaseOff(_OpChanged):
    """RoPE frequencies from twice the configured base."""

    def wrong(self, ops):
        def doubled_base(params, *args):
            return ops.rope_angles(replace(params, theta=2 * params.theta), *args)

        return replace(ops, rope_angles=doubled_base)


class InterleavedRope(DecoderModel):
    """RoPE pairs dims (2i, 2i+1) instead of (i, i + R/2) on rotate-half weights.

    Rotating interleaved pairs equals rotating halves after permuting each
    head's rotary dims as [0, 2, 4, ..., 1, 3, 5, ...]; q.k is unchanged by a
    common permutation, so permuting the q/k projection rows is that bug.
    """

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        E = config.attention.rope_dim
        R = rotary_dims(config.rope_for_layer(0), E)
        within = np.concatenate([np.arange(0, R, 2), np.arange(1, R, 2), np.arange(R, E)])  # [E]
        for layer in weights.layers:
            w = layer.attention
            if not isinstance(w, AttentionWeights):  # latent attention rotates a part of its rows
                continue
            for name in ("q_proj", "k_proj", "q_proj_bias", "k_proj_bias", "q_norm", "k_norm"):
                rows = getattr(w, name)
                if rows is not None:  # every head's rows [E, ...] reordered the same way
                    setattr(w, name, rows[(np.arange(len(rows) // E)[:, None] * E + within).ravel()])
        self.layers = op_by_op_layers(self.layers)


class ChunkPositionOffByOne(DecoderModel):
    """A prompt chunk after the first is rotated one position too far."""

    def _positions(self, cache, seq_ids, num_new):
        positions = super()._positions(cache, seq_ids, num_new)
        return positions + 1 if num_new > 1 and positions[0, 0] > 0 else positions


# --- attention ----------------------------------------------------------------------------


class _WrongGroups(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION, image_spans=None):
        heads, kv_heads = q.shape[2], self.inner.shape.num_kv_heads
        order = np.argsort(np.arange(heads) % kv_heads, kind="stable")  # query head h reads KV head h % K
        out = np.empty_like(q)
        out[:, :, order] = self.inner.attention(layer, seq_ids, q[:, :, order], scale, window, softcap, attend,
                                                image_spans=image_spans)  # fmt: skip
        return out


class GqaHeadMapping(DecoderModel):
    """Grouped-query attention maps query head h to KV head h % K instead of h // (H / K)."""

    def create_kv_cache(self, config=None):
        return _WrongGroups(super().create_kv_cache(config))


class SoftmaxScale(DecoderModel):
    """Attention scores scaled by 1 / E instead of 1 / sqrt(E) (or Gemma's query_pre_attn_scalar)."""

    def __init__(self, config, weights, tokenizer=None, *args):
        wrong = config.with_overrides(attention=replace(config.attention, scale=1.0 / config.attention.rope_dim))
        super().__init__(wrong, weights, tokenizer, *args)


class _WindowOffByOne(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION, image_spans=None):
        return self.inner.attention(layer, seq_ids, q, scale, window and window + 1, softcap, attend,
                                    image_spans=image_spans)  # fmt: skip


class SlidingWindowOffByOne(DecoderModel):
    """A sliding-window layer sees W + 1 keys."""

    def create_kv_cache(self, config=None):
        return _WindowOffByOne(super().create_kv_cache(config))


class _RowZeroKeys(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION, image_spans=None):
        return self.inner.attention(layer, [seq_ids[0]] * len(seq_ids), q, scale, window, softcap, attend,
                                    image_spans=image_spans)  # fmt: skip


class BatchRowsShareKeys(DecoderModel):
    """Every row of a batch attends over the first row's keys."""

    def create_kv_cache(self, config=None):
        return _RowZeroKeys(super().create_kv_cache(config))


# --- norms --------------------------------------------------------------------------------


def _eps_outside_sqrt(x, weight, eps, offset=0.0):
    rms = np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True))
    return x / (rms + np.float32(eps)) * (np.float32(offset) + weight)


class EpsOutsideSqrt(_OpChanged):
    """RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)."""

    def wrong(self, ops):
        return replace(ops, rms_norm=_eps_outside_sqrt)


class GemmaNormEverywhere(_OpChanged):
    """Gemma's (1 + w) RMSNorm applied whatever the architecture."""

    def wrong(self, ops):
        return replace(ops, rms_norm=lambda x, weight, eps, offset=0.0: rms_norm(x, weight, eps, 1.0))


# --- input checks -------------------------------------------------------------------------


class UncheckedTokenIds(DecoderModel):
    """Token ids go unchecked: -1 silently reads the last embedding row."""

    def _check_tokens(self, tokens):
        return np.asarray(tokens)


# --- paged cache bookkeeping --------------------------------------------------------------


class _NoCopyOnWrite(PagedKVArena):
    def _reservation(self, seq, num_new):
        touched, _, grow = super()._reservation(seq, num_new)
        return touched, [], grow  # writes land in blocks the fork still shares


class WriteAfterForkShared(DecoderModel):
    """After a fork, new K/V are written into the shared block: the other branch's slot."""

    def create_kv_cache(self, config=None):
        return _NoCopyOnWrite(self.cache_shape, config or CacheConfig(), self.config.context_length)


class _LeakyTruncate(PagedKVArena):
    def truncate(self, seq_id, new_length):
        self._pool.release = lambda block: None  # the dropped blocks never return to the free list
        try:
            super().truncate(seq_id, new_length)
        finally:
            del self._pool.release


class TruncateForgetsToFree(DecoderModel):
    """truncate drops blocks from the sequence but never frees them."""

    def create_kv_cache(self, config=None):
        return _LeakyTruncate(self.cache_shape, config or CacheConfig(), self.config.context_length)


# --- found only by the draws of issue 16: dynamic NTK, long horizons, large weights, special ids --------


class DynamicNtkStaticBase(_OpChanged):
    """Dynamic NTK scaling ignored: the RoPE base never grows past max_position_embeddings."""

    def wrong(self, ops):
        def static_base(params, *args):
            static = replace(params, rope_type="default") if params.rope_type == "dynamic" else params
            return ops.rope_angles(static, *args)

        return replace(ops, rope_angles=static_base)


class RopeTableOf32(DecoderModel):
    """RoPE angles from a table of 32 positions: every position past 31 is rotated as position 31."""

    def _positions(self, cache, seq_ids, num_new):
        return np.minimum(super()._positions(cache, seq_ids, num_new), 31)


def _softmax_without_max(q, k, v, query_positions, scale, window=None, softcap=None):
    """The spec attention with exp(score) / sum(exp(score)): overflows once scores pass 88."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("the,she->hts", q, k) * np.float32(scale)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    distance = query_positions[:, None] - np.arange(k.shape[0])[None, :]
    allowed = (distance >= 0) & (distance < window if window is not None else True)
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.where(allowed[None], np.exp(scores), 0)
        weights = weights / weights.sum(-1, keepdims=True)
    return np.einsum("hts,she->the", weights, v).astype(q.dtype)


class _AttendReplaced(_CacheProxy):
    """The plain attention replaced by ``wrong``; an attend bound to its weights (DeepSeek's latent
    attention, gpt-oss's sinks) is left as it comes, the bug being in the plain one."""

    def __init__(self, inner, wrong):
        super().__init__(inner)
        self.wrong = wrong

    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION, image_spans=None):
        attend = attend if isinstance(attend, functools.partial) else self.wrong
        return self.inner.attention(layer, seq_ids, q, scale, window, softcap, attend, image_spans=image_spans)


class SoftmaxWithoutMax(DecoderModel):
    """Softmax without subtracting the max score: large attention scores overflow to inf, then NaN."""

    def create_kv_cache(self, config=None):
        return _AttendReplaced(super().create_kv_cache(config), _softmax_without_max)


def _softcap_after_mask(q, k, v, query_positions, scale, window=None, softcap=None):
    """The spec attention with the soft-cap applied after the mask: a masked -inf becomes -cap, so
    later keys and keys outside the window get weight exp(-cap - max) instead of none."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("the,she->hts", q, k) * np.float32(scale)
    scores = np.where(attention_mask(query_positions, k.shape[0], window)[None], scores, -np.inf)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    return np.einsum("hts,she->the", softmax(scores), v).astype(q.dtype)


class SoftcapAfterMask(DecoderModel):
    """Gemma 2's attention soft-cap applied after the causal mask instead of before it."""

    def create_kv_cache(self, config=None):
        return _AttendReplaced(super().create_kv_cache(config), _softcap_after_mask)


class RopeOnNopeLayers(DecoderModel):
    """SmolLM3's NoPE layers rotated like the others."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config.with_overrides(nope_layers=()), weights, tokenizer, *args)


def _nope_interval_off_by_one(checkpoint) -> ModelBackend:
    """SmolLM3's NoPE layers derived from ``no_rope_layer_interval`` one layer early (layer i skips RoPE where
    i % interval == 0, not (i + 1) % interval == 0); a listed ``no_rope_layers`` is read right."""
    config, keys = checkpoint.config, checkpoint.config_json
    if keys.get("model_type") == "smollm3" and keys.get("no_rope_layers") is None:
        interval = keys.get("no_rope_layer_interval", 4)
        config = config.with_overrides(nope_layers=tuple(range(0, config.num_hidden_layers, interval)))
    model = DecoderModel.load(InMemorySource(config, checkpoint.tensors))
    return ModelBackend(model, CacheConfig(kind="contiguous"), "NopeIntervalOffByOne")


class PreNormNotPostNorm(DecoderModel):
    """OLMo 2's norms applied to the sublayers' inputs (Llama's placement) instead of their outputs."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        if config.norms.placement is NormPlacement.POST:
            self.layers = op_by_op_layers(self.layers)
            for layer in self.layers:
                layer.attention_norm, layer.attention_output_norm = layer.attention_output_norm, None
                layer.mlp_norm, layer.mlp_output_norm = layer.mlp_output_norm, None


class PadEmbeddingZeroed(DecoderModel):
    """Token id 0 (pad) embeds as zeros, as if a padding mask were applied to real input."""

    def __init__(self, config, weights, tokenizer=None, *args):
        embed = weights.embed_tokens.copy()
        embed[0] = 0
        super().__init__(config, replace(weights, embed_tokens=embed), tokenizer, *args)


def _stray_lm_head(checkpoint) -> ModelBackend:
    """A tied checkpoint's stray lm_head.weight used as the LM head (tied means the embedding table)."""
    untied = checkpoint.config.with_overrides(tie_word_embeddings=False)
    tensors = dict(checkpoint.tensors)
    tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"])
    model = DecoderModel.load(InMemorySource(untied, tensors))
    return ModelBackend(model, CacheConfig(kind="contiguous"), "StrayLmHead")


def _greedy_skips_last_id(llm):
    def greedy(tokens, new_tokens):
        cache_id, chosen = "greedy", []
        logits = llm.prefill(cache_id, tokens)
        for step in range(new_tokens):
            chosen.append(int(np.argmax(logits[:-1])))  # the range stops one id short
            if step + 1 < new_tokens:
                logits = llm.decode(cache_id, chosen[-1], len(tokens) + step)
        llm.release(cache_id)
        return chosen

    return greedy


class DroppedQkvBias(DecoderModel):
    """The q, k and v projection biases are never added."""

    def __init__(self, config, weights, tokenizer=None, *args):
        def unbiased(w):
            if not isinstance(w.attention, AttentionWeights):  # latent attention's biases are its own
                return w
            return replace(w, attention=replace(w.attention, q_proj_bias=None, k_proj_bias=None, v_proj_bias=None))

        super().__init__(config, replace(weights, layers=[unbiased(w) for w in weights.layers]), tokenizer, *args)


# --- DeepSeek-V3: latent cache and grouped routing ---------------------------------------------


class _RopeKeyUnrotated(_CacheProxy):
    def __init__(self, inner, raw_rope_key, rank):
        super().__init__(inner)
        self.raw_rope_key, self.rank = raw_rope_key, rank

    def write(self, layer, seq_ids, k, v):
        k = k.copy()
        k[..., self.rank :] = self.raw_rope_key
        self.inner.write(layer, seq_ids, k, v)


class _KeyUnrotatedAttention:
    """A latent attention block whose cache gets the shared RoPE key as it was before the rotation."""

    def __init__(self, block: LatentAttentionBlock):
        self.block = block

    def __call__(self, x, positions, cache, seq_ids, image_spans=None):
        w, rank = self.block.w, self.block.widths[-1]  # C, the latent's width
        compressed = self.block.ops.linear(x, w.kv_a_proj_with_mqa, w.kv_a_proj_with_mqa_bias)
        return self.block(x, positions, _RopeKeyUnrotated(cache, compressed[:, :, None, rank:], rank), seq_ids)


class LatentRopeKeyCachedBeforeRope(DecoderModel):
    """Latent attention caches its shared RoPE key before rotating it (queries are rotated)."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        self.layers = op_by_op_layers(self.layers)
        for layer in self.layers:
            if isinstance(layer.attention, LatentAttentionBlock):
                layer.attention = _KeyUnrotatedAttention(layer.attention)


def _bias_in_weights(router_logits, correction_bias, **settings):
    """DeepSeek's routing, its chosen experts weighed by score + correction bias (settings: grouped_topk_routing's)."""
    expert_ids, _ = grouped_topk_routing(router_logits, correction_bias, **settings)
    weights = np.take_along_axis(sigmoid(router_logits) + correction_bias, expert_ids, axis=-1)
    if settings["norm_topk_prob"]:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return expert_ids, weights * settings["routed_scaling_factor"]


class _Rerouted(DecoderModel):
    """A model whose sparse layers route with ``wrong(route)`` instead of their family's ``route``
    (a partial of one of the routings of refllm/nn/moe.py or moe_grouped.py, its settings bound)."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        self.layers = op_by_op_layers(self.layers)
        for layer in self.layers:
            if isinstance(layer.mlp, SparseMLP):
                layer.mlp.route = self.wrong(layer.mlp.route)

    def wrong(self, route):
        raise NotImplementedError


class RoutingBiasInWeights(_Rerouted):
    """DeepSeek's router weighs the chosen experts by score + correction bias, not the score alone."""

    def wrong(self, route):
        return functools.partial(_bias_in_weights, **route.keywords) if route.func is grouped_topk_routing else route


def _scaled_then_renormalised(router_logits, correction_bias, **settings):
    """DeepSeek's routing with routed_scaling_factor applied before the renormalisation, which undoes it."""
    expert_ids, _ = grouped_topk_routing(router_logits, correction_bias, **settings)
    weights = np.take_along_axis(sigmoid(router_logits), expert_ids, axis=-1) * settings["routed_scaling_factor"]
    if settings["norm_topk_prob"]:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return expert_ids, weights


class ScalingBeforeRenormalisation(_Rerouted):
    """DeepSeek's routed_scaling_factor applied to the chosen weights before they are renormalised, not after."""

    def wrong(self, route):
        if route.func is not grouped_topk_routing:
            return route
        return functools.partial(_scaled_then_renormalised, **route.keywords)


# --- mixtures of experts and attention sinks ------------------------------------------------------


class RouterOrderSwapped(_Rerouted):
    """The router's softmax after the top-k instead of before (and before it where gpt-oss puts it after)."""

    def wrong(self, route):
        if route.func is topk_then_softmax:
            return functools.partial(softmax_then_topk, k=route.keywords["k"], renormalize=False)
        if route.func is softmax_then_topk:
            return functools.partial(topk_then_softmax, k=route.keywords["k"])
        return route  # DeepSeek-V3's router is RoutingBiasInWeights's


class RouterNotRenormalised(_Rerouted):
    """The k chosen probabilities used as they are, where the config renormalises them to sum to 1."""

    def wrong(self, route):
        return functools.partial(route, renormalize=False) if route.func is softmax_then_topk else route


class SinksDropped(DecoderModel):
    """gpt-oss's attention sinks never join the softmax."""

    def __init__(self, config, weights, tokenizer=None, *args):
        def sinkless(w):
            if not isinstance(w.attention, AttentionWeights):  # latent attention has no sinks
                return w
            return replace(w, attention=replace(w.attention, sinks=None))

        super().__init__(config, replace(weights, layers=[sinkless(w) for w in weights.layers]), tokenizer, *args)


def _experts_reversed(mlp: SparseMLP) -> SparseMLP:
    """The same sparse layer with its experts numbered backwards: the stable top-k then breaks an exact
    tie towards the higher original index, and nothing else changes."""
    w, route = mlp.w, mlp.route

    def backwards(array):
        return None if array is None else np.ascontiguousarray(array[::-1])

    reversed_w = replace(w, router=backwards(w.router), router_bias=backwards(w.router_bias),
                         correction_bias=backwards(w.correction_bias), experts=w.experts[::-1])  # fmt: skip
    if "correction_bias" in route.keywords:
        route = functools.partial(route.func, **route.keywords | {"correction_bias": backwards(w.correction_bias)})
    return SparseMLP(reversed_w, route, mlp.expert_mlp, mlp.linear)


class _TiesToHigherIndexInBatches:
    """A sparse layer that, run on several sequences at once, breaks router ties towards the higher index."""

    def __init__(self, mlp: SparseMLP):
        self.alone, self.batched = mlp, _experts_reversed(mlp)

    def __call__(self, h):
        return (self.batched if h.shape[0] > 1 else self.alone)(h)


class TiesReversedInBatches(DecoderModel):
    """Exactly tied router scores go to the higher expert index when sequences are decoded together
    (decode_batch), to the lower one (refllm's rule) when each runs alone."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        self.layers = op_by_op_layers(self.layers)
        for layer in self.layers:
            if isinstance(layer.mlp, SparseMLP):
                layer.mlp = _TiesToHigherIndexInBatches(layer.mlp)


# --- plain callables -----------------------------------------------------------------------------

PIECE = 24  # the logits property's longest prompt


def _callable_in_pieces(checkpoint):
    """A plain callable that runs a prompt as independent pieces of PIECE tokens: right up to position
    PIECE - 1, blind past it to everything before the current piece."""
    backend = ModelBackend(DecoderModel.load(checkpoint), CacheConfig(kind="contiguous"))

    def logits(tokens):
        return np.concatenate([backend.all_logits(tokens[i : i + PIECE]) for i in range(0, len(tokens), PIECE)])

    logits.__qualname__ = "CallableInPieces"
    return logits


# --- runtimes whose bookkeeping is wrong (seen through LLMBackend) --------------------------------


class _LLMProxy:
    def __init__(self, inner: LLM):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class AcceptsDecodeOnUnknownId(_LLMProxy):
    """decode on a cache id never prefilled starts a sequence instead of refusing."""

    def decode(self, cache_id, token, pos):
        if cache_id not in self.inner:
            return self.inner.prefill(cache_id, [token])
        return self.inner.decode(cache_id, token, pos)


class ReleaseKeepsKV(_LLMProxy):
    """release forgets the id but keeps its KV: a prefill that reuses the id continues the old sequence."""

    def __init__(self, inner):
        super().__init__(inner)
        self.released = set()

    def prefill(self, cache_id, tokens):
        self.released.discard(cache_id)
        return self.inner.prefill(cache_id, tokens)

    def decode(self, cache_id, token, pos):
        if cache_id in self.released:
            raise KeyError(f"cache id {cache_id} was released")
        return self.inner.decode(cache_id, token, self.inner.length(cache_id))

    def decode_batch(self, items):
        if any(cache_id in self.released for cache_id, _, _ in items):
            raise KeyError("a cache id of the batch was released")
        return self.inner.decode_batch([(cache_id, token, self.inner.length(cache_id)) for cache_id, token, _ in items])

    def release(self, cache_id):
        if cache_id in self.released or cache_id not in self.inner:
            raise KeyError(f"unknown cache id {cache_id}")
        self.released.add(cache_id)

    def reset(self):
        self.inner.reset()
        self.released.clear()


class BatchRowsSorted(_LLMProxy):
    """decode_batch returns its rows ordered by cache id, not in the order they were asked for."""

    def decode_batch(self, items):
        rows = self.inner.decode_batch(items)
        order = sorted(range(len(items)), key=lambda row: str(items[row][0]))
        return [rows[row] for row in order]


def _paged_llm(checkpoint) -> LLM:
    return LLM(DecoderModel.load(checkpoint), CacheConfig(kind="paged", block_size=BLOCK_SIZE))


def _llm_backend(proxy_class, checkpoint) -> LLMBackend:
    return LLMBackend(proxy_class(_paged_llm(checkpoint)), proxy_class.__name__)


def rope_base_off(checkpoint):
    return _backend(RopeBaseOff, checkpoint)


def interleaved_rope(checkpoint):
    return _backend(InterleavedRope, checkpoint)


def chunk_position_off_by_one(checkpoint):
    return _backend(ChunkPositionOffByOne, checkpoint)


def gqa_head_mapping(checkpoint):
    return _backend(GqaHeadMapping, checkpoint)


def softmax_scale(checkpoint):
    return _backend(SoftmaxScale, checkpoint)


def eps_outside_sqrt(checkpoint):
    return _backend(EpsOutsideSqrt, checkpoint)


def gemma_norm_everywhere(checkpoint):
    return _backend(GemmaNormEverywhere, checkpoint)


def sliding_window_off_by_one(checkpoint):
    return _backend(SlidingWindowOffByOne, checkpoint)


def write_after_fork_shared(checkpoint):
    return _backend(WriteAfterForkShared, checkpoint, "paged")


def truncate_forgets_to_free(checkpoint):
    return _backend(TruncateForgetsToFree, checkpoint, "paged")


def batch_rows_share_keys(checkpoint):
    return _backend(BatchRowsShareKeys, checkpoint)


def unchecked_token_ids(checkpoint):
    return _backend(UncheckedTokenIds, checkpoint)


def dynamic_ntk_static_base(checkpoint):
    return _backend(DynamicNtkStaticBase, checkpoint)


def rope_table_of_32(checkpoint):
    return _backend(RopeTableOf32, checkpoint, "paged")


def softmax_without_max(checkpoint):
    return _backend(SoftmaxWithoutMax, checkpoint)


def pad_embedding_zeroed(checkpoint):
    return _backend(PadEmbeddingZeroed, checkpoint)


def stray_lm_head(checkpoint):
    return _stray_lm_head(checkpoint)


def greedy_skips_last_id(checkpoint):
    llm = _paged_llm(checkpoint)
    return LLMBackend(llm, "GreedySkipsLastId", greedy=_greedy_skips_last_id(llm))


def dropped_qkv_bias(checkpoint):
    return _backend(DroppedQkvBias, checkpoint)


def latent_rope_key_cached_before_rope(checkpoint):
    return _backend(LatentRopeKeyCachedBeforeRope, checkpoint)


def routing_bias_in_weights(checkpoint):
    return _backend(RoutingBiasInWeights, checkpoint)


def router_order_swapped(checkpoint):
    return _backend(RouterOrderSwapped, checkpoint)


def router_not_renormalised(checkpoint):
    return _backend(RouterNotRenormalised, checkpoint)


def sinks_dropped(checkpoint):
    return _backend(SinksDropped, checkpoint, "paged")


def accepts_decode_on_unknown_id(checkpoint):
    return _llm_backend(AcceptsDecodeOnUnknownId, checkpoint)


def release_keeps_kv(checkpoint):
    return _llm_backend(ReleaseKeepsKV, checkpoint)


def batch_rows_sorted(checkpoint):
    return _llm_backend(BatchRowsSorted, checkpoint)


def softcap_after_mask(checkpoint):
    return _backend(SoftcapAfterMask, checkpoint)


def rope_on_nope_layers(checkpoint):
    return _backend(RopeOnNopeLayers, checkpoint)


def pre_norm_not_post_norm(checkpoint):
    return _backend(PreNormNotPostNorm, checkpoint)


def nope_interval_off_by_one(checkpoint):
    return _nope_interval_off_by_one(checkpoint)


def scaling_before_renormalisation(checkpoint):
    return _backend(ScalingBeforeRenormalisation, checkpoint)


def ties_reversed_in_decode_batch(checkpoint):
    llm = LLM(TiesReversedInBatches.load(checkpoint), CacheConfig(kind="paged", block_size=BLOCK_SIZE))
    return LLMBackend(llm, "TiesReversedInDecodeBatch")


def callable_in_pieces(checkpoint):
    return _callable_in_pieces(checkpoint)


MUTANTS = [
    rope_base_off,
    interleaved_rope,
    chunk_position_off_by_one,
    gqa_head_mapping,
    softmax_scale,
    eps_outside_sqrt,
    gemma_norm_everywhere,
    sliding_window_off_by_one,
    write_after_fork_shared,
    truncate_forgets_to_free,
    batch_rows_share_keys,
    unchecked_token_ids,
    dynamic_ntk_static_base,
    rope_table_of_32,
    softmax_without_max,
    pad_embedding_zeroed,
    stray_lm_head,
    greedy_skips_last_id,
    dropped_qkv_bias,
    latent_rope_key_cached_before_rope,
    routing_bias_in_weights,
    router_order_swapped,
    router_not_renormalised,
    sinks_dropped,
    accepts_decode_on_unknown_id,
    release_keeps_kv,
    batch_rows_sorted,
    softcap_after_mask,
    rope_on_nope_layers,
    pre_norm_not_post_norm,
    nope_interval_off_by_one,
    scaling_before_renormalisation,
    ties_reversed_in_decode_batch,
    callable_in_pieces,
]

# The property each of these mutants must be reported by: the one whose call exposes the bug.
EXPECTED_PROPERTY = {
    "rope_table_of_32": "long_horizon",
    "greedy_skips_last_id": "own_greedy",
    "accepts_decode_on_unknown_id": "errors",
    "release_keeps_kv": "schedule",
    "batch_rows_sorted": "batch",
    "callable_in_pieces": "long_horizon",  # a plain callable is taken past 24 positions there
}
