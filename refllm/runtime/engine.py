"""Engine: continuous batching of many requests over one ModelExecutor.

    engine = Engine(LLMExecutor(LLM(model)), tokenizer)
    for delta in engine.submit("Once upon a time", SamplingParams(max_tokens=32)):
        print(delta.text, end="")                      # streams; the iterator drives the engine
    results = engine.generate(["a", "b"], params)      # notebooks: all at once, in order

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

Threads: ``submit`` and ``cancel`` are safe from any thread. Steps run one at
a time under a lock, driven either by the caller (``step``,
``run_until_done``, iterating a handle, ``generate``) or by a background
thread (``start``/``stop``), as a server sharing one engine would use it. The
executor's coroutines run on the engine's own event-loop thread, so the
synchronous calls also work where an event loop is already running (Jupyter).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from refllm.errors import CacheCapacityError, ContextLengthError, InvalidInputError
from refllm.io.tokenizer import Tokenizer
from refllm.runtime.executor import DecodeInput, KvCacheHandle, ModelExecutor, PrefillInput
from refllm.runtime.llm import blocks_for, check_prompt
from refllm.runtime.sampling import Sampler, SamplingParams
from refllm.runtime.stream import TextStream


@dataclass(frozen=True)
class CompletionDelta:
    """What one step added to one of a request's completions."""

    index: int  # which of the request's n completions
    text: str  # new text, safe to show
    token_id: int | None  # the token sampled (a stop token included); None on a cancellation
    logprob: float | None = None  # of token_id under the model's raw distribution
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # when SamplingParams.logprobs asks
    finish_reason: str | None = None  # on the completion's last delta: "stop", "length", "cancelled" or "error"


@dataclass(frozen=True)
class Completion:
    index: int
    token_ids: list[int]  # generated, stop tokens excluded
    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class RequestResult:
    request_id: int
    prompt_token_ids: list[int]
    completions: list[Completion]


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


class EngineClosedError(InvalidInputError):
    """A call to an engine after ``close``."""


class _Request:
    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams):
        self.id = request_id
        self.prompt = prompt
        self.params = params
        self.sequences: list[_Sequence] = []
        self.deltas: queue.Queue[CompletionDelta | None] = queue.Queue()  # None ends the stream
        self.cancelled = False
        self.error: BaseException | None = None  # why the engine failed it, when it did
        self.done = threading.Event()

    def result(self) -> RequestResult:
        completions = [Completion(s.index, list(s.tokens), s.stream.text, s.finish_reason) for s in self.sequences]
        return RequestResult(self.id, list(self.prompt), completions)


class _Sequence:
    """One completion: its sampler, its text stream (which holds its generated tokens) and its cache."""

    def __init__(self, request: _Request, index: int, sampler: Sampler, stream: TextStream):
        self.request = request
        self.index = index
        self.sampler = sampler
        self.stream = stream
        self.handle: KvCacheHandle | None = None  # None while waiting
        self.finish_reason: str | None = None

    @property
    def tokens(self) -> list[int]:
        """Generated so far; the last one is fed at the next decode (the cache holds the ones before it)."""
        return self.stream.tokens

    @property
    def age(self) -> tuple[int, int]:
        """Smaller is older: requests in arrival order, a request's completions in index order."""
        return self.request.id, self.index


class RequestHandle:
    """A submitted request: iterate it for its deltas, ``result()`` for the whole, ``cancel()`` to stop it."""

    def __init__(self, engine: Engine, request: _Request):
        self._engine = engine
        self._request = request
        self._ended = False

    @property
    def request_id(self) -> int:
        return self._request.id

    @property
    def done(self) -> bool:
        return self._request.done.is_set()

    def __iter__(self) -> Iterator[CompletionDelta]:
        """Deltas as they come; without a background thread, waiting for one runs an engine step."""
        while not self._ended:
            try:
                delta = self._request.deltas.get_nowait()
            except queue.Empty:
                if self._engine.running_in_background:
                    delta = self._request.deltas.get()
                else:
                    self._engine.step()
                    continue
            if delta is None:
                self._ended = True
                if self._request.error is not None:
                    raise self._request.error
                return
            yield delta

    def result(self) -> RequestResult:
        """Wait for (or drive) the request to its end."""
        for _ in self:
            pass
        return self._request.result()

    def cancel(self) -> None:
        self._engine.cancel(self._request.id)


