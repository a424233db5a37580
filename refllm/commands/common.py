"""Opening, checking and loading a model for a command, with progress, and the engine a command streams from."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from refllm import catalog, progress
from refllm.errors import InvalidInputError
from refllm.families import checkpoint_layout
from refllm.kv import CacheConfig
from refllm.kv.base import blocks_for
from refllm.loading import build_model, open_source
from refllm.memory import available_memory, weight_bytes
from refllm.models.contract import ModelSource
from refllm.models.connector import connector_shapes
from refllm.models.decoder import DecoderModel
from refllm.models.vision_tower import vision_tower_shapes
from refllm.models.weights import checkpoint_shapes
from refllm.quant.linear import QuantizedTensor
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM


def open_model(name: str, quantized: bool = False, *, chat: bool = False, dtype: str = "float32") -> ModelSource:
    """A catalog name (pulled on first use), a .gguf file or a Hugging Face directory -> its ModelSource.

    ``quantized``: a GGUF file's matrices stay in their blocks where a quantized kernel reads them.
    ``dtype``: what a GGUF file's blocks are dequantized to (float32, or float64 for ground truth).
    ``chat``: a catalog model known to have no chat template is refused before it is downloaded.
    """
    if name in catalog.CATALOG:
        if chat and not catalog.CATALOG[name].chat:
            raise _no_chat_template(name)
        return open_source(catalog.pull(name), quantized=quantized, dtype=dtype)
    path = Path(name).expanduser()
    if not path.exists():
        if path.suffix.lower() == ".gguf" or len(path.parts) > 1:
            raise InvalidInputError(f"{name}: no such file or directory")
        raise InvalidInputError(
            f"{name} is neither a catalog model ({', '.join(catalog.CATALOG)}) nor an existing file or directory"
        )
    return open_source(path, quantized=quantized, dtype=dtype)


def load(
    name: str,
    *,
    text: bool = True,
    chat: bool = False,
    quantized: bool = False,
    dtype: str = "float32",
    reference: bool | None = None,
    context: int | None = None,
    context_flag: str = "--context",
    images: bool = False,
) -> DecoderModel:
    """Open the model, refuse what cannot work (before the slow part), then load its weights with progress.

    ``dtype`` and ``reference``: as ``refllm.load_model`` takes them (docs/reference.md).
    ``images``: the command has images for the model, which must then be a vision-language model.

    ``context``: the tokens the command will hold at once (given by ``context_flag``), refused if past the model's.
    """
    source = open_checked(
        name, text=text, chat=chat, quantized=quantized, dtype=dtype, context=context, context_flag=context_flag
    )
    if images and getattr(source, "multimodal", None) is None:
        raise InvalidInputError(
            f"{name} reads text only; images need a vision-language model (SmolVLM, Gemma 3 with vision)"
        )
    needed, available = weight_bytes(source, quantized, dtype), available_memory()
    if available is not None and needed > available:
        raise InvalidInputError(
            f"{name} needs about {size(needed)} for its weights, more than the {size(available)} of memory available"
        )
    with progress.task(f"loading {name}", total=tensor_count(source), unit="tensor") as bar:
        return build_model(_CountingSource(source, bar.update), dtype, reference)


def tensor_count(source: ModelSource) -> int:
    """Tensors loading the source reads: the text model's, and a vision-language model's tower and connector."""
    multimodal = getattr(source, "multimodal", None)
    image_half = 0 if multimodal is None else len(vision_tower_shapes(multimodal.vision)) + len(connector_shapes(multimodal))
    return len(checkpoint_shapes(source.config, checkpoint_layout(source.config, source.tensor_names()))) + image_half


def open_checked(
    name: str,
    *,
    text: bool = True,
    chat: bool = False,
    quantized: bool = False,
    dtype: str = "float32",
    context: int | None = None,
    context_flag: str = "--context",
) -> ModelSource:
    """``load``'s checks, without loading the weights: the source, with its tokenizer and config."""
    source = open_model(name, quantized, chat=chat, dtype=dtype)
    if text and source.tokenizer is None:
        raise InvalidInputError(f"{name} has no tokenizer, so it cannot read or write text")
    if chat and source.tokenizer.chat_template is None:
        raise _no_chat_template(name)
    if context is not None and context > source.config.context_length:
        raise InvalidInputError(
            f"{context_flag} {context} is longer than {name}'s context of {source.config.context_length} tokens"
        )
    return source


def _no_chat_template(name: str) -> InvalidInputError:
    return InvalidInputError(
        f"{name} has no chat template, so it cannot chat; `refllm generate` continues plain text with it"
    )


def warm_llm(model: DecoderModel, context: int | None = None) -> LLM:
    """An LLM over the model, its kernels compiled (with a notice) or loaded from the cache before any request.

    ``context`` caps the tokens of a sequence, and sizes the KV arena for one such sequence.
    """
    cache = CacheConfig() if context is None else CacheConfig(num_blocks=blocks_for(context, CacheConfig.block_size))
    llm = LLM(model, cache, context_length=context)
    with progress.compiling_kernels():
        llm.warm_up()
    return llm


def start_engine(model: DecoderModel, context: int | None = None) -> Engine:
    """An engine for one user at a time, stepped by its caller; see ``warm_llm``."""
    return Engine(LLMExecutor(warm_llm(model, context), offload=False), model.tokenizer)


class _CountingSource:
    """A ModelSource that calls ``advance`` after every tensor it reads (a progress bar's ``update``)."""

    def __init__(self, source: ModelSource, advance):
        self.source, self.advance = source, advance
        self.config, self.tokenizer = source.config, source.tokenizer
        self.multimodal = getattr(source, "multimodal", None)  # a vision-language model's image half
        self.image_processor = getattr(source, "image_processor", None)

    def tensor_names(self) -> list[str]:
        return self.source.tensor_names()

    def tensor(self, name: str) -> np.ndarray | QuantizedTensor:
        array = self.source.tensor(name)
        self.advance()
        return array

    def where(self, name: str | None) -> str:
        return self.source.where(name)


def size(num_bytes: float) -> str:
    """1536 -> "1.5 KiB"."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while num_bytes >= 1024 and power < len(units) - 1:
        num_bytes, power = num_bytes / 1024, power + 1
    return f"{num_bytes:.0f} B" if power == 0 else f"{num_bytes:.1f} {units[power]}"


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
