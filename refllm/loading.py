"""The front door: ``refllm.load_model(path)`` picks the ModelSource and builds the model."""

from __future__ import annotations

from pathlib import Path

from refllm.errors import InvalidInputError
from refllm.models.contract import ModelSource
from refllm.models.llama import LlamaFamilyModel


class ModelNotFoundError(InvalidInputError):
    """A path or name that names no model refllm can open."""


def open_source(path: str | Path, quantized: bool = False) -> ModelSource:
    """A Hugging Face model directory or a .gguf file -> its ModelSource (``quantized``: see ``load_model``)."""
    path = Path(path).expanduser()
    if path.is_dir():
        from refllm.io.safetensors import HFDirectorySource

        return HFDirectorySource(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        from refllm.io.gguf import GGUFSource

        return GGUFSource(path, quantized=quantized)
    raise ModelNotFoundError(
        f"{path} is neither a model directory (config.json and safetensors weights) nor a .gguf file"
    )


def load_model(
    path_or_name: str | Path, quantized: bool = False, quantize: str | None = None
) -> LlamaFamilyModel:
    """Load a model from a catalog name (pulled on first use), a .gguf file or a Hugging Face directory.

    quantized: keep a GGUF file's quantized matrices in their blocks and multiply from them
    (docs/quantization.md); the default dequantizes every weight to float32, the spec path.
    quantize: "q8_0" or "q4_0" quantizes the float matrices of a checkpoint as it loads.
    """
    from refllm import catalog
    from refllm.quant.linear import RequantizedSource, requantize_format

    target = None if quantize is None else requantize_format(quantize)  # refuse a bad name before loading
    if isinstance(path_or_name, str) and path_or_name in catalog.CATALOG:
        path_or_name = catalog.pull(path_or_name)
    source = open_source(path_or_name, quantized=quantized)
    return LlamaFamilyModel.load(source if target is None else RequantizedSource(source, target))
