"""The mutation gallery: backends with one deliberate bug each, built from refllm's own model.

Each mutant is a factory ``checkpoint -> backend``, as the conformance kit
takes them, and each bug is a few lines: a subclass of ``LlamaFamilyModel``
overriding one small method, or a KV cache with one step done wrong. The kit
must catch every one (``tests/test_oracle_mutants.py``).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from refllm.kv import OWN_ATTENTION, CacheConfig
from refllm.kv.paged import PagedKVArena
from refllm.models.contract import InMemorySource
from refllm.models.llama import LlamaFamilyModel
from refllm.models.moe_layer import mixture_of_experts, route
from refllm.moe_parameters import TOPK_THEN_SOFTMAX
from refllm.nn.attention import attention_mask, softmax
from refllm.nn.moe import softmax_then_topk, topk_then_softmax
from refllm.nn.moe_grouped import grouped_topk_routing, sigmoid
from refllm.nn.rope import rotary_dims
from refllm.nn.softcap import soft_cap
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


# --- RoPE -------------------------------------------------------------------------------


class RopeBaseOff(LlamaFamilyModel):
    """RoPE frequencies from twice the configured base."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        for layer_type, params in config.rope.items():
            params = replace(params, theta=2 * params.theta)
            self.rope_angles[layer_type] = self.ops.rope_angles(
                params, config.head_dim, config.max_position_embeddings, self.dtype
            )


