"""The engine's scheduler: which sequences wait, which run, and what one step does with them.

Every ``step`` does, in order:

1. drop cancelled requests, releasing their caches;
2. admit waiting sequences, oldest first, while the batch has room and the
   arena has free blocks for their prompts; each is prefilled and samples its
   first token (parallel sampling, n > 1, prefills the prompt once and forks
   the cache n - 1 times, so the prompt's blocks are shared);
3. decode every running sequence in ONE ``batch_decode``; when the arena runs
   out, the newest running sequence is preempted (its cache released, its
   tokens kept) and the batch is tried again without it. A preempted sequence
   waits at the front of the queue and, once re-admitted, is recomputed from
   its prompt (found in the prefix cache when still there) and its tokens;
4. sample each sequence's next token, stream its text (``TextStream``: no half
   characters, stop strings caught whole), and retire finished sequences.

A failure that belongs to one request ends that request alone, with finish_reason
"error" and the exception for its caller, releasing its caches; the others carry on
with the tokens they would have produced without it. Its prefill failing, or sampling
or streaming one of its sequences failing, belongs to it. A ``batch_decode`` that fails
(other than for blocks) belongs to no one yet: each sequence of the batch is then
decoded alone, once, and the ones that fail alone are failed, so one sequence's
failure costs the others one slower step. An executor broken for everyone fails
every request that way.

``add``, ``mark_cancelled`` and ``has_work`` may be called from any thread;
everything else runs under the engine's step lock, one call at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from refllm.errors import CacheCapacityError
from refllm.kv.base import blocks_for
from refllm.runtime.executor import DecodeInput, ExecutorCapabilities, KvCacheHandle, ModelExecutor, PrefillInput
from refllm.runtime.requests import CompletionDelta, CompletionSequence, Request


@dataclass
class EngineStats:
    steps: int = 0
    prefills: int = 0  # admissions, recomputations after preemption included
    decode_batches: int = 0
    decoded_tokens: int = 0
    largest_batch: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    cancelled_requests: int = 0


class Scheduler:
    """Admission, preemption and the decode batch over a ModelExecutor (see the module docstring)."""

    def __init__(self, executor: ModelExecutor, capabilities: ExecutorCapabilities, max_batch_size: int):
        self.executor = executor
        self.capabilities = capabilities
        self.max_batch_size = max_batch_size
        self.stats = EngineStats()
        self.requests: dict[int, Request] = {}  # live (unfinished) requests
        # Waiting groups, each admitted as a whole: a new request's n sequences, or one preempted sequence.
        self._waiting: deque[list[CompletionSequence]] = deque()
        self._running: list[CompletionSequence] = []
        self._incoming: list[Request] = []  # added since the last step; guarded by _submit_lock
        self._submit_lock = threading.Lock()

    def add(self, request: Request) -> None:
        """Queue a request for the next step (thread-safe)."""
        with self._submit_lock:
            self._incoming.append(request)
            self.requests[request.id] = request

    def mark_cancelled(self, request_id: int) -> bool:
        """Flag a live request for ``drop_cancelled`` (thread-safe); False when it has finished or never existed."""
        with self._submit_lock:
            request = self.requests.get(request_id)
            if request is None:
                return False
            request.cancelled = True
            return True

    def has_work(self) -> bool:
        return bool(self._incoming or self._waiting or self._running)

    async def step(self) -> bool:
        """One scheduling step; False when there was nothing to do."""
        with self._submit_lock:
            self._waiting.extend(request.sequences for request in self._incoming)
            self._incoming.clear()
        self.drop_cancelled()
        if not (self._waiting or self._running):
            return False
        self.stats.steps += 1
        await self._admit()
        await self._decode()
        return True

    def check_fits(self, prompt_length: int, max_new: int, n: int) -> None:
        """Refuse a request the whole arena could never run, so preemption always ends."""
        longest = self._blocks_for(prompt_length + max_new)
        admission = self._blocks_for(prompt_length + 1) + n - 1
        total = self.capabilities.num_blocks
        if max(longest, admission) > total:
            raise CacheCapacityError(
                f"a request of {prompt_length} prompt tokens, up to {max_new} new tokens and n={n} needs"
                f" {max(longest, admission)} KV blocks; the arena has {total}"
            )

    # --- the step ----------------------------------------------------------------------------

    async def _admit(self) -> None:
        """Prefill waiting groups, oldest first, while they fit; a group that does not fit waits for the next step."""
        while self._waiting and len(self._running) + len(self._waiting[0]) <= self.max_batch_size:
            group = self._waiting[0]
            spare = self.executor.status().blocks_free - len(self._running)  # one block of growth per running sequence
            if self._blocks_to_admit(group) > spare and self._running:
                return
            self._waiting.popleft()
            try:
                handles, logits = await self._prefill(group)
            except CacheCapacityError:
                self._waiting.appendleft(group)
                return
            except Exception as error:  # noqa: BLE001 (this group's own failure: the others carry on)
                self.fail(group[0].request, error)
                continue
            self.stats.prefills += 1
            for seq, handle in zip(group, handles):
                seq.handle = handle
                self._running.append(seq)
            for seq in group:
                self._advance(seq, logits)

    async def _prefill(self, group: list[CompletionSequence]) -> tuple[list[KvCacheHandle], np.ndarray]:
        """The group's prompt (then a preempted sequence's tokens) -> a handle per sequence and the logits."""
        handles: list[KvCacheHandle] = []
        try:
            request = group[0].request
            out = await self.executor.prefill(PrefillInput(request.prompt, images=request.images))
            handles.append(out.kv_cache)
            if group[0].tokens:  # recomputing a preempted sequence: its prompt, then what it generated
                out = await self.executor.prefill(PrefillInput(group[0].tokens, out.kv_cache))
                handles[0] = out.kv_cache
            for _ in group[1:]:
                handles.append(await self.executor.fork_cache(out.kv_cache))
        except BaseException:
            for handle in handles:
                self.executor.release_cache(handle)
            raise
        return handles, out.logits

    async def _decode(self) -> None:
        """One batch_decode over every running sequence, preempting the newest while the arena is short."""
        while self._running:
            batch = list(self._running)
            try:
                outputs = await self.executor.batch_decode([DecodeInput(s.tokens[-1], s.handle) for s in batch])
            except CacheCapacityError:
                if len(batch) == 1:
                    raise  # check_fits made sure that one sequence alone always fits
                self._preempt(max(batch, key=lambda s: s.age))
                continue
            except Exception as error:  # noqa: BLE001 (whose failure it is shows when each runs alone)
                if len(batch) == 1:
                    self.fail(batch[0].request, error)
                    continue
                await self._decode_alone(batch)
                return
            self._count_decode(len(batch))
            for seq, out in zip(batch, outputs):
                seq.handle = out.kv_cache  # every handle first: a failing sequence releases its request's
            for seq, out in zip(batch, outputs):
                self._advance(seq, out.logits)
            return

    async def _decode_alone(self, batch: list[CompletionSequence]) -> None:
        """After a batch_decode failed: each sequence decoded on its own, failing the ones that fail alone."""
        for seq in batch:
            if seq.finish_reason is not None:
                continue  # failed with another sequence of its request
            try:
                (out,) = await self.executor.batch_decode([DecodeInput(seq.tokens[-1], seq.handle)])
            except CacheCapacityError:
                self._preempt(seq)
                continue
            except Exception as error:  # noqa: BLE001 (its own failure)
                self.fail(seq.request, error)
                continue
            self._count_decode(1)
            seq.handle = out.kv_cache
            self._advance(seq, out.logits)

    def _count_decode(self, batch_size: int) -> None:
        self.stats.decode_batches += 1
        self.stats.decoded_tokens += batch_size
        self.stats.largest_batch = max(self.stats.largest_batch, batch_size)

    def _advance(self, seq: CompletionSequence, logits: np.ndarray) -> None:
        """Sample the next token from logits [V], stream it, and retire the sequence if it finished; a failure
        there fails the sequence's request."""
        if seq.finish_reason is not None:
            return  # failed with another sequence of its request
        try:
            choice = seq.sampler(logits, seq.request.prompt, seq.tokens)
            step = seq.stream.feed(choice.token)
        except Exception as error:  # noqa: BLE001 (this sequence's own failure: the others carry on)
            self.fail(seq.request, error)
            return
        seq.request.deltas.put(
            CompletionDelta(seq.index, step.text, choice.token, choice.logprob, choice.top_logprobs, step.finish_reason)
        )
        if step.finished:
            self._retire(seq, step.finish_reason)

    def _preempt(self, seq: CompletionSequence) -> None:
        self._release(seq)
        self._running.remove(seq)
        self._waiting.appendleft([seq])
        self.stats.preemptions += 1

    def _retire(self, seq: CompletionSequence, reason: str) -> None:
        self._release(seq)
        if seq in self._running:
            self._running.remove(seq)
        seq.finish_reason = reason
        request = seq.request
        if all(s.finish_reason is not None for s in request.sequences):
            with self._submit_lock:
                del self.requests[request.id]
            self.stats.finished_requests += not (request.cancelled or request.error)
            request.deltas.put(None)
            request.done.set()

    def _release(self, seq: CompletionSequence) -> None:
        if seq.handle is not None:
            self.executor.release_cache(seq.handle)
            seq.handle = None

    # --- ending requests from outside ---------------------------------------------------------------

    def fail_all(self, error: Exception) -> None:
        """End every live request with finish_reason "error", releasing what it holds."""
        with self._submit_lock:
            failed = list(self.requests.values())
            self._incoming.clear()
        for request in failed:
            self.fail(request, error)

    def fail(self, request: Request, error: BaseException) -> None:
        """End one request with finish_reason "error" (its handle raises ``error``), releasing its caches."""
        request.error = error
        self._waiting = deque(group for group in self._waiting if group[0].request is not request)
        for seq in request.sequences:
            with contextlib.suppress(Exception):  # a failing executor may refuse even a release
                self._release(seq)
            seq.handle = None
            self._end(seq, "error")

    def drop_cancelled(self) -> None:
        """Retire every sequence of a cancelled request, wherever it is."""
        with self._submit_lock:
            cancelled = [r for r in self.requests.values() if r.cancelled]
            self._incoming = [r for r in self._incoming if not r.cancelled]
        if not cancelled:
            return
        self._waiting = deque(g for g in self._waiting if not g[0].request.cancelled)
        for request in cancelled:
            self.stats.cancelled_requests += 1
            for seq in request.sequences:
                self._end(seq, "cancelled")

    def _end(self, seq: CompletionSequence, reason: str) -> None:
        """Retire an unfinished sequence from outside: a last, empty delta carries the reason."""
        if seq.finish_reason is None:
            seq.request.deltas.put(CompletionDelta(seq.index, "", None, finish_reason=reason))
            self._retire(seq, reason)

    # --- blocks ----------------------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.capabilities.block_size)

    def _blocks_to_admit(self, group: list[CompletionSequence]) -> int:
        """Blocks the group's prefill takes, its first decode included; each fork copies the shared last block."""
        length = len(group[0].request.prompt) + len(group[0].tokens) + 1
        return self._blocks_for(length) + len(group) - 1
