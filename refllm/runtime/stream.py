"""Turning one request's tokens into text safely, as they arrive.

Two things make streaming tricky: a character can be split across tokens (the
incremental detokenizer never emits half of one), and a stop string can span
tokens. ``TextStream`` holds back the shortest tail that could still be the
start of a stop string, so a stop string is caught whole and never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refllm.io.tokenizer import IncrementalDetokenizer, Tokenizer
from refllm.runtime.sampling import SamplingParams


@dataclass
class StreamStep:
    text: str  # new text safe to show
    finished: bool = False
    finish_reason: str | None = None  # "stop" (EOS, stop token or stop string) or "length"


@dataclass
class TextStream:
    """Feed generated token ids one by one; get back text deltas and when to stop."""

    tokenizer: Tokenizer | None
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    context: tuple[int, ...] = ()  # prompt ids: decoding continues after them (keeps a leading space)
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # everything emitted so far
    _held: str = ""
    _detokenizer: IncrementalDetokenizer | None = None

    def __post_init__(self) -> None:
        if self.tokenizer is not None:
            self._detokenizer = IncrementalDetokenizer(
                self.tokenizer, skip_special_tokens=True, context=self.context[-8:]
            )

    def feed(self, token: int) -> StreamStep:
        stops = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            stops |= set(self.eos_token_ids)
        if token in stops:
            return self._finish("stop", self._flush_detokenizer())
        self.tokens.append(token)
        pending = self._held + (self._detokenizer.add(token) if self._detokenizer else "")
        for stop in self.params.stop:
            at = pending.find(stop)
            if at >= 0:
                self._held = ""
                return self._finish("stop", pending[:at])
        keep = _longest_stop_prefix_suffix(pending, self.params.stop)
        emit, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        if len(self.tokens) >= self.params.max_tokens:
            return self._finish("length", emit + self._held + self._flush_detokenizer())
        self.text += emit
        return StreamStep(emit)

    def _flush_detokenizer(self) -> str:
        return self._held + (self._detokenizer.flush() if self._detokenizer else "")

    def _finish(self, reason: str, text: str) -> StreamStep:
        self._held = ""
        self.text += text
        return StreamStep(text, finished=True, finish_reason=reason)


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
