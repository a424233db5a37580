"""The runtime: cache-id keyed model calls, executors, the batching engine, sampling and speculative decoding."""

from refllm.runtime.configurable_executor import ConfigurableModelExecutor
from refllm.runtime.engine import Completion, CompletionDelta, Engine, EngineStats, RequestHandle, RequestResult
from refllm.runtime.executor import (
    DecodeInput,
    DecodeOutput,
    ExecutorCapabilities,
    ExecutorStatus,
    KvCacheHandle,
    LLMExecutor,
    ModelExecutor,
    ModelInfo,
    PrefillInput,
    PrefillOutput,
    VerifyOutput,
)
from refllm.runtime.llm import LLM, LLMConfig
from refllm.runtime.sampling import Sampler, SamplingParams
from refllm.runtime.speculative import DraftModelDrafter, PromptLookupDrafter, SpeculativeResult, speculative_generate

__all__ = [
    "LLM",
    "Completion",
    "CompletionDelta",
    "ConfigurableModelExecutor",
    "DecodeInput",
    "DecodeOutput",
    "DraftModelDrafter",
    "Engine",
    "EngineStats",
    "ExecutorCapabilities",
    "ExecutorStatus",
    "KvCacheHandle",
    "LLMConfig",
    "LLMExecutor",
    "ModelExecutor",
    "ModelInfo",
    "PrefillInput",
    "PrefillOutput",
    "PromptLookupDrafter",
    "RequestHandle",
    "RequestResult",
    "Sampler",
    "SamplingParams",
    "SpeculativeResult",
    "VerifyOutput",
    "speculative_generate",
]
