"""Generate text for one prompt with the model directly: prefill, then decode until a stop."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from refllm.runtime.sampling import Sampler, SamplingParams
from refllm.runtime.stream import StreamStep, TextStream


def generate_stream(model, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamStep]:
    """Yield text deltas as tokens are generated; the last step says why generation finished."""
    cache = model.create_kv_cache()
    sampler = Sampler(params)
    eos = model.tokenizer.eos_token_ids if model.tokenizer is not None else model.config.eos_token_ids
    stream = TextStream(model.tokenizer, params, tuple(eos), context=tuple(prompt_ids))
    logits = model.prefill(np.array([prompt_ids]), cache, range(len(prompt_ids)))[0]
    output: list[int] = []
    while True:
        choice = sampler(logits, prompt_ids, output)
        step = stream.feed(choice.token)
        if not step.finished and len(prompt_ids) + len(output) + 1 >= model.config.context_length:
            step = StreamStep(step.text, finished=True, finish_reason="length")
        yield step
        if step.finished:
            return
        output.append(choice.token)
        logits = model.decode(np.array([[choice.token]]), cache)[0]
