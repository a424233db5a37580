"""A request as its caller sees it (deltas, completions, the result) and as the engine keeps it.

A request asks for n completions of one prompt; the engine runs each as a
``CompletionSequence`` with its own sampler, text stream and cache, and
streams what every step adds as ``CompletionDelta``s on the request's queue.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from refllm.runtime.executor import KvCacheHandle
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


class Request:
    """A submitted request: its prompt, its n sequences, and the queue its deltas go to."""

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams, images: tuple = ()):
        self.id = request_id
        self.prompt = prompt
        self.images = images  # a vision-language model's pixel batches, one per image in the prompt
        self.params = params
        self.sequences: list[CompletionSequence] = []
        self.deltas: queue.Queue[CompletionDelta | None] = queue.Queue()  # None ends the stream
        self.cancelled = False
        self.error: BaseException | None = None  # why the engine failed it, when it did
        self.done = threading.Event()

    def result(self) -> RequestResult:
        completions = [Completion(s.index, list(s.tokens), s.stream.text, s.finish_reason) for s in self.sequences]
        return RequestResult(self.id, list(self.prompt), completions)


class CompletionSequence:
    """One completion: its sampler, its text stream (which holds its generated tokens) and its cache."""

    def __init__(self, request: Request, index: int, sampler: Sampler, stream: TextStream):
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
