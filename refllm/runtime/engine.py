"""Engine: continuous batching of many requests over one ModelExecutor.

    engine = Engine(LLMExecutor(LLM(model)), tokenizer)
    for delta in engine.submit("Once upon a time", SamplingParams(max_tokens=32)):
        print(delta.text, end="")                      # streams; the iterator drives the engine
    results = engine.generate(["a", "b"], params)      # notebooks: all at once, in order

Each ``step`` admits, decodes and retires sequences as ``refllm.runtime.scheduler``
describes; the request and result types live in ``refllm.runtime.requests``.

Threads: ``submit`` and ``cancel`` are safe from any thread. Steps run one at
a time under a lock, driven either by the caller (``step``,
``run_until_done``, iterating a handle, ``generate``) or by a background
thread (``start``/``stop``), as a server sharing one engine would use it. The
executor's coroutines run on the engine's own event-loop thread, so the
synchronous calls also work where an event loop is already running (Jupyter).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from refllm.errors import ContextLengthError, InvalidInputError
from refllm.io.tokenizer import Tokenizer
from refllm.runtime.checks import check_prompt
from refllm.runtime.image_prompts import checked_images
from refllm.runtime.executor import ModelExecutor
from refllm.runtime.requests import Completion, CompletionDelta, CompletionSequence, Request, RequestResult
from refllm.runtime.sampling import Sampler, SamplingParams
from refllm.runtime.scheduler import EngineStats, Scheduler
from refllm.runtime.stream import TextStream

__all__ = [
    "Completion",
    "CompletionDelta",
    "Engine",
    "EngineClosedError",
    "EngineStats",
    "RequestHandle",
    "RequestResult",
]


class EngineClosedError(InvalidInputError):
    """A call to an engine after ``close``."""


class RequestHandle:
    """A submitted request: iterate it for its deltas, ``result()`` for the whole, ``cancel()`` to stop it."""

    def __init__(self, engine: Engine, request: Request):
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
        self._scheduler = Scheduler(executor, self.capabilities, self.max_batch_size)
        self.stats = self._scheduler.stats
        self._step_lock = threading.Lock()
        self._wakeup = threading.Condition()
        self._request_ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="refllm-engine-loop", daemon=True).start()
        self._background: threading.Thread | None = None
        self._stopping = False
        self._closed = False

    # --- submitting ------------------------------------------------------------------------

    def submit(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, images: Sequence[np.ndarray] = ()
    ) -> RequestHandle:
        """Queue a request (thread-safe); it is checked first, so a bad one is refused and nothing is queued.

        images: a vision-language model's pixel batches, one per image in the prompt, in order
        (``refllm.io.image_processing``)."""
        return self._enqueue(self._new_request(prompt, params, images))

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
        if not self._scheduler.mark_cancelled(request_id):
            return  # finished already (or never existed): nothing to stop
        with self._step_lock:
            self._scheduler.drop_cancelled()

    # --- stepping ------------------------------------------------------------------------------

    def step(self) -> bool:
        """One scheduling step (see the module docstring); False when there was nothing to do.

        A failure of one request's prefill, decode or sampling ends that request alone
        with finish_reason "error" (its handle raises the error; ``Scheduler`` says how
        a failed batch is sorted out). Any other failure of the step ends every live
        request that way, and this call raises it.
        """
        with self._step_lock:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            try:
                return asyncio.run_coroutine_threadsafe(self._scheduler.step(), self._loop).result()
            except Exception as error:
                self._scheduler.fail_all(error)
                raise

    def run_until_done(self) -> None:
        while self.step():
            pass

    def has_work(self) -> bool:
        return self._scheduler.has_work()

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

    # --- requests ----------------------------------------------------------------------------------------

    def _new_request(
        self, prompt: str | Sequence[int], params: SamplingParams | None, images: Sequence[np.ndarray] = ()
    ) -> Request:
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
        params.check_vocabulary(self.info.vocab_size)
        prompt_ids = check_prompt(self._encode(prompt), self.info.vocab_size).tolist()
        room = self.info.context_length - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within the context length"
                f" {self.info.context_length}"
            )
        images = tuple(checked_images(self.info.vision, prompt_ids, images))
        self._scheduler.check_fits(len(prompt_ids), min(params.max_tokens, room), params.n)
        request = Request(next(self._request_ids), prompt_ids, params, images)
        stream_params = dataclasses.replace(params, max_tokens=min(params.max_tokens, room))
        seeds = np.random.SeedSequence(params.seed).spawn(params.n) if params.n > 1 else [params.seed]
        for index, seed in enumerate(seeds):
            stream = TextStream(self.tokenizer, stream_params, self.info.eos_token_ids)
            sampler = Sampler(params, np.random.default_rng(seed))
            request.sequences.append(CompletionSequence(request, index, sampler, stream))
        return request

    def _enqueue(self, request: Request) -> RequestHandle:
        if self._closed:
            raise EngineClosedError("the engine is closed")
        self._scheduler.add(request)
        with self._wakeup:
            self._wakeup.notify()
        return RequestHandle(self, request)

    def _encode(self, prompt: str | Sequence[int]) -> Sequence[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidInputError("a text prompt needs a tokenizer; this engine has none (pass token ids)")
            return self.tokenizer.encode(prompt)
        return prompt
