"""ConfigurableModelExecutor: a ModelExecutor with scripted logits, for testing schedulers and servers.

It answers like ferrum's testkit executor (``crates/ferrum-testkit`` in
ferrum-infer-rs) by default, so a scheduler tested against either mock sees the
same tokens: ``with_token_sequence(vocab_size, [7, 8, 9])`` gives 7 from the
prefill, then 7, 8, 9, 7, ... from the decode calls; ``with_eos_after(vocab_size,
3, eos)`` gives 42 from the prefill, 42, 42, 42 from three decode calls and EOS
from the fourth. The block arena is simulated and the input checks are
``LLM``'s, so refusals and ``OutOfBlocksError`` match a real model's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from refllm.errors import InvalidInputError, UnknownSequenceError
from refllm.kv import OutOfBlocksError
from refllm.kv.base import blocks_for
from refllm.runtime.checks import (
    check_cache_id,
    check_decode_items,
    check_fits_context,
    check_position,
    check_prompt,
    check_truncate,
)
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.image_prompts import checked_images
from refllm.runtime.llm import LLMConfig

NextLogits = Callable[[Sequence[int], Sequence[int]], np.ndarray]  # (prompt, fed since) -> logits [V]
# (decode call) -> logits [V]: None for a prefill, else the executor-wide index of the decode call
StepLogits = Callable[[int | None], np.ndarray]
COUNTINGS = ("executor", "sequence")


@dataclass
class _ScriptedCache:
    tokens: list[int]
    prompt_length: int  # tokens of the prefill that created the cache


class ScriptedLM:
    """What ``LLM`` offers, with scripted logits and no weights.

    A script is either ``next_logits(prompt, fed_since_prompt)``, per sequence:
    the "prompt" is what the prefill that created a cache fed, and tokens fed
    after it (decodes, appended chunks) are the second argument, so a script can
    count a sequence's generation steps; or ``step_logits(decode_call)``, counted
    over the whole executor as ferrum's testkit counts: None for a prefill, k
    for the k-th decode call (a ``decode_batch`` is one call, every row
    answered alike; each position a verification feeds counts as one call).
    Blocks are simulated: each cache holds
    ceil(tokens / block_size) of ``num_blocks``, and running out raises
    OutOfBlocksError, with nothing changed, as the paged arena does. Input is
    validated by the same checks as ``LLM``.
    """

    name = "scripted"
    num_parameters = 0

    def __init__(
        self,
        vocab_size: int,
        next_logits: NextLogits | None = None,
        *,
        step_logits: StepLogits | None = None,
        eos_token_ids: tuple[int, ...] = (),
        context_length: int = 2048,
        block_size: int = 16,
        num_blocks: int = 1024,
    ):
        if (next_logits is None) == (step_logits is None):
            raise InvalidInputError("a scripted model takes one script: next_logits or step_logits")
        self.next_logits, self.step_logits = next_logits, step_logits
        self.decode_calls = 0  # decode calls answered so far, all sequences together
        self._caches: dict[Hashable, _ScriptedCache] = {}
        self.config = LLMConfig(
            vocab_size, context_length, tuple(eos_token_ids), block_size, num_blocks, False, self._free_blocks
        )

    def cache_ids(self) -> list[Hashable]:
        return list(self._caches)

    def length(self, cache_id: Hashable) -> int:
        return len(self._cache(cache_id).tokens)

    def prefill(self, cache_id: Hashable, tokens: Sequence[int], images=(), chunk_tokens: int | None = None) -> np.ndarray:
        """As ``LLM.prefill``: a scripted model reads text only, and chunks change nothing of its logits."""
        checked_images(None, tokens, images)
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        cache = self._caches.get(check_cache_id(cache_id))
        held = cache.tokens if cache else []
        check_fits_context(cache_id, len(held), len(tokens), self.config.context_length)
        self._reserve({cache_id: len(held) + len(tokens)})
        updated = _ScriptedCache(held + tokens, cache.prompt_length if cache else len(tokens))
        logits = self._logits(updated)
        self._caches[cache_id] = updated
        return logits

    def decode(self, cache_id: Hashable, token: int, pos: int) -> np.ndarray:
        return self.decode_batch([(cache_id, token, pos)])[0]

    def decode_batch(self, items: Sequence[tuple[Hashable, int, int]]) -> list[np.ndarray]:
        cache_ids, tokens = check_decode_items(items, self.length, self.config.vocab_size, self.config.context_length)
        self._reserve({c: self.length(c) + 1 for c in cache_ids})
        updated = {
            c: _ScriptedCache([*self._caches[c].tokens, int(t)], self._caches[c].prompt_length)
            for c, t in zip(cache_ids, tokens)
        }
        call = self._next_decode_call()
        rows = [self._logits(cache, call) for cache in updated.values()]
        self._caches.update(updated)
        return rows

    def decode_all_logits(self, cache_id: Hashable, tokens: Sequence[int], pos: int) -> np.ndarray:
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        check_position(cache_id, pos, self.length(cache_id))
        check_fits_context(cache_id, pos, len(tokens), self.config.context_length)
        self._reserve({cache_id: pos + len(tokens)})
        cache = self._caches[cache_id]
        rows = np.stack(
            [
                self._logits(
                    _ScriptedCache(cache.tokens + tokens[: t + 1], cache.prompt_length), self._next_decode_call()
                )
                for t in range(len(tokens))
            ]
        )
        cache.tokens.extend(tokens)
        return rows

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        check_fits_context("score", 0, len(tokens), self.config.context_length)
        return np.stack([self._logits(_ScriptedCache(tokens[: t + 1], t + 1)) for t in range(len(tokens))])

    def fork(self, source_id: Hashable, new_id: Hashable) -> None:
        source = self._cache(source_id)
        if check_cache_id(new_id) in self._caches:
            raise InvalidInputError(f"cannot fork into cache id {new_id!r}: it is live")
        self._reserve({new_id: len(source.tokens)})
        self._caches[new_id] = _ScriptedCache(list(source.tokens), source.prompt_length)

    def truncate(self, cache_id: Hashable, length: int) -> None:
        cache = self._cache(cache_id)
        length = check_truncate(cache_id, length, len(cache.tokens))
        del cache.tokens[length:]
        cache.prompt_length = min(cache.prompt_length, length)

    def release(self, cache_id: Hashable) -> None:
        self._cache(cache_id)
        del self._caches[cache_id]

    def reset(self) -> None:
        self._caches.clear()

    def _cache(self, cache_id: Hashable) -> _ScriptedCache:
        if check_cache_id(cache_id) not in self._caches:
            raise UnknownSequenceError(f"unknown cache id {cache_id!r}")
        return self._caches[cache_id]

    def _next_decode_call(self) -> int:
        self.decode_calls += 1
        return self.decode_calls - 1

    def _logits(self, cache: _ScriptedCache, decode_call: int | None = None) -> np.ndarray:
        if self.step_logits is not None:
            return np.asarray(self.step_logits(decode_call), np.float32)
        p = cache.prompt_length
        return np.asarray(self.next_logits(cache.tokens[:p], cache.tokens[p:]), np.float32)

    def _blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.config.block_size)

    def _free_blocks(self) -> int:
        return self.config.num_blocks - sum(self._blocks_for(len(c.tokens)) for c in self._caches.values())

    def _reserve(self, new_lengths: dict[Hashable, int]) -> None:
        """Refuse, changing nothing, unless the blocks for ``new_lengths`` (cache id -> tokens) are free."""
        needed = sum(
            self._blocks_for(n) - self._blocks_for(len(self._caches[c].tokens) if c in self._caches else 0)
            for c, n in new_lengths.items()
        )
        if needed > self._free_blocks():
            raise OutOfBlocksError(f"{needed} more blocks needed; {self._free_blocks()} are free")


class ConfigurableModelExecutor(LLMExecutor):
    """An executor over ``ScriptedLM``: scripted tokens, a simulated block arena, no weights.

    ``with_token_sequence`` and ``with_eos_after`` produce ferrum's sequences
    (``ConfigurableModelExecutor`` in ferrum-testkit) by default: one decode
    counter for the whole executor (``counting="executor"``). With
    ``counting="sequence"`` each sequence counts its own tokens after its prompt.

    Options: step_logits, eos_token_ids, context_length, block_size, num_blocks
    (of ScriptedLM) and max_batch_size.
    """

    def __init__(
        self, vocab_size: int, next_logits: NextLogits | None = None, *, max_batch_size: int = 64, **options: Any
    ):
        super().__init__(ScriptedLM(vocab_size, next_logits, **options), max_batch_size=max_batch_size, offload=False)

    @classmethod
    def with_token_sequence(
        cls, vocab_size: int, tokens: Sequence[int], counting: str = "executor", **options: Any
    ) -> ConfigurableModelExecutor:
        """Cycles through ``tokens``, by a wide margin. ``executor``: a prefill answers tokens[0]
        without counting; decode call k answers tokens[k % len(tokens)]. ``sequence``: the i-th
        token after a cache's prompt is tokens[i % len(tokens)]."""
        tokens = check_prompt(tokens, vocab_size).tolist()
        def per_sequence(prompt: Sequence[int], fed: Sequence[int]) -> np.ndarray:
            return one_hot_logits(vocab_size, tokens[len(fed) % len(tokens)])

        def per_decode_call(call: int | None) -> np.ndarray:
            return one_hot_logits(vocab_size, tokens[0 if call is None else call % len(tokens)])

        return cls._scripted(vocab_size, counting, per_sequence, per_decode_call, options)

    @classmethod
    def with_eos_after(
        cls, vocab_size: int, n: int, eos_token: int, counting: str = "executor", token: int = 42, **options: Any
    ) -> ConfigurableModelExecutor:
        """``token`` (42, as ferrum's) until ``n`` decode steps have answered, then ``eos_token`` (also the
        EOS id). ``executor``: a prefill answers ``token`` without counting; decode call k answers
        ``eos_token`` when k >= n. ``sequence``: the i-th token after a cache's prompt is ``eos_token``
        when i >= n."""
        if n < 0 or not 0 <= eos_token < vocab_size or not 0 <= token < vocab_size or token == eos_token:
            raise InvalidInputError(
                f"with_eos_after needs n >= 0 and eos_token != token, both in [0, {vocab_size});"
                f" got n={n}, eos_token={eos_token}, token={token}"
            )
        def per_sequence(prompt: Sequence[int], fed: Sequence[int]) -> np.ndarray:
            return one_hot_logits(vocab_size, eos_token if len(fed) >= n else token)

        def per_decode_call(call: int | None) -> np.ndarray:
            return one_hot_logits(vocab_size, eos_token if call is not None and call >= n else token)

        options = {"eos_token_ids": (eos_token,)} | options
        return cls._scripted(vocab_size, counting, per_sequence, per_decode_call, options)

    @classmethod
    def _scripted(
        cls, vocab_size: int, counting: str, per_sequence: NextLogits, per_decode_call: StepLogits, options: dict
    ) -> ConfigurableModelExecutor:
        if counting not in COUNTINGS:
            raise InvalidInputError(f"counting must be one of {', '.join(COUNTINGS)}; got {counting!r}")
        if counting == "sequence":
            return cls(vocab_size, per_sequence, **options)
        return cls(vocab_size, step_logits=per_decode_call, **options)


def one_hot_logits(vocab_size: int, token: int, margin: float = 30.0) -> np.ndarray:
    """Logits [V] that put all but e^-margin of the probability on ``token``."""
    logits = np.zeros(vocab_size, np.float32)
    logits[token] = margin
    return logits
