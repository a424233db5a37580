"""The front door: ``refllm.load_model(path)`` picks the ModelSource and builds the model."""

from __future__ import annotations

from pathlib import Path

from refllm.errors import InvalidInputError
from refllm.models.contract import ModelSource
from refllm.models.decoder import DecoderModel, ModelDtypeError, dtype_name
from refllm.models.multimodal import VisionLanguageModel


class ModelNotFoundError(InvalidInputError):
    """A path or name that names no model refllm can open."""


def open_source(path: str | Path, quantized: bool = False, dtype: str = "float32") -> ModelSource:
    """A Hugging Face model directory or a .gguf file -> its ModelSource (``quantized``, ``dtype``: see
    ``load_model``; a GGUF file dequantizes its blocks in ``dtype``)."""
    path = Path(path).expanduser()
    if path.is_dir():
        from refllm.io.safetensors import HFDirectorySource

        return HFDirectorySource(path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        from refllm.io.gguf import GGUFSource

        return GGUFSource(path, quantized=quantized, dtype=dtype)
    raise ModelNotFoundError(
        f"{path} is neither a model directory (config.json and safetensors weights) nor a .gguf file"
    )


def load_model(
    path_or_name: str | Path,
    quantized: bool = False,
    quantize: str | None = None,
    dtype: str = "float32",
    reference: bool | None = None,
) -> DecoderModel:
    """Load a model from a catalog name (pulled on first use), a .gguf file or a Hugging Face directory.

    dtype: "float32" (the default), or "float64": ground truth, every step in float64 (GGUF blocks
    dequantized in float64), run by the spec ops.
    reference: run the spec ops (the functions of ``refllm/nn``, plain NumPy) instead of their Numba
    twins; the default is False for float32, and float64 has only the spec ops (docs/reference.md).
    quantized: keep a GGUF file's quantized matrices in their blocks and multiply from them
    (docs/quantization.md); the default dequantizes every weight.
    quantize: "q8_0" or "q4_0" quantizes the float matrices of a checkpoint as it loads.
    """
    from refllm import catalog

    # Refuse what cannot run before anything is fetched or read.
    dtype = dtype_name(dtype)
    spec = dtype == "float64" if reference is None else reference
    if (quantized or quantize is not None) and (spec or dtype != "float32"):
        raise ModelDtypeError(
            "quantized weights run in the fast float32 kernels; drop quantized/quantize, or dtype/reference"
        )
    target = None
    if quantize is not None:
        from refllm.quant.linear import RequantizedSource, requantize_format

        target = requantize_format(quantize)
    if isinstance(path_or_name, str) and path_or_name in catalog.CATALOG:
        path_or_name = catalog.pull(path_or_name)
    source = open_source(path_or_name, quantized=quantized, dtype=dtype)
    if target is not None:
        if getattr(source, "multimodal", None) is not None:
            raise ModelDtypeError("a vision-language model loads in float32 or float64; drop quantize")
        source = RequantizedSource(source, target)
    return build_model(source, dtype, reference)


def build_model(source: ModelSource, dtype: str = "float32", reference: bool | None = None) -> DecoderModel:
    """The model a source describes: a VisionLanguageModel when it has an image half, else the text model."""
    multimodal = getattr(source, "multimodal", None)
    if multimodal is not None:
        return VisionLanguageModel.load(source, multimodal, dtype, reference)
    return DecoderModel.load(source, dtype=dtype, reference=reference)
