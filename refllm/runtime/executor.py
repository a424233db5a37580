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
    ConfigurableModelExecutor            scripted logits and a simulated block arena: no weights,
                                         for testing schedulers and servers
                                         (refllm/runtime/configurable_executor.py)
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from refllm.errors import InvalidInputError, PositionError
from refllm.models.contract import VisionInfo
from refllm.runtime.llm import LLM

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
    images: Sequence[np.ndarray] = ()  # a vision-language model's pixel batches, one per image in input_ids


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
    vision: VisionInfo | None = None  # what images the model takes; None: text only


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
    def inspect(self, look: Callable[[LLM], T]) -> T:
        """``look(llm)`` between two forward passes, under the executor's lock: to read the arena, say."""
        return self._locked(lambda: look(self.llm))

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
        return ModelInfo(self.llm.name, c.vocab_size, c.context_length, c.eos_token_ids, self.llm.num_parameters, c.vision)

    def capabilities(self) -> ExecutorCapabilities:
        c = self.llm.config
        return ExecutorCapabilities(self.max_batch_size, c.block_size, c.num_blocks, c.prefix_caching, True)

    def status(self) -> ExecutorStatus:
        with self._lock:
            c = self.llm.config
            state = "shutdown" if self._shut_down else "ready"
            return ExecutorStatus(state, len(self.llm.cache_ids()), c.blocks_free, c.num_blocks)

    def inspect(self, look: Callable[[LLM], T]) -> T:
        """``look(llm)`` between two forward passes, under the executor's lock: to read the arena, say."""
        return self._locked(lambda: look(self.llm))

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
            logits = self.llm.prefill(cache_id, request.input_ids, request.images)
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
