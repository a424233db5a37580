"""Quantized weight formats: GGML's block layouts and their dequantization to float32."""

from refllm.quant.formats import FORMATS, BlockFormat, UnsupportedFormatError, block_format, dequantize

__all__ = ["FORMATS", "BlockFormat", "UnsupportedFormatError", "block_format", "dequantize"]
