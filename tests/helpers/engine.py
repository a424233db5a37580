"""Driving the engine in tests: a cycle of scripted tokens, executors that fail on purpose, and the checks
that every request ended and every block came back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refllm.runtime.engine import Engine
from refllm.runtime.executor import DecodeInput, DecodeOutput, LLMExecutor, PrefillInput, PrefillOutput
from refllm.runtime.llm import LLM

CYCLE = [3, 5, 7, 11]  # the tokens a scripted executor's sequences produce, in turn
CULPRIT = [9, 9, 9]  # the prompt whose sequences a faulty executor breaks


def assert_all_free(engine: Engine) -> None:
    """No request left, no cache alive, every block of the arena free."""
    status = engine.executor.status()
    assert status.live_caches == 0 and status.blocks_free == status.blocks_total
    assert not engine.has_work()


def greedy_reference(llm: LLM, prompt: list[int], max_tokens: int) -> list[int]:
    """The greedy tokens of ``prompt`` run alone through ``llm``, up to ``max_tokens`` or its context."""
    logits, tokens = llm.prefill("ref", prompt), []
    while True:
        tokens.append(int(np.argmax(logits)))
        if len(tokens) == max_tokens or len(prompt) + len(tokens) >= llm.config.context_length:
            llm.release("ref")
            return tokens
        logits = llm.decode("ref", tokens[-1], len(prompt) + len(tokens) - 1)


class ScriptFailure(ValueError):
    pass


def failing_script(prompt, fed):
    """A scripted executor's logits that raise ``ScriptFailure`` at a sequence's fourth step."""
    if len(fed) == 3:
        raise ScriptFailure("the executor broke")
    return np.zeros(16, np.float32)


class InjectedFailure(RuntimeError):
    pass


class FaultyExecutor(LLMExecutor):
    """An LLMExecutor whose decodes go wrong for the sequences of one prompt once they hold ``after`` tokens:
    ``fault="raise"`` fails the whole batch_decode that holds one, ``fault="nan"`` gives its row NaN logits."""

    def __init__(self, llm: LLM, culprit: Sequence[int], fault: str, after: int):
        super().__init__(llm, offload=False)
        self.culprit, self.fault, self.after = list(culprit), fault, after
        self.culprit_caches: set = set()

    async def prefill(self, request: PrefillInput) -> PrefillOutput:
        out = await super().prefill(request)
        if request.kv_cache is None and list(request.input_ids) == self.culprit:
            self.culprit_caches.add(out.kv_cache.cache_id)
        return out

    async def batch_decode(self, requests: Sequence[DecodeInput]) -> list[DecodeOutput]:
        hit = [
            i for i, r in enumerate(requests)
            if r.kv_cache.cache_id in self.culprit_caches and r.kv_cache.num_tokens >= self.after
        ]  # fmt: skip
        if hit and self.fault == "raise":
            raise InjectedFailure("the forward pass broke on the culprit's row")
        outputs = await super().batch_decode(requests)
        for i in hit:
            outputs[i] = DecodeOutput(np.full_like(outputs[i].logits, np.nan), outputs[i].kv_cache)
        return outputs
