"""The bridge between HTTP requests and the Engine's threads.

A ``Generation`` is the engine requests behind one HTTP request (one per
prompt). Their handles block while they wait, so a small thread per handle
forwards its deltas to the event loop, and ``deltas()`` reads them there as
one async stream. Whatever ends the HTTP request (its answer sent, the client
gone, an error) cancels its requests, which frees their KV blocks at once;
for a finished request that does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from refllm.errors import CacheCapacityError, ContextLengthError, InvalidInputError
from refllm.runtime.engine import CompletionDelta, Engine, EngineClosedError, RequestHandle
from refllm.runtime.sampling import SamplingParams
from refllm.server import protocol
from refllm.server.protocol import RequestError

T = TypeVar("T")
Chunk = Callable[[int, CompletionDelta], "dict[str, Any] | None"]  # (choice, delta) -> a stream chunk's choice
_Item = tuple[int, "CompletionDelta | Exception | None"]  # (prompt index, a delta, the error that ended it, or the end)


class EngineFailure(Exception):
    """The engine failed while generating this request (its own failure: the other requests carry on).

    Every parameter is checked before the request is queued, so what fails later (the forward
    pass, logits with NaN) is a fault of the server, answered 500 with the cause.
    """


class Generation:
    """The engine requests of one HTTP request: submitted at once, read as one stream, cancelled together.

    Choices are numbered as OpenAI numbers them: ``prompt_index * n + completion_index``.
    """

    def __init__(
        self, engine: Engine, prompts: list[list[int]], params: SamplingParams, param: str, images: list = ()
    ):
        """Submit every prompt; a refusal (naming the request field ``param``) cancels those already queued.
        images: the pixel batches of a single prompt's images (a chat request's)."""
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.completion_tokens = 0  # tokens sampled so far, a stop token included
        self.started = time.perf_counter()
        self.first_token_at: float | None = None  # when the first token came, and the last
        self.last_token_at: float | None = None
        self.num_choices = len(prompts) * params.n
        self._n = params.n
        self._handles: list[RequestHandle] = []
        try:
            for prompt in prompts:
                self._handles.append(engine.submit(prompt, params, images))
        except (InvalidInputError, CacheCapacityError) as error:
            self.cancel_soon()
            raise refusal(error, param) from None

    async def deltas(self) -> AsyncIterator[tuple[int, CompletionDelta]]:
        """(choice, delta) as the engine makes them; endings the server caused (cancel, failure) are not deltas."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        for k, handle in enumerate(self._handles):
            threading.Thread(target=_forward, args=(handle, k, loop, queue), daemon=True).start()
        ended = 0
        while ended < len(self._handles):
            k, item = await queue.get()
            if item is None:
                ended += 1
            elif isinstance(item, Exception):
                raise EngineFailure(f"the engine failed on this request: {item}") from item
            elif item.finish_reason not in ("cancelled", "error"):
                if item.token_id is not None:
                    self.completion_tokens += 1
                    self.last_token_at = time.perf_counter()
                    self.first_token_at = self.first_token_at or self.last_token_at
                yield k * self._n + item.index, item

    def stats_line(self) -> str:
        """The request log's part: "prompt 37 tokens | generated 12 tokens, first after 0.25 s, 31.2 tokens/s"."""
        line = f"prompt {self.prompt_tokens} tokens | generated {self.completion_tokens} tokens"
        if self.first_token_at is None:
            return line
        later, seconds = self.completion_tokens - 1, self.last_token_at - self.first_token_at
        rate = f", {later / seconds:.1f} tokens/s" if later > 0 and seconds > 0 else ""
        return f"{line}, first after {self.first_token_at - self.started:.2f} s{rate}"

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}

    def cancel(self) -> None:
        """Stop every request still running and free its blocks (finished ones are left as they are)."""
        for handle in self._handles:
            handle.cancel()

    def cancel_soon(self) -> None:
        """``cancel`` on a worker thread: a cancel waits for the engine's current step, the event loop must not."""
        asyncio.get_running_loop().run_in_executor(None, self.cancel)


def _forward(handle: RequestHandle, k: int, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Item]) -> None:
    """On its own thread: a handle's deltas, then None (or the error that ended it), onto the event loop's queue."""

    def put(item: CompletionDelta | Exception | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (k, item))

    with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
        try:
            for delta in handle:
                put(delta)
        except Exception as error:  # noqa: BLE001 (handed to the reader, which reports it)
            put(error)
            return
        put(None)


def refusal(error: Exception, param: str) -> RequestError:
    """The engine's refusal of a submission -> the HTTP error that explains it."""
    if isinstance(error, EngineClosedError):
        return RequestError("the server is shutting down", status=503, type="server_error")
    if isinstance(error, ContextLengthError):
        return RequestError(str(error), param=param, code="context_length_exceeded")
    if isinstance(error, CacheCapacityError):  # the prompt, max_tokens and n together outgrow the KV arena
        return RequestError(str(error), param="max_tokens", code="context_length_exceeded")
    return RequestError(str(error), param=param)


async def events(
    generation: Generation,
    meta: dict[str, Any],
    chunk: Chunk,
    include_usage: bool,
    opening: Sequence[dict[str, Any]] = (),
) -> AsyncIterator[str]:
    """A stream's events: the opening chunk, a chunk per delta worth sending, the usage if asked, [DONE].

    Once the response has started, an engine failure can only end it with an error event.
    """
    if opening:
        yield protocol.sse(meta | {"choices": list(opening)})
    try:
        async for i, delta in generation.deltas():
            choice = chunk(i, delta)
            if choice:
                yield protocol.sse(meta | {"choices": [choice]})
    except EngineFailure as error:
        yield protocol.sse(RequestError(str(error), status=500, type="server_error").body())
        return
    if include_usage:
        yield protocol.sse(meta | {"choices": [], "usage": generation.usage()})
    yield protocol.sse("[DONE]")


class EventStream(StreamingResponse):
    """Server-sent events; the generation is cancelled however the response ends (done, disconnect, error)."""

    def __init__(self, events: AsyncIterator[str], generation: Generation):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.cancel_soon()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (then ClientDisconnect is raised)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()  # no-op once done
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnect()
    return task.result()


async def _disconnect(request: Request) -> None:
    """Return once the client has gone (its body has been read, so nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
