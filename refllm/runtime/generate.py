"""Generate text for one prompt: the command line's entry point, through the same Engine as everything else."""

from __future__ import annotations

from collections.abc import Iterator

from refllm.models.llama import LlamaFamilyModel
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from refllm.runtime.stream import StreamStep


def generate_stream(model: LlamaFamilyModel, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamStep]:
    """Yield text deltas as tokens are generated; the last step says why generation finished."""
    engine = Engine(LLMExecutor(LLM(model), offload=False), model.tokenizer)
    try:
        for delta in engine.submit(prompt_ids, params):
            yield StreamStep(delta.text, delta.finish_reason is not None, delta.finish_reason)
    finally:
        engine.close()
