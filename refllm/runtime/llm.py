"""LLM: a decoder-only model behind cache ids, over one paged KV arena.

    llm = LLM(model)
    logits = llm.prefill("chat-1", prompt_ids)          # [V], creates the sequence's cache
    logits = llm.decode("chat-1", token, pos)            # pos = tokens already consumed
    rows = llm.decode_batch([("chat-1", t1, p1), (7, t2, p2)])   # one forward pass, rows in order
    llm.release("chat-1")

Cache ids are any hashable the caller picks; the arena knows sequences by
int, so the LLM keeps the mapping. Every public method validates all of its
input before it changes anything, and a forward pass that fails (say the
arena runs out of blocks) is rolled back, so a refused call leaves the LLM as
it was.

The model is any ``GenerativeModel`` (``refllm/models/contract.py``) whose
``create_kv_cache`` gives a paged arena: the LLM calls only the protocol.
``decode_batch`` is one ``model.forward_step`` over [B, 1, D]: each weight matrix
is applied once to the B stacked rows, and only attention runs per sequence,
inside the arena's kernel, over that sequence's own blocks.

A new prompt runs PREFILL_CHUNK tokens per forward pass, and ``prefill_progress``,
if set, hears how far it is after each (the command line draws a bar from it).

Prefix caching: ``prefill`` on a new cache id starts it on the arena's cached
blocks of the same prompt prefix (``match_prefix``) and computes only the
rest; every token fed afterwards is registered with the arena, so generated
text becomes reusable prefix too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from refllm.errors import (
    ContextLengthError,
    InvalidInputError,
    UnknownSequenceError,
)
from refllm.kv import CacheConfig
from refllm.kv.paged import ArenaStats, PagedKVArena
from refllm.models.contract import GenerativeModel, VisionInfo
from refllm.runtime.checks import (
    DecodeItem,
    check_cache_id,
    check_decode_items,
    check_fits_context,
    check_position,
    check_prompt,
    check_truncate,
)
from refllm.runtime.image_prompts import checked_images, chunk_ends, image_runs, prefix_key_ids

# A warm-up prompt long enough for the fast op set's prompt-sized products (kernels/gemm.py: 16 tokens and up)
WARM_UP_PROMPT = 24
# A new prompt's forward passes take at most this many tokens at a time, and report progress after each
PREFILL_CHUNK = 256

@dataclass(frozen=True)
class LLMConfig:
    """What a runtime needs to know about the model and its cache; ``blocks_free`` is live."""

    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    block_size: int
    num_blocks: int
    prefix_caching: bool  # new prompts start on cached blocks of an equal prefix
    count_free_blocks: Callable[[], int] = field(repr=False, compare=False)
    vision: VisionInfo | None = None  # what images the model takes; None: text only

    @property
    def blocks_free(self) -> int:
        """Blocks no live sequence references, evictable prefix-cache blocks included."""
        return self.count_free_blocks()


class LLM:
    """Cache-id keyed prefill / decode / decode_batch / release over a ``PagedKVArena``."""

    def __init__(
        self, model: GenerativeModel, cache_config: CacheConfig | None = None, context_length: int | None = None
    ):
        """``context_length``: most tokens a sequence may hold; default (and most) the model's context."""
        limit = model.metadata.context_length
        if context_length is not None and not 1 <= context_length <= limit:
            raise ContextLengthError(f"context_length {context_length} must be in [1, {limit}], the model's context")
        cache = model.create_kv_cache(cache_config or CacheConfig())
        if not isinstance(cache, PagedKVArena):
            raise InvalidInputError(f"LLM runs over the paged arena; cache_config asks for {cache_config.kind!r}")
        self.model = model
        self.arena = cache
        metadata = model.metadata
        self.config = LLMConfig(
            vocab_size=metadata.vocab_size,
            context_length=context_length or limit,
            eos_token_ids=tuple(metadata.eos_token_ids),
            block_size=cache.block_size,
            num_blocks=cache.num_blocks,
            prefix_caching=cache.config.prefix_caching,
            count_free_blocks=cache.free_blocks,
            vision=metadata.vision,
        )
        self._seq_ids: dict[Hashable, int] = {}  # cache id -> arena sequence id
        self._new_seq_id = itertools.count()
        # (tokens computed, tokens to compute) before and after each chunk of a new prompt: a progress bar
        self.prefill_progress: Callable[[int, int], None] | None = None

    # --- queries ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.model.metadata.architecture

    @property
    def num_parameters(self) -> int:
        return self.model.metadata.num_parameters

    def cache_ids(self) -> list[Hashable]:
        return list(self._seq_ids)

    def __contains__(self, cache_id: Hashable) -> bool:
        return check_cache_id(cache_id) in self._seq_ids

    def length(self, cache_id: Hashable) -> int:
        """Tokens consumed by ``cache_id`` so far: the ``pos`` its next token must carry."""
        return self.arena.length(self._seq_id(cache_id))

    def stats(self) -> ArenaStats:
        return self.arena.stats()

    # --- the forward passes -------------------------------------------------------------------

    def prefill(
        self,
        cache_id: Hashable,
        tokens: Sequence[int],
        images: Sequence[np.ndarray] = (),
        chunk_tokens: int | None = None,
    ) -> np.ndarray:
        """tokens: [T] -> logits [V] after the last one.

        A new cache id starts a sequence (on cached prefix blocks where the
        arena has them); a live one takes ``tokens`` as its next chunk.
        images: a vision-language model's pixel batches, one per image in ``tokens``
        (``GenerativeModel.embed_multimodal``); each image's runs lie whole in ``tokens``.
        chunk_tokens: run the prompt in steps of at most this many tokens, none ending
        inside an image (``image_prompts.chunk_ends``); None: PREFILL_CHUNK for a new
        sequence (``prefill_progress`` hears of each), one step for a live one.
        """
        tokens = check_prompt(tokens, self.config.vocab_size)
        cache_id = check_cache_id(cache_id)
        if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int)
                                         or chunk_tokens < 1):  # fmt: skip
            raise InvalidInputError(f"chunk_tokens must be a positive integer or None; got {chunk_tokens!r}")
        vision = self.config.vision
        images = checked_images(vision, tokens, images)
        live = cache_id in self._seq_ids
        start = self.length(cache_id) if live else 0
        check_fits_context(cache_id, start, len(tokens), self.config.context_length)
        x = self._embed(tokens, images)  # the vision tower runs here, before anything changes
        runs = image_runs(vision, tokens) if images else []  # without images, image tokens are plain tokens
        key_ids = prefix_key_ids(tokens, runs, images)
        runs = [(start + a, start + b) for a, b in runs]
        if live:
            hidden = self._extend([self._seq_ids[cache_id]], x, [key_ids], runs, chunk_tokens)[0]
        else:
            hidden = self._start(cache_id, x, key_ids, runs, chunk_tokens)
        return self.model.logits(hidden[-1])

    def decode(self, cache_id: Hashable, token: int, pos: int) -> np.ndarray:
        """One token at position ``pos`` (= tokens already consumed) -> logits [V]."""
        return self.decode_batch([(cache_id, token, pos)])[0]

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[np.ndarray]:
        """[(cache_id, token, pos), ...] -> logits [V] per item, in order, from one forward pass."""
        cache_ids, tokens = check_decode_items(items, self.length, self.config.vocab_size, self.config.context_length)
        x = self.model.embed(tokens[:, None])  # [B, 1, D]
        hidden = self._extend([self._seq_ids[c] for c in cache_ids], x, tokens[:, None].tolist())
        return list(self.model.logits(hidden[:, 0]))

    def decode_all_logits(self, cache_id: Hashable, tokens: Sequence[int], pos: int) -> np.ndarray:
        """tokens: [T] at positions pos .. pos + T - 1 of a live sequence -> logits [T, V], one row per position.

        Speculative decoding verifies a draft with this: one forward pass, then
        ``truncate`` rolls back the rejected tail.
        """
        tokens = check_prompt(tokens, self.config.vocab_size)
        check_position(check_cache_id(cache_id), pos, self.length(cache_id))
        check_fits_context(cache_id, pos, len(tokens), self.config.context_length)
        x = self.model.embed(tokens[None])
        return self.model.logits(self._extend([self._seq_ids[cache_id]], x, [tokens.tolist()])[0])

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """tokens: [T] -> logits [T, V] at every position, from a throwaway cache: the arena is untouched.

        For non-autoregressive use (perplexity, classification), where nothing is generated afterwards.
        """
        tokens = check_prompt(tokens, self.config.vocab_size)
        check_fits_context("score", 0, len(tokens), self.config.context_length)
        cache = self.model.create_kv_cache(CacheConfig(kind="contiguous"))
        return self.model.prefill_all_logits(tokens[None], cache, range(len(tokens)))[0]

    # --- sequences ---------------------------------------------------------------------------------

    def fork(self, source_id: Hashable, new_id: Hashable) -> None:
        """``new_id`` continues from the same tokens as ``source_id``, sharing its blocks until one writes."""
        source = self._seq_id(source_id)
        new_id = check_cache_id(new_id)
        if new_id in self._seq_ids:
            raise InvalidInputError(f"cannot fork into cache id {new_id!r}: it is live")
        seq_id = next(self._new_seq_id)
        self.arena.fork(source, seq_id)
        self._seq_ids[new_id] = seq_id

    def truncate(self, cache_id: Hashable, length: int) -> None:
        """Roll ``cache_id`` back to its first ``length`` tokens."""
        seq_id = self._seq_id(cache_id)
        self.arena.truncate(seq_id, check_truncate(cache_id, length, self.arena.length(seq_id)))

    def release(self, cache_id: Hashable) -> None:
        """Free ``cache_id``'s blocks; the full ones stay in the prefix cache until evicted."""
        self.arena.free(self._seq_id(cache_id))
        del self._seq_ids[check_cache_id(cache_id)]

    def warm_up(self) -> None:
        """Every kind of product a request runs, once, so that its kernels compile (or load from cache) now:
        a two-token prefill and a decode step, then a prompt-sized prefill (WARM_UP_PROMPT tokens, the
        prompt products of kernels/gemm.py), one sequence at a time so that the smallest arena holds them."""
        cache_id = ("warm-up",)  # no caller's id is a tuple of this string
        self.prefill(cache_id, [0, 0])
        self.decode(cache_id, 0, 2)
        self.release(cache_id)
        self.prefill(cache_id, [0] * min(WARM_UP_PROMPT, self.config.context_length))
        self.release(cache_id)

    def reset(self) -> None:
        """Release every cache id and empty the prefix cache."""
        self.arena.reset()
        self._seq_ids.clear()

    # --- unchecked internals -------------------------------------------------------------------------

    def _seq_id(self, cache_id: Hashable) -> int:
        cache_id = check_cache_id(cache_id)
        if cache_id not in self._seq_ids:
            raise UnknownSequenceError(f"unknown cache id {cache_id!r}")
        return self._seq_ids[cache_id]

    def _embed(self, tokens: np.ndarray, images: list[np.ndarray]) -> np.ndarray:
        """tokens: [T] -> embeddings [1, T, D], each image's features in its runs when there are images."""
        return self.model.embed_multimodal(tokens[None], images) if images else self.model.embed(tokens[None])

    def _start(
        self, cache_id: Hashable, x: np.ndarray, key_ids: list[int], runs: list, chunk_tokens: int | None
    ) -> np.ndarray:
        """A new sequence: cached prefix blocks, then a forward over the rest -> hidden [T - cached, D].

        x: the prompt's embeddings [1, T, D]; key_ids: what the prefix cache knows its tokens by. Whether
        the rest fits is known only once the prefix is matched, so a refusal frees the new sequence again
        (the cached blocks it held go back to the prefix cache).
        """
        seq_id = next(self._new_seq_id)
        cached = self.arena.match_prefix(seq_id, key_ids)
        try:
            self.arena.reserve([seq_id], len(key_ids) - cached)
            chunks = chunk_tokens or PREFILL_CHUNK
            hidden = self._forward(seq_id, x[:, cached:], cached, runs, chunks, self.prefill_progress)
        except BaseException:
            self.arena.free(seq_id)
            raise
        self._seq_ids[cache_id] = seq_id
        return hidden[0]

    def _extend(
        self, seq_ids: list[int], x: np.ndarray, key_ids: list[list[int]], runs: list = (), chunk_tokens=None
    ) -> np.ndarray:
        """x: [B, T, D], row b continuing sequence seq_ids[b] (key_ids[b]: its T tokens' prefix-cache ids)
        -> hidden [B, T, D]; all or nothing. runs and chunk_tokens: one sequence's (``_forward``)."""
        self.arena.reserve(seq_ids, x.shape[1])  # all or nothing: OutOfBlocksError leaves the arena as it was
        lengths = [self.arena.length(s) for s in seq_ids]
        for seq_id, row in zip(seq_ids, key_ids):
            self.arena.register_tokens(seq_id, row)
        try:
            if len(seq_ids) == 1:
                return self._forward(seq_ids[0], x, lengths[0], runs, chunk_tokens)
            return self.model.forward_step(x, self.arena, seq_ids)
        except BaseException:
            for seq_id, length in zip(seq_ids, lengths):
                self.arena.truncate(seq_id, length)  # also forgets the token ids registered above
            raise

    def _forward(
        self, seq_id: int, x: np.ndarray, start: int, runs: list, chunk_tokens: int | None, report=None
    ) -> np.ndarray:
        """x: [1, T, D] at positions start .. start + T - 1 of one sequence, in chunks no image run straddles
        -> hidden [1, T, D]. runs: the image runs (absolute positions), passed to the model only when there are
        some (so a model without images needs no image_spans). report(done, T), if given, before and after each."""
        ends = chunk_ends(start, start + x.shape[1], chunk_tokens or x.shape[1], runs)
        spans = {"image_spans": [runs]} if runs else {}
        hidden, position = [], start
        if report is not None:
            report(0, x.shape[1])
        for end in ends:
            hidden.append(self.model.forward_step(x[:, position - start : end - start], self.arena, [seq_id], **spans))
            position = end
            if report is not None:
                report(position - start, x.shape[1])
        return np.concatenate(hidden, axis=1)
