"""refllm: a NumPy reference implementation of decoder-only LLM inference."""

from refllm.config import ModelConfig
from refllm.kv import CacheConfig
from refllm.loading import load_model
from refllm.models.contract import GenerativeModel, InMemorySource, ModelMetadata, ModelSource
from refllm.models.decoder import DecoderModel
from refllm.runtime.llm import LLM

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "GenerativeModel",
    "InMemorySource",
    "LLM",
    "DecoderModel",
    "ModelConfig",
    "ModelMetadata",
    "ModelSource",
    "load_model",
]