class InterleavedRope(LlamaFamilyModel):
    """RoPE pairs dims (2i, 2i+1) instead of (i, i + R/2) on rotate-half weights.

    Rotating interleaved pairs equals rotating halves after permuting each
    head's rotary dims as [0, 2, 4, ..., 1, 3, 5, ...]; q.k is unchanged by a
    common permutation, so permuting the q/k projection rows is that bug.
    """

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        E = config.head_dim
        R = rotary_dims(config.rope_for_layer(0), E)
        within = np.concatenate([np.arange(0, R, 2), np.arange(1, R, 2), np.arange(R, E)])  # [E]
        for w in weights.layers:
            for name in ("q_proj", "k_proj", "q_proj_bias", "k_proj_bias", "q_norm", "k_norm"):
                rows = getattr(w, name)
                if rows is not None:  # every head's rows [E, ...] reordered the same way
                    setattr(w, name, rows[(np.arange(len(rows) // E)[:, None] * E + within).ravel()])


class ChunkPositionOffByOne(LlamaFamilyModel):
    """A prompt chunk after the first is rotated one position too far."""

    def decoder_layer(self, layer_index, w, x, positions, cache, seq_ids):
        if x.shape[1] > 1 and positions[0, 0] > 0:
            positions = positions + 1
        return super().decoder_layer(layer_index, w, x, positions, cache, seq_ids)


# --- attention ----------------------------------------------------------------------------


class _WrongGroups(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION):
        heads, kv_heads = q.shape[2], self.inner.shape.num_kv_heads
        order = np.argsort(np.arange(heads) % kv_heads, kind="stable")  # query head h reads KV head h % K
        out = np.empty_like(q)
        out[:, :, order] = self.inner.attention(layer, seq_ids, q[:, :, order], scale, window, softcap, attend)
        return out


class GqaHeadMapping(LlamaFamilyModel):
    """Grouped-query attention maps query head h to KV head h % K instead of h // (H / K)."""

    def create_kv_cache(self, config=None):
        return _WrongGroups(super().create_kv_cache(config))


class SoftmaxScale(LlamaFamilyModel):
    """Attention scores scaled by 1 / E instead of 1 / sqrt(E) (or Gemma's query_pre_attn_scalar)."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config.with_overrides(attention_scale=1.0 / config.head_dim), weights, tokenizer, *args)


class _WindowOffByOne(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION):
        return self.inner.attention(layer, seq_ids, q, scale, window and window + 1, softcap, attend)


class SlidingWindowOffByOne(LlamaFamilyModel):
    """A sliding-window layer sees W + 1 keys."""

    def create_kv_cache(self, config=None):
        return _WindowOffByOne(super().create_kv_cache(config))


class _RowZeroKeys(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION):
        return self.inner.attention(layer, [seq_ids[0]] * len(seq_ids), q, scale, window, softcap, attend)


class BatchRowsShareKeys(LlamaFamilyModel):
    """Every row of a batch attends over the first row's keys."""

    def create_kv_cache(self, config=None):
        return _RowZeroKeys(super().create_kv_cache(config))


# --- norms --------------------------------------------------------------------------------


class EpsOutsideSqrt(LlamaFamilyModel):
    """RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)."""

    def _norm(self, x, weight):
        rms = np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True))
        return x / (rms + np.float32(self.config.rms_norm_eps)) * (np.float32(self.config.norm_weight_offset) + weight)


class GemmaNormEverywhere(LlamaFamilyModel):
    """Gemma's (1 + w) RMSNorm applied whatever the architecture."""

    def _norm(self, x, weight):
        return super()._norm(x, weight + np.float32(1.0 - self.config.norm_weight_offset))


# --- input checks -------------------------------------------------------------------------


class UncheckedTokenIds(LlamaFamilyModel):
    """Token ids go unchecked: -1 silently reads the last embedding row."""

    def _check_tokens(self, tokens):
        return np.asarray(tokens)


# --- paged cache bookkeeping --------------------------------------------------------------


class _NoCopyOnWrite(PagedKVArena):
    def _reservation(self, seq, num_new):
        touched, _, grow = super()._reservation(seq, num_new)
        return touched, [], grow  # writes land in blocks the fork still shares


class WriteAfterForkShared(LlamaFamilyModel):
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


class TruncateForgetsToFree(LlamaFamilyModel):
    """truncate drops blocks from the sequence but never frees them."""

    def create_kv_cache(self, config=None):
        return _LeakyTruncate(self.cache_shape, config or CacheConfig(), self.config.context_length)


# --- found only by the draws of issue 16: dynamic NTK, long horizons, large weights, special ids --------


class DynamicNtkStaticBase(LlamaFamilyModel):
    """Dynamic NTK scaling ignored: the RoPE base never grows past max_position_embeddings."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config, weights, tokenizer, *args)
        for layer_type, params in config.rope.items():
            if params.rope_type == "dynamic":
                static = replace(params, rope_type="default")
                self.rope_angles[layer_type] = self.ops.rope_angles(
                    static, config.head_dim, config.max_position_embeddings, self.dtype
                )


class RopeTableOf32(LlamaFamilyModel):
    """RoPE angles from a table of 32 positions: every position past 31 is rotated as position 31."""

    def decoder_layer(self, layer, w, x, positions, cache, seq_ids):
        return super().decoder_layer(layer, w, x, np.minimum(positions, 31), cache, seq_ids)


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

    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=OWN_ATTENTION):
        attend = attend if isinstance(attend, functools.partial) else self.wrong
        return self.inner.attention(layer, seq_ids, q, scale, window, softcap, attend)


class SoftmaxWithoutMax(LlamaFamilyModel):
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


class SoftcapAfterMask(LlamaFamilyModel):
    """Gemma 2's attention soft-cap applied after the causal mask instead of before it."""

    def create_kv_cache(self, config=None):
        return _AttendReplaced(super().create_kv_cache(config), _softcap_after_mask)


class RopeOnNopeLayers(LlamaFamilyModel):
    """SmolLM3's NoPE layers rotated like the others."""

    def __init__(self, config, weights, tokenizer=None, *args):
        super().__init__(config.with_overrides(nope_layers=()), weights, tokenizer, *args)


class PreNormNotPostNorm(LlamaFamilyModel):
    """OLMo 2's norms applied to the sublayers' inputs (Llama's placement) instead of their outputs."""

    def decoder_layer(self, layer_index, w, x, positions, cache, seq_ids):
        if not self.config.post_norms:
            return super().decoder_layer(layer_index, w, x, positions, cache, seq_ids)
        normed = self._norm(x, w.post_attention_layernorm)
        x = x + self.self_attention(layer_index, w, normed, positions, cache, seq_ids)
        return x + self.mlp(w, self._norm(x, w.post_feedforward_layernorm))


class PadEmbeddingZeroed(LlamaFamilyModel):
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
    model = LlamaFamilyModel.load(InMemorySource(untied, tensors))
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


class DroppedQkvBias(LlamaFamilyModel):
    """The q, k and v projection biases are never added."""

    def __init__(self, config, weights, tokenizer=None, *args):
        layers = [replace(w, q_proj_bias=None, k_proj_bias=None, v_proj_bias=None) for w in weights.layers]
        super().__init__(config, replace(weights, layers=layers), tokenizer, *args)


# --- DeepSeek-V3: latent cache and grouped routing ---------------------------------------------


class _RopeKeyUnrotated(_CacheProxy):
    def __init__(self, inner, raw_rope_key, rank):
        super().__init__(inner)
        self.raw_rope_key, self.rank = raw_rope_key, rank

    def write(self, layer, seq_ids, k, v):
        k = k.copy()
        k[..., self.rank :] = self.raw_rope_key
        self.inner.write(layer, seq_ids, k, v)


class LatentRopeKeyCachedBeforeRope(LlamaFamilyModel):
    """Latent attention caches its shared RoPE key before rotating it (queries are rotated)."""

    def self_attention(self, layer_index, w, x, positions, cache, seq_ids):
        if w.latent is not None:
            rank = self.config.latent_attention.kv_lora_rank
            compressed = self.ops.linear(x, w.latent.kv_a_proj_with_mqa, w.latent.kv_a_proj_with_mqa_bias)
            cache = _RopeKeyUnrotated(cache, compressed[:, :, None, rank:], rank)
        return super().self_attention(layer_index, w, x, positions, cache, seq_ids)


def _bias_in_weights(router_logits, correction_bias, k, num_groups, groups_per_token, norm, scaling):
    expert_ids, _ = grouped_topk_routing(router_logits, correction_bias, k, num_groups, groups_per_token, norm, scaling)
    weights = np.take_along_axis(sigmoid(router_logits) + correction_bias, expert_ids, axis=-1)
    if norm:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return expert_ids, weights * scaling


class RoutingBiasInWeights(LlamaFamilyModel):
    """DeepSeek's router weighs the chosen experts by score + correction bias, not the score alone."""

    route_experts = staticmethod(_bias_in_weights)


# --- mixtures of experts and attention sinks ------------------------------------------------------


def _other_order(router_logits, moe):
    if moe.routing == TOPK_THEN_SOFTMAX:
        return softmax_then_topk(router_logits, moe.experts_per_token, renormalize=False)
    return topk_then_softmax(router_logits, moe.experts_per_token)


class _RoutedWrong(LlamaFamilyModel):
    routing = staticmethod(route)

    def mlp(self, w, h):
        if w.experts is None or self.config.moe is None:  # DeepSeek-V3's router is RoutingBiasInWeights's
            return super().mlp(w, h)
        return mixture_of_experts(h, w, self.config, self.ops, self.routing)


class RouterOrderSwapped(_RoutedWrong):
    """The router's softmax after the top-k instead of before (and before it where gpt-oss puts it after)."""

    routing = staticmethod(_other_order)


class RouterNotRenormalised(_RoutedWrong):
    """The k chosen probabilities used as they are, where the config renormalises them to sum to 1."""

    routing = staticmethod(lambda router_logits, moe: route(router_logits, replace(moe, norm_topk_prob=False)))


class SinksDropped(LlamaFamilyModel):
    """gpt-oss's attention sinks never join the softmax."""

    def __init__(self, config, weights, tokenizer=None, *args):
        layers = [replace(w, sinks=None) for w in weights.layers]
        super().__init__(config, replace(weights, layers=layers), tokenizer, *args)


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
    return LLM(LlamaFamilyModel.load(checkpoint), CacheConfig(kind="paged", block_size=BLOCK_SIZE))


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
]

# The property each mutant of issue 16 must be reported by: the one whose call exposes the bug.
EXPECTED_PROPERTY = {
    "rope_table_of_32": "long_horizon",
    "greedy_skips_last_id": "own_greedy",
    "accepts_decode_on_unknown_id": "errors",
    "release_keeps_kv": "schedule",
    "batch_rows_sorted": "batch",
}
