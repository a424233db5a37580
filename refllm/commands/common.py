"""Opening, checking and loading a model for a command, with progress, and the engine a command streams from."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from refllm import catalog, progress
from refllm.commands import warm_start
from refllm.commands.parsing import closest
from refllm.errors import InvalidInputError
from refllm.families import checkpoint_layout
from refllm.kv import CacheConfig
from refllm.kv.base import blocks_for
from refllm.loading import build_model, check_activations, open_source, use_activations
from refllm.memory import available_memory, weight_bytes
from refllm.models.contract import ModelSource
from refllm.models.connector import connector_shapes
from refllm.models.decoder import DecoderModel
from refllm.models.vision_tower import vision_tower_shapes
from refllm.models.weights import checkpoint_shapes, weight_leaves
from refllm.quant.linear import QuantizedTensor
from refllm.runtime.engine import Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM, PREFILL_CHUNK


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
            + closest(name, catalog.CATALOG)
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
    activations: str = "float32",
    context: int | None = None,
    context_flag: str = "--context",
    images: bool = False,
) -> DecoderModel:
    """Open the model, refuse what cannot work (before the slow part), then load its weights with progress.

    ``dtype``, ``reference`` and ``activations``: as ``refllm.load_model`` takes them (docs/reference.md).
    ``images``: the command has images for the model, which must then be a vision-language model.

    ``context``: the tokens the command will hold at once (given by ``context_flag``), refused if past the model's.
    """
    check_activations(activations, quantized)
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
        model = build_model(_CountingSource(source, bar.update), dtype, reference)
    return use_activations(model, activations)


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


def warm_llm(model: DecoderModel, context: int | None = None, *, name: str | None = None, on_switch=None) -> LLM:
    """An LLM over the model, its kernels loaded from Numba's cache, or compiled now (with a notice), before
    any request. The spec ops compile nothing, and their arena writes in NumPy.

    ``name``: the model as the command names it. With it, kernels not in the cache yet compile in another
    process while the LLM answers on the spec ops, moving to them when ready (``warm_start``);
    ``on_switch()`` is called then (``switch_note`` tells it too). REFLLM_COMPILE=foreground in the
    environment waits for the compile instead, as every run did before.
    ``context`` caps the tokens of a sequence, and sizes the KV arena for one such sequence.
    """
    cache = CacheConfig() if context is None else CacheConfig(num_blocks=blocks_for(context, CacheConfig.block_size))
    llm = LLM(model, cache, context_length=context)
    if model.ops.name == "spec":  # nothing to compile, so nothing to warm up
        llm.arena.use_kernels = False
        return llm
    background = name is not None and os.environ.get("REFLLM_COMPILE") != "foreground"
    if background and warm_start.kernels_cached(llm):
        return llm
    if background and warm_start.spec_twin_fits(model):
        twin = warm_start.SpecUntilKernels(warm_start.spec_twin(model), model, on_switch)
        warm_start.start_compiling(name, has_quantized_weights(model))
        print(warm_start.NOTICE, file=sys.stderr)
        llm = LLM(twin, cache, context_length=context)  # no warm-up: the spec ops compile nothing
        warm_start.watch(twin, model, lambda line: print(line, file=sys.stderr))
        return llm
    with progress.compiling_kernels():
        llm.warm_up()
    return llm


def start_engine(model: DecoderModel, context: int | None = None, name: str | None = None) -> Engine:
    """An engine for one user at a time, stepped by its caller, that shows a long prompt's progress;
    see ``warm_llm``."""
    llm = warm_llm(model, context, name=name)
    llm.prefill_progress = progress.PromptProgress(PREFILL_CHUNK)
    return Engine(LLMExecutor(llm, offload=False), model.tokenizer)


def switch_note(engine: Engine) -> str | None:
    """The line that says the engine's model moved to the kernels, once, after the answer it happened in."""
    model = engine.executor.llm.model
    if isinstance(model, warm_start.SpecUntilKernels) and model.switched and not model.announced:
        model.announced = True
        return warm_start.SWITCHED
    return None


def has_quantized_weights(model: DecoderModel) -> bool:
    """Whether any of the model's matrices is kept in quantized blocks."""
    return any(isinstance(array, QuantizedTensor) for array in weight_leaves(model.weights))


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
