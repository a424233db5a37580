"""ModelExecutor: the asynchronous face of a model, which schedulers and servers drive.

A scheduler talks to an executor in small dataclasses: it prefills a prompt
(getting a ``KvCacheHandle`` back), decodes batches of (token, handle), forks,
truncates and releases caches. ``info``, ``capabilities``, ``status`` and
``release_cache`` are plain methods; everything that runs the model is a
coroutine, so an event loop (a server's) stays free while NumPy works.

A handle carries the number of tokens its cache holds; a decode feeds its
token at that position, and every call returns the updated handle. A stale
handle (its cache has moved on or been released) is refused.

Two implementations:

    LLMExecutor(LLM(model))              a real model; calls run one at a time on a worker thread
    ConfigurableModelExecutor.with_token_sequence(vocab_size, tokens)
    ConfigurableModelExecutor.with_eos_after(vocab_size, n, eos_token)
                                         scripted logits and a simulated block arena: no weights,
                                         for testing schedulers and servers
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from refllm.errors import InvalidInputError, PositionError, UnknownSequenceError
from refllm.kv import OutOfBlocksError
from refllm.runtime.llm import (
    LLM,
    LLMConfig,
    blocks_for,
    check_cache_id,
    check_decode_items,
    check_position,
    check_prompt,
    check_room,
    check_truncate,
)

T = TypeVar("T")


@dataclass(frozen=True)
class KvCacheHandle:
    """One sequence's cache in an executor, and how many tokens it holds (the next token's position)."""

    cache_id: Hashable
    num_tokens: int


@dataclass(frozen=True)
class PrefillInput:
    input_ids: Sequence[int]  # [T]
    kv_cache: KvCacheHandle | None = None  # None starts a new cache; a handle appends to it


@dataclass(frozen=True)
class PrefillOutput:
    logits: np.ndarray  # [V] after the last input token
    kv_cache: KvCacheHandle


@dataclass(frozen=True)
class DecodeInput:
    token: int
    kv_cache: KvCacheHandle  # the token goes at position kv_cache.num_tokens


@dataclass(frozen=True)
class DecodeOutput:
    logits: np.ndarray  # [V]
    kv_cache: KvCacheHandle


@dataclass(frozen=True)
class VerifyOutput:
    logits: np.ndarray  # [T, V]: row t follows the t-th verified token
    kv_cache: KvCacheHandle


@dataclass(frozen=True)
class ModelInfo:
    name: str
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    num_parameters: int


@dataclass(frozen=True)
class ExecutorCapabilities:
    max_batch_size: int  # decode inputs one batch_decode accepts
    block_size: int  # tokens per KV block
    num_blocks: int  # blocks in the arena
    prefix_caching: bool  # new prompts reuse cached blocks of equal prefixes
    forward_verify: bool  # forward_verify and truncate_kv (speculative decoding)


@dataclass(frozen=True)
class ExecutorStatus:
    state: str  # "ready" or "shutdown"
    live_caches: int
    blocks_free: int  # blocks no live cache references (evictable prefix-cache blocks included)
    blocks_total: int


class ExecutorShutdownError(InvalidInputError):
    """A call to an executor after its shutdown."""


@runtime_checkable
class ModelExecutor(Protocol):
    def info(self) -> ModelInfo: ...
    def capabilities(self) -> ExecutorCapabilities: ...
    def status(self) -> ExecutorStatus: ...
    def release_cache(self, handle: KvCacheHandle) -> None: ...
    async def prefill(self, request: PrefillInput) -> PrefillOutput: ...
    async def decode(self, request: DecodeInput) -> DecodeOutput: ...
    async def batch_decode(self, requests: Sequence[DecodeInput]) -> list[DecodeOutput]: ...
    async def forward(self, input_ids: Sequence[int]) -> np.ndarray: ...
    async def forward_verify(self, handle: KvCacheHandle, input_ids: Sequence[int]) -> VerifyOutput: ...
    async def fork_cache(self, handle: KvCacheHandle) -> KvCacheHandle: ...
    async def truncate_kv(self, handle: KvCacheHandle, num_tokens: int) -> KvCacheHandle: ...
    async def warmup(self) -> None: ...
    async def shutdown(self) -> None: ...


class LLMExecutor:
    """A ModelExecutor over an ``LLM`` (or anything with its methods).

    One lock serialises every call, and with ``offload`` the model work runs
    on a worker thread (``asyncio.to_thread``), so concurrent callers on one
    event loop, or on several threads, take turns and the loop stays responsive.
    """

    def __init__(self, llm: LLM, *, max_batch_size: int = 64, offload: bool = True):
        if max_batch_size < 1:
            raise InvalidInputError(f"max_batch_size must be at least 1, not {max_batch_size}")
        self.llm = llm
        self.max_batch_size = max_batch_size
        self._offload = offload
        self._lock = threading.Lock()
        self._new_cache_id = itertools.count()
        self._shut_down = False

    # --- plain methods -------------------------------------------------------------------

    def info(self) -> ModelInfo:
        c = self.llm.config
        return ModelInfo(self.llm.name, c.vocab_size, c.context_length, c.eos_token_ids, self.llm.num_parameters)

    def capabilities(self) -> ExecutorCapabilities:
        c = self.llm.config
        return ExecutorCapabilities(self.max_batch_size, c.block_size, c.num_blocks, c.prefix_caching, True)

    def status(self) -> ExecutorStatus:
        with self._lock:
            c = self.llm.config
            state = "shutdown" if self._shut_down else "ready"
            return ExecutorStatus(state, len(self.llm.cache_ids()), c.blocks_free, c.num_blocks)

    def release_cache(self, handle: KvCacheHandle) -> None:
        """Free the handle's cache; a stale handle will do (releasing needs no position)."""
        self._locked(lambda: self.llm.release(self._check_handle(handle, current=False)))

    # --- coroutines ----------------------------------------------------------------------

    async def prefill(self, request: PrefillInput) -> PrefillOutput:
        def run() -> PrefillOutput:
            if request.kv_cache is None:
                cache_id = next(self._new_cache_id)
            else:
                cache_id = self._check_handle(request.kv_cache)
            logits = self.llm.prefill(cache_id, request.input_ids)
            return PrefillOutput(logits, self._handle(cache_id))

        return await self._run(run)

    async def decode(self, request: DecodeInput) -> DecodeOutput:
        return (await self.batch_decode([request]))[0]

    async def batch_decode(self, requests: Sequence[DecodeInput]) -> list[DecodeOutput]:
        """One forward pass for the whole batch; outputs in the order of ``requests``."""

        def run() -> list[DecodeOutput]:
            if len(requests) > self.max_batch_size:
                raise InvalidInputError(f"a batch of {len(requests)} exceeds max_batch_size {self.max_batch_size}")
            items = [(r.kv_cache.cache_id, r.token, r.kv_cache.num_tokens) for r in map(_decode_input, requests)]
            rows = self.llm.decode_batch(items)
            return [DecodeOutput(row, self._handle(cache_id)) for row, (cache_id, _, _) in zip(rows, items)]

        return await self._run(run)

    async def forward(self, input_ids: Sequence[int]) -> np.ndarray:
        """input_ids: [T] -> logits [T, V] at every position; no cache is kept."""
        return await self._run(lambda: self.llm.score(input_ids))

    async def forward_verify(self, handle: KvCacheHandle, input_ids: Sequence[int]) -> VerifyOutput:
        """The pending token and a draft, [N + 1], in one forward pass -> a row of logits per position."""

        def run() -> VerifyOutput:
            cache_id = self._check_handle(handle)
            logits = self.llm.decode_all_logits(cache_id, input_ids, handle.num_tokens)
            return VerifyOutput(logits, self._handle(cache_id))

        return await self._run(run)

    async def fork_cache(self, handle: KvCacheHandle) -> KvCacheHandle:
        """A new cache holding the same tokens (sharing blocks until one side writes)."""

        def run() -> KvCacheHandle:
            cache_id = next(self._new_cache_id)
            self.llm.fork(self._check_handle(handle), cache_id)
            return self._handle(cache_id)

        return await self._run(run)

    async def truncate_kv(self, handle: KvCacheHandle, num_tokens: int) -> KvCacheHandle:
        """Roll the cache back to its first ``num_tokens`` tokens (rejected draft tokens, say)."""

        def run() -> KvCacheHandle:
            cache_id = self._check_handle(handle)
            self.llm.truncate(cache_id, num_tokens)
            return self._handle(cache_id)

        return await self._run(run)

    async def warmup(self) -> None:
        """Run a prefill and a decode once, so the first request does not pay for compilation."""
        await self._run(self.llm.warm_up)

    async def shutdown(self) -> None:
        """Release every cache; later calls are refused."""

        def run() -> None:
            self.llm.reset()
            self._shut_down = True

        await self._run(run)

    # --- internals -----------------------------------------------------------------------

    async def _run(self, work: Callable[[], T]) -> T:
        if self._offload:
            return await asyncio.to_thread(self._locked, work)
        return self._locked(work)

    def _locked(self, work: Callable[[], T]) -> T:
        with self._lock:
            if self._shut_down:
                raise ExecutorShutdownError("the executor has been shut down")
            return work()

    def _handle(self, cache_id: Hashable) -> KvCacheHandle:
        return KvCacheHandle(cache_id, self.llm.length(cache_id))

    def _check_handle(self, handle: Any, current: bool = True) -> Hashable:
        """The cache id of a live handle, and with ``current`` one whose token count is up to date."""
        if not isinstance(handle, KvCacheHandle):
            raise InvalidInputError(f"expected a KvCacheHandle; got {handle!r:.80}")
        length = self.llm.length(handle.cache_id)  # UnknownSequenceError for a released cache
        if current and handle.num_tokens != length:
            raise PositionError(
                f"stale handle: cache {handle.cache_id!r} holds {length} tokens, not {handle.num_tokens}"
            )
        return handle.cache_id