class Engine:
    """Continuous batching over a ModelExecutor (see the module docstring)."""

    def __init__(
        self, executor: ModelExecutor, tokenizer: Tokenizer | None = None, *, max_batch_size: int | None = None
    ):
        self.executor = executor
        self.tokenizer = tokenizer
        self.info = executor.info()
        self.capabilities = executor.capabilities()
        limit = self.capabilities.max_batch_size
        self.max_batch_size = limit if max_batch_size is None else max_batch_size
        if not 1 <= self.max_batch_size <= limit:
            raise InvalidInputError(f"max_batch_size must be in [1, {limit}], not {max_batch_size}")
        self.stats = EngineStats()
        # Waiting groups, each admitted as a whole: a new request's n sequences, or one preempted sequence.
        self._waiting: deque[list[_Sequence]] = deque()
        self._running: list[_Sequence] = []
        self._requests: dict[int, _Request] = {}  # live (unfinished) requests
        self._incoming: list[_Request] = []  # submitted since the last step; guarded by _submit_lock
        self._submit_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._wakeup = threading.Condition()
        self._request_ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="refllm-engine-loop", daemon=True).start()
        self._background: threading.Thread | None = None
        self._stopping = False
        self._closed = False

    # --- submitting ------------------------------------------------------------------------

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> RequestHandle:
        """Queue a request (thread-safe); it is checked first, so a bad one is refused and nothing is queued."""
        return self._enqueue(self._new_request(prompt, params))

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | None = None
    ) -> list[RequestResult]:
        """Every prompt through the engine together; results in the order of ``prompts``.

        All prompts are checked before any is queued, so one bad prompt refuses the whole call.
        """
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise InvalidInputError("generate takes a list of prompts (texts or token-id lists)")
        requests = [self._new_request(prompt, params) for prompt in prompts]
        handles = [self._enqueue(request) for request in requests]
        return [handle.result() for handle in handles]

    def cancel(self, request_id: int) -> None:
        """Stop a request now: its caches are released and its stream ends with finish_reason "cancelled"."""
        with self._submit_lock:
            request = self._requests.get(request_id)
            if request is None:
                return  # finished already (or never existed): nothing to stop
            request.cancelled = True
        with self._step_lock:
            self._drop_cancelled()

    # --- stepping ------------------------------------------------------------------------------

    def step(self) -> bool:
        """One scheduling step (see the module docstring); False when there was nothing to do.

        If the executor fails unexpectedly, every live request ends with
        finish_reason "error" (its handle raises the error) and so does this call.
        """
        with self._step_lock:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            try:
                return asyncio.run_coroutine_threadsafe(self._step(), self._loop).result()
            except Exception as error:
                self._fail_all(error)
                raise

    def run_until_done(self) -> None:
        while self.step():
            pass

    def has_work(self) -> bool:
        return bool(self._incoming or self._waiting or self._running)

    @property
    def running_in_background(self) -> bool:
        return self._background is not None

    def start(self) -> None:
        """Step on a background thread whenever there is work, until ``stop``."""
        if self._background is None:
            self._stopping = False
            self._background = threading.Thread(target=self._step_forever, name="refllm-engine", daemon=True)
            self._background.start()

    def stop(self) -> None:
        """Stop the background thread after its current step (requests stay queued)."""
        if self._background is not None:
            self._stopping = True
            with self._wakeup:
                self._wakeup.notify()
            self._background.join()
            self._background = None

    def close(self) -> None:
        """Stop stepping and end the engine's event-loop thread; the executor stays as it is."""
        self.stop()
        with self._step_lock:
            self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _step_forever(self) -> None:
        while not self._stopping:
            try:
                worked = self.step()
            except Exception:  # noqa: BLE001 (step() has handed the error to every live request)
                worked = True
            if not worked:
                with self._wakeup:
                    self._wakeup.wait_for(lambda: self._stopping or self.has_work(), timeout=1.0)

    async def _step(self) -> bool:
        with self._submit_lock:
            self._waiting.extend(request.sequences for request in self._incoming)
            self._incoming.clear()
        self._drop_cancelled()
        if not (self._waiting or self._running):
            return False
        self.stats.steps += 1
        await self._admit()
        await self._decode()
        return True

    # --- the scheduler ----------------------------------------------------------------------------

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
            self.stats.prefills += 1
            for seq, handle in zip(group, handles):
                seq.handle = handle
                self._running.append(seq)
                self._advance(seq, logits)

    async def _prefill(self, group: list[_Sequence]) -> tuple[list[KvCacheHandle], np.ndarray]:
        """The group's prompt (then a preempted sequence's tokens) -> a handle per sequence and the logits."""
        handles: list[KvCacheHandle] = []
        try:
            out = await self.executor.prefill(PrefillInput(group[0].request.prompt))
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
                    raise  # submit() checked that one sequence alone always fits
                self._preempt(max(batch, key=lambda s: s.age))
                continue
            self.stats.decode_batches += 1
            self.stats.decoded_tokens += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for seq, out in zip(batch, outputs):
                seq.handle = out.kv_cache
                self._advance(seq, out.logits)
            return

    def _advance(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Sample the next token from logits [V], stream it, and retire the sequence if it finished."""
        choice = seq.sampler(logits, seq.request.prompt, seq.tokens)
        step = seq.stream.feed(choice.token)
        seq.request.deltas.put(
            CompletionDelta(seq.index, step.text, choice.token, choice.logprob, choice.top_logprobs, step.finish_reason)
        )
        if step.finished:
            self._retire(seq, step.finish_reason)

    def _preempt(self, seq: _Sequence) -> None:
        self._release(seq)
        self._running.remove(seq)
        self._waiting.appendleft([seq])
        self.stats.preemptions += 1

    def _retire(self, seq: _Sequence, reason: str) -> None:
        self._release(seq)
        if seq in self._running:
            self._running.remove(seq)
        seq.finish_reason = reason
        request = seq.request
        if all(s.finish_reason is not None for s in request.sequences):
            with self._submit_lock:
                del self._requests[request.id]
            self.stats.finished_requests += not (request.cancelled or request.error)
            request.deltas.put(None)
            request.done.set()

    def _release(self, seq: _Sequence) -> None:
        if seq.handle is not None:
            self.executor.release_cache(seq.handle)
            seq.handle = None

    def _fail_all(self, error: Exception) -> None:
        """End every live request with finish_reason "error", releasing what it holds (step lock held)."""
        with self._submit_lock:
            failed = list(self._requests.values())
            self._incoming.clear()
        self._waiting.clear()
        for request in failed:
            request.error = error
            for seq in request.sequences:
                with contextlib.suppress(Exception):  # a failing executor may refuse even a release
                    self._release(seq)
                seq.handle = None
                self._end(seq, "error")

    def _drop_cancelled(self) -> None:
        """Retire every sequence of a cancelled request, wherever it is (call with the step lock held)."""
        with self._submit_lock:
            cancelled = [r for r in self._requests.values() if r.cancelled]
            self._incoming = [r for r in self._incoming if not r.cancelled]
        if not cancelled:
            return
        self._waiting = deque(g for g in self._waiting if not g[0].request.cancelled)
        for request in cancelled:
            self.stats.cancelled_requests += 1
            for seq in request.sequences:
                self._end(seq, "cancelled")

    def _end(self, seq: _Sequence, reason: str) -> None:
        """Retire an unfinished sequence from outside: a last, empty delta carries the reason."""
        if seq.finish_reason is None:
            seq.request.deltas.put(CompletionDelta(seq.index, "", None, finish_reason=reason))
            self._retire(seq, reason)

    # --- requests ----------------------------------------------------------------------------------------

    def _new_request(self, prompt: str | Sequence[int], params: SamplingParams | None) -> _Request:
        """A request with its n sequences, after every check; nothing is queued yet."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidInputError(f"params must be a SamplingParams; got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise InvalidInputError("stop strings need a tokenizer; this engine has none")
        if params.n > self.max_batch_size:
            raise InvalidInputError(
                f"n={params.n} completions exceed the engine's max_batch_size {self.max_batch_size}"
            )
        prompt_ids = check_prompt(self._encode(prompt), self.info.vocab_size).tolist()
        room = self.info.context_length - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within the context length"
                f" {self.info.context_length}"
            )
        self._check_fits(len(prompt_ids), min(params.max_tokens, room), params.n)
        request = _Request(next(self._request_ids), prompt_ids, params)
        stream_params = dataclasses.replace(params, max_tokens=min(params.max_tokens, room))
        seeds = np.random.SeedSequence(params.seed).spawn(params.n) if params.n > 1 else [params.seed]
        for index, seed in enumerate(seeds):
            stream = TextStream(self.tokenizer, stream_params, self.info.eos_token_ids)
            request.sequences.append(_Sequence(request, index, Sampler(params, np.random.default_rng(seed)), stream))
        return request

    def _enqueue(self, request: _Request) -> RequestHandle:
        if self._closed:
            raise EngineClosedError("the engine is closed")
        with self._submit_lock:
            self._incoming.append(request)
            self._requests[request.id] = request
        with self._wakeup:
            self._wakeup.notify()
        return RequestHandle(self, request)

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidInputError("a text prompt needs a tokenizer; this engine has none (pass token ids)")
            return self.tokenizer.encode(prompt)
        return prompt

    def _blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.capabilities.block_size)

    def _blocks_to_admit(self, group: list[_Sequence]) -> int:
        """Blocks the group's prefill takes, its first decode included; each fork copies the shared last block."""
        length = len(group[0].request.prompt) + len(group[0].tokens) + 1
        return self._blocks_for(length) + len(group) - 1

    def _check_fits(self, prompt_length: int, max_new: int, n: int) -> None:
        """Refuse a request the whole arena could never run, so preemption always ends."""
        longest = self._blocks_for(prompt_length + max_new)
        admission = self._blocks_for(prompt_length + 1) + n - 1
        total = self.capabilities.num_blocks
        if max(longest, admission) > total:
            raise CacheCapacityError(
                f"a request of {prompt_length} prompt tokens, up to {max_new} new tokens and n={n} needs"
                f" {max(longest, admission)} KV blocks; the arena has {total}"
            )
