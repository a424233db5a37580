"""Streaming one answer to stdout, and the stats line the peers print after it (on stderr).

prompt 9 tokens, 210.4 tokens/s | generated 20 tokens, 31.7 tokens/s | stopped: token limit (--max-tokens 20)
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from refllm.commands.common import switch_note, write
from refllm.runtime.engine import Engine
from refllm.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class AnswerStats:
    prompt_tokens: int
    generated_tokens: int  # a stop token included, as llama.cpp counts
    prefill_seconds: float  # from submitting the prompt to the first token: the prefill and one sampling step
    decode_seconds: float  # from the first token to the last
    stopped: str  # why generation ended, in words

    def line(self) -> str:
        prompt_rate = self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0
        later = self.generated_tokens - 1  # the first token came out of the prefill
        decode_rate = later / self.decode_seconds if later > 0 and self.decode_seconds else 0.0
        return (
            f"prompt {self.prompt_tokens} tokens, {prompt_rate:.1f} tokens/s"
            f" | generated {self.generated_tokens} tokens, {decode_rate:.1f} tokens/s"
            f" | stopped: {self.stopped}"
        )


def stream_answer(
    engine: Engine,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    echo: str = "",
    ctrl_c_stops: bool = False,
    images=(),
) -> tuple[str, AnswerStats]:
    """Write the answer to stdout as it comes -> (the text shown, its stats).

    ``echo``: text written before the answer (the prompt ``generate`` continues), with its first piece:
    a prompt too long for the context is refused before anything is shown, and a long prompt's progress
    bar has its own line.
    ``ctrl_c_stops``: Ctrl-C ends this answer cleanly (between engine steps) instead of raising.
    ``images``: the prompt's pixel batches, for a vision-language model.
    """
    start = time.perf_counter()
    handle = engine.submit(prompt_ids, params, images)
    parts, tokens, first, last, reason = [], [], start, start, "cancelled"
    with _ctrl_c_sets_flag() if ctrl_c_stops else contextlib.nullcontext(threading.Event()) as interrupted:
        for delta in handle:
            write(echo + delta.text)
            echo = ""
            parts.append(delta.text)
            if delta.token_id is not None:
                first = first if tokens else time.perf_counter()
                last = time.perf_counter()
                tokens.append(delta.token_id)
            reason = delta.finish_reason or reason
            if interrupted.is_set():
                handle.cancel()
                break
    write(echo + "\n")
    note = switch_note(engine)
    if note:
        print(note, file=sys.stderr)
    stopped = _stop_reason(reason, tokens, params, engine.info.eos_token_ids, engine.info.context_length)
    return "".join(parts), AnswerStats(len(prompt_ids), len(tokens), first - start, last - first, stopped)


def _stop_reason(reason: str, tokens: list[int], params: SamplingParams, eos: tuple[int, ...], context: int) -> str:
    if reason == "stop":
        return "end of text (EOS)" if tokens and tokens[-1] in (*eos, *params.stop_token_ids) else "stop string"
    if reason == "length":
        if len(tokens) >= params.max_tokens:
            return f"token limit (--max-tokens {params.max_tokens})"
        return f"context full ({context} tokens)"
    return "interrupted"


@contextlib.contextmanager
def _ctrl_c_sets_flag() -> Iterator[threading.Event]:
    """While inside, Ctrl-C sets the yielded flag instead of raising KeyboardInterrupt.

    The engine then finishes its step and the reply is cancelled cleanly, between steps.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