def _decode_input(request: Any) -> DecodeInput:
    if not isinstance(request, DecodeInput) or not isinstance(request.kv_cache, KvCacheHandle):
        raise InvalidInputError(f"expected a DecodeInput with a KvCacheHandle; got {request!r:.80}")
    return request


# --- the scripted stand-in ----------------------------------------------------------------------------

NextLogits = Callable[[Sequence[int], Sequence[int]], np.ndarray]  # (prompt, fed since) -> logits [V]


@dataclass
class _ScriptedCache:
    tokens: list[int]
    prompt_length: int  # tokens of the prefill that created the cache


class ScriptedLM:
    """What ``LLM`` offers, with logits from ``next_logits(prompt, fed_since_prompt)`` and no weights.

    The "prompt" is what the prefill that created a cache fed; tokens fed
    after it (decodes, appended chunks) are the second argument, so a script
    can count generation steps. Blocks are simulated: each cache holds
    ceil(tokens / block_size) of ``num_blocks``, and running out raises
    OutOfBlocksError, with nothing changed, as the paged arena does. Input is
    validated by the same checks as ``LLM``.
    """

    name = "scripted"
    num_parameters = 0

    def __init__(
        self,
        vocab_size: int,
        next_logits: NextLogits,
        *,
        eos_token_ids: tuple[int, ...] = (),
        context_length: int = 2048,
        block_size: int = 16,
        num_blocks: int = 1024,
    ):
        self.next_logits = next_logits
        self._caches: dict[Hashable, _ScriptedCache] = {}
        self.config = LLMConfig(
            vocab_size, context_length, tuple(eos_token_ids), block_size, num_blocks, False, self._free_blocks
        )

    def cache_ids(self) -> list[Hashable]:
        return list(self._caches)

    def length(self, cache_id: Hashable) -> int:
        return len(self._cache(cache_id).tokens)

    def prefill(self, cache_id: Hashable, tokens: Sequence[int]) -> np.ndarray:
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        cache = self._caches.get(check_cache_id(cache_id))
        held = cache.tokens if cache else []
        check_room(cache_id, len(held), len(tokens), self.config.context_length)
        self._reserve({cache_id: len(held) + len(tokens)})
        updated = _ScriptedCache(held + tokens, cache.prompt_length if cache else len(tokens))
        logits = self._logits(updated)
        self._caches[cache_id] = updated
        return logits

    def decode(self, cache_id: Hashable, token: int, pos: int) -> np.ndarray:
        return self.decode_batch([(cache_id, token, pos)])[0]

    def decode_batch(self, items: Sequence[tuple[Hashable, int, int]]) -> list[np.ndarray]:
        cache_ids, tokens = check_decode_items(items, self.length, self.config)
        self._reserve({c: self.length(c) + 1 for c in cache_ids})
        updated = {
            c: _ScriptedCache([*self._caches[c].tokens, int(t)], self._caches[c].prompt_length)
            for c, t in zip(cache_ids, tokens)
        }
        rows = [self._logits(cache) for cache in updated.values()]
        self._caches.update(updated)
        return rows

    def decode_all_logits(self, cache_id: Hashable, tokens: Sequence[int], pos: int) -> np.ndarray:
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        check_position(cache_id, pos, self.length(cache_id))
        check_room(cache_id, pos, len(tokens), self.config.context_length)
        self._reserve({cache_id: pos + len(tokens)})
        cache = self._caches[cache_id]
        rows = np.stack(
            [
                self._logits(_ScriptedCache(cache.tokens + tokens[: t + 1], cache.prompt_length))
                for t in range(len(tokens))
            ]
        )
        cache.tokens.extend(tokens)
        return rows

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        tokens = check_prompt(tokens, self.config.vocab_size).tolist()
        check_room("score", 0, len(tokens), self.config.context_length)
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

    def _logits(self, cache: _ScriptedCache) -> np.ndarray:
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

    Options: eos_token_ids, context_length, block_size, num_blocks (of
    ScriptedLM) and max_batch_size.
    """

    def __init__(self, vocab_size: int, next_logits: NextLogits, *, max_batch_size: int = 64, **options: Any):
        super().__init__(ScriptedLM(vocab_size, next_logits, **options), max_batch_size=max_batch_size, offload=False)

    @classmethod
    def with_token_sequence(cls, vocab_size: int, tokens: Sequence[int], **options: Any) -> ConfigurableModelExecutor:
        """The i-th token after a cache's prompt is tokens[i % len(tokens)], by a wide margin."""
        tokens = check_prompt(tokens, vocab_size).tolist()
        return cls(
            vocab_size, lambda prompt, fed: one_hot_logits(vocab_size, tokens[len(fed) % len(tokens)]), **options
        )

    @classmethod
    def with_eos_after(cls, vocab_size: int, n: int, eos_token: int, **options: Any) -> ConfigurableModelExecutor:
        """``n`` tokens other than ``eos_token`` after each prompt, then ``eos_token`` (also the EOS id)."""
        if vocab_size < 2 or n < 0 or not 0 <= eos_token < vocab_size:
            raise InvalidInputError("with_eos_after needs vocab_size >= 2, n >= 0 and an eos_token in range")

        def script(prompt: Sequence[int], fed: Sequence[int]) -> np.ndarray:
            step = len(fed)
            token = eos_token if step >= n else (eos_token + 1 + step % (vocab_size - 1)) % vocab_size
            return one_hot_logits(vocab_size, token)

        return cls(vocab_size, script, **({"eos_token_ids": (eos_token,)} | options))


def one_hot_logits(vocab_size: int, token: int, margin: float = 30.0) -> np.ndarray:
    """Logits [V] that put all but e^-margin of the probability on ``token``."""
    logits = np.zeros(vocab_size, np.float32)
    logits[token] = margin
    return logits
