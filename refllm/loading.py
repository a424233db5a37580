"""The front door: ``refllm.load_model(path)`` picks the ModelSource and builds the model."""

from __future__ import annotations

from pathlib import Path

from refllm.errors import InvalidInputError
from refllm.models.contract import ModelSource
from refllm.models.llama import LlamaFamilyModel


class ModelNotFoundError(InvalidInputError):
    """A path or name that names no model refllm can open."""


def open_source(path: str | Path) -> ModelSource:
    """A Hugging Face model directory or a .gguf file -> its ModelSource."""
    path = Path(path).expanduser()
    if path.is_dir():
        from refllm.io.safetensors import HFDirectorySource

        return HFDirectorySource(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        from refllm.io.gguf import GGUFSource

        return GGUFSource(path)
    raise ModelNotFoundError(
        f"{path} is neither a model directory (config.json and safetensors weights) nor a .gguf file"
    )


def load_model(path_or_name: str | Path) -> LlamaFamilyModel:
    """Load a model from a catalog name (pulled on first use), a .gguf file or a Hugging Face directory."""
    from refllm import catalog

    if isinstance(path_or_name, str) and path_or_name in catalog.CATALOG:
        return LlamaFamilyModel.load(open_source(catalog.pull(path_or_name)))
    return LlamaFamilyModel.load(open_source(path_or_name))
