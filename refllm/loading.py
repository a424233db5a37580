"""The front door: ``refllm.load_model(path)`` picks the ModelSource and builds the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from refllm.errors import InvalidInputError
from refllm.models.contract import ModelSource
from refllm.models.decoder import DecoderModel, ModelDtypeError, dtype_name
from refllm.models.multimodal import VisionLanguageModel
from refllm.quant.formats import ACTIVATIONS


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
    activations: str = "float32",
) -> DecoderModel:
    """Load a model from a catalog name (pulled on first use), a .gguf file or a Hugging Face directory.

    dtype: "float32" (the default), or "float64": ground truth, every step in float64 (GGUF blocks
    dequantized in float64), run by the spec ops.
    reference: run the spec ops (the functions of ``refllm/nn``, plain NumPy) instead of their Numba
    twins; the default is False for float32, and float64 has only the spec ops (docs/reference.md).
    quantized: keep a GGUF file's quantized matrices in their blocks and multiply from them
    (docs/quantization.md); the default dequantizes every weight.
    quantize: "q8_0" or "q4_0" quantizes the float matrices of a checkpoint as it loads.
    activations: "float32" (the default), or "int8": quantized matrices of Q4_0, Q4_1 and Q8_0
    multiply activations quantized to 8 bits per block of 32, in integer dot products: faster on
    CPUs with VNNI, and further from the float64 truth (docs/quantization.md).
    """
    from refllm import catalog

    # Refuse what cannot run before anything is fetched or read.
    dtype = dtype_name(dtype)
    spec = dtype == "float64" if reference is None else reference
    if (quantized or quantize is not None) and (spec or dtype != "float32"):
        raise ModelDtypeError(
            "quantized weights run in the fast float32 kernels; drop quantized/quantize, or dtype/reference"
        )
    check_activations(activations, quantized or quantize is not None)
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
    return use_activations(build_model(source, dtype, reference), activations)


def build_model(source: ModelSource, dtype: str = "float32", reference: bool | None = None) -> DecoderModel:
    """The model a source describes: a VisionLanguageModel when it has an image half, else the text model."""
    multimodal = getattr(source, "multimodal", None)
    if multimodal is not None:
        return VisionLanguageModel.load(source, multimodal, dtype, reference)
    return DecoderModel.load(source, dtype=dtype, reference=reference)


def check_activations(activations: str, quantized: bool) -> None:
    """Refuse an ``activations`` setting the model cannot run, before anything is read."""
    if activations not in ACTIVATIONS:
        raise ModelDtypeError(f"activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}")
    if activations == "int8" and not quantized:
        raise ModelDtypeError("int8 activations multiply quantized weights; the weights here are dequantized")


def use_activations(model: DecoderModel, activations: str) -> DecoderModel:
    """The quantized matrices of ``model``'s layers multiply activations as ``activations`` says -> the model,
    its blocks built again (the compiled layers take the setting when they are built).

    The LM head keeps float32 activations: its product is the logits themselves, and on SmolLM2-135M
    int8 activations there as well took the KL divergence from float64 truth from 0.0028 to 0.0041
    (docs/quantization.md)."""
    from refllm.models.weights import weight_leaves

    for leaf in weight_leaves(model.weights.layers):
        if not isinstance(leaf, np.ndarray):  # a QuantizedTensor
            leaf.use_activations(activations)
    return model.with_ops(model.ops)
