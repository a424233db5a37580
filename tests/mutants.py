"""The mutation gallery: backends with one deliberate bug each, built from refllm's own model.

Each mutant is a factory ``checkpoint -> backend``, as the conformance kit
takes them, and each bug is a few lines: a subclass of ``LlamaFamilyModel``
overriding one small method, or a KV cache with one step done wrong. The kit
must catch every one (``tests/test_oracle_mutants.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from refllm.kv import CacheConfig
from refllm.kv.paged import PagedKVArena
from refllm.models.llama import LlamaFamilyModel
from refllm.nn.rope import RopeTable, rotary_dims
from refllm.testing.backends import ModelBackend
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
            self.rope_tables[layer_type] = RopeTable(params, config.head_dim, config.max_position_embeddings)


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
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=None):
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
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=None):
        return self.inner.attention(layer, seq_ids, q, scale, window and window + 1, softcap, attend)


class SlidingWindowOffByOne(LlamaFamilyModel):
    """A sliding-window layer sees W + 1 keys."""

    def create_kv_cache(self, config=None):
        return _WindowOffByOne(super().create_kv_cache(config))


class _RowZeroKeys(_CacheProxy):
    def attention(self, layer, seq_ids, q, scale, window=None, softcap=None, attend=None):
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
]
