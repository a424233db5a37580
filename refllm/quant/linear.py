"""QuantizedTensor: a weight matrix that stays in its GGML blocks and multiplies from them.

The spec's projection is ``linear(x, W, b) = x @ W.T + b`` (``refllm/nn/linear.py``)
and its embedding lookup is ``table[ids]`` (``refllm/nn/embedding.py``). A
QuantizedTensor answers both without ever being dequantized whole:

- ``W.matmul(x)`` is ``x @ W.T`` in the Numba kernels of
  ``refllm/kernels/quant_matmul.py``; the fast op set's ``linear``
  (``refllm/kernels/dense_matmul.py``) calls it. This is the one place where
  the quantized path branches off the spec, whose ``linear`` takes a
  dequantized matrix.
- ``W[ids]`` (an integer array) dequantizes just those rows with the spec
  dequantizer: an embedding lookup reads a few rows of a [V, D] table.
- ``W[a:b]`` (a row slice) is a QuantizedTensor over the same blocks, as an
  ndarray slice is a view (Phi-3's fused projections are split this way).

Everything else an ndarray offers is deliberately absent, so a code path that
would silently dequantize a whole matrix fails loudly instead.

Dimension letters: R rows (outputs), C columns (inputs), T tokens.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from refllm.kernels.int8_matmul import INT8_TOKENS, int8_matmul, int8_matmul_serial, int8_reads, quantize_activations
from refllm.kernels.quant_formats import FORMAT_CODES, KERNEL_FORMATS
from refllm.kernels.quant_matmul import quant_matmul, quant_matmul_serial, quant_matvec, quant_matvec_serial
from refllm.quant.formats import ACTIVATIONS, UnsupportedFormatError, dequantize, stored_size
from refllm.quant.requantize import REQUANTIZE_FORMATS, requantize


def kernel_reads(format: str, shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` stored in ``format`` can stay quantized: a matrix in a kernel's format."""
    return len(shape) == 2 and format in FORMAT_CODES


def _parallel_min_weights() -> int:
    """Products of fewer multiply-adds than this run on the calling thread alone.

    A parallel kernel first wakes the idle workers of Numba's OpenMP pool. Sleeping workers
    (OMP_WAIT_POLICY=passive) took 60-70 us to wake on the project's 2-core VM, the time one
    core takes for ~1M weights: below that a second core cannot win its wake-up back. Workers
    that spin a while (refllm/kernels/threads.py's default) answer in ~2 us.
    """
    sleeping = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    return 1 << 20 if sleeping else 1 << 16


PARALLEL_MIN_WEIGHTS = _parallel_min_weights()


_loaded: set[str] = set()  # the activations whose products' kernels this process has loaded


def _load_kernels(activations: str) -> None:
    """Load the products of a model's passes (a prompt's, a decode step's) together, on a tiny matrix,
    the first time a product with ``activations`` runs.

    Loading a kernel runs Numba's compiler, whose pages ``refllm/kernels/compiler_memory.py`` then
    drops from the resident set. Loaded at the first product of a forward pass, before most weights
    are read, they no longer load at its end (the LM head's decode product after a prompt), when
    the compiler's pages would have sat on top of every weight (45 MB of a 1B model's peak)."""
    if activations in _loaded:
        return
    _loaded.add(activations)
    blocks = np.zeros((4, FORMAT_BLOCK_BYTES), np.uint8)
    blocks.flags.writeable = False  # as every QuantizedTensor's blocks: the same compiled kernels
    x = np.zeros((2, 32), np.float32)
    if activations == "int8":
        int8_matmul(blocks, FORMAT_CODES["Q4_0"], *quantize_activations(x))
    quant_matvec(blocks, FORMAT_CODES["Q4_0"], x[0])
    quant_matmul(blocks, FORMAT_CODES["Q4_0"], x)  # prompts, in either case


FORMAT_BLOCK_BYTES = 18  # one Q4_0 block: 32 weights


class QuantizedShapeError(ValueError):
    """An input whose shape or dtype does not fit a quantized matrix."""


class UnsupportedActivationsError(ValueError):
    """An ``activations`` setting that is not one of ACTIVATIONS."""


class QuantizedTensor:
    """W [R, C] in GGML format ``format``: ``blocks`` [R, C / B * type_size] uint8, row r = weight row r."""

    ndim = 2

    def __init__(self, blocks: np.ndarray, format: str, shape: tuple[int, int], activations: str = "float32"):
        if format not in FORMAT_CODES:
            raise UnsupportedFormatError(
                f"no quantized kernel reads {format}; they read {', '.join(KERNEL_FORMATS)}"
            )
        rows, cols = shape
        row_bytes = stored_size(format, (1, cols))  # refuses C that is not whole blocks
        if blocks.dtype != np.uint8 or blocks.shape != (rows, row_bytes):
            raise QuantizedShapeError(
                f"a {format} matrix of shape {shape} is uint8 blocks of shape {(rows, row_bytes)};"
                f" got {blocks.dtype} {blocks.shape}"
            )
        # Read-only, like the file-backed blocks of a GGUF: Numba compiles a kernel once per array
        # type, writability included, and each compiled kernel carries every format's code.
        self.blocks = np.ascontiguousarray(blocks).view()
        self.blocks.flags.writeable = False
        self.format = format
        self.shape = (rows, cols)
        self._code = FORMAT_CODES[format]
        self.use_activations(activations)

    @classmethod
    def from_raw(cls, raw: np.ndarray, format: str, shape: tuple[int, int]) -> QuantizedTensor:
        """The bytes of a stored tensor (e.g. a GGUF tensor's data) in format ``format`` -> QuantizedTensor."""
        data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        return cls(data.reshape(shape[0], -1), format, shape)

    @classmethod
    def quantize(cls, weights: np.ndarray, format: str) -> QuantizedTensor:
        """Float weights [R, C] -> QuantizedTensor in ``format`` (Q8_0 or Q4_0), as llama.cpp quantizes."""
        return cls(requantize(weights, format), format, weights.shape)

    def use_activations(self, activations: str) -> None:
        """Multiply activations as ``activations`` says from now on: "int8" where a kernel multiplies
        this format by int8 activations (Q4_0, Q4_1, Q8_0), float32 for the other formats."""
        if activations not in ACTIVATIONS:
            raise UnsupportedActivationsError(
                f"activations must be one of {', '.join(ACTIVATIONS)}; got {activations!r}"
            )
        self.activations = activations if int8_reads(self.format) else "float32"

    def with_activations(self, activations: str) -> QuantizedTensor:
        """The same blocks, multiplying activations as ``activations`` says (one of ACTIVATIONS)."""
        return QuantizedTensor(self.blocks, self.format, self.shape, activations)

    @property
    def code(self) -> int:
        """The format's code in the kernels (``refllm/kernels/quant_formats.py``)."""
        return self._code

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def dequantize(self) -> np.ndarray:
        """-> W [R, C] float32, by the spec (``refllm.quant.formats``)."""
        return dequantize(self.blocks, self.format, self.shape)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [..., C] float32 -> x @ W.T [..., R] float32."""
        rows, cols = self.shape
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim < 1 or x.shape[-1] != cols:
            raise QuantizedShapeError(
                f"a {self.format} matrix of shape {self.shape} multiplies a float32 ndarray [..., {cols}];"
                f" got {getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}"
            )
        tokens = np.ascontiguousarray(x.reshape(-1, cols))  # [T, C]
        _load_kernels(self.activations)
        # From two tokens on, decoding each row once and multiplying it into every token beats
        # decoding it in registers once per token (benchmarks/bench_quant_kernels.py --crossover).
        parallel = len(tokens) * rows * cols >= PARALLEL_MIN_WEIGHTS
        if self.activations == "int8" and len(tokens) < INT8_TOKENS:
            product = int8_matmul if parallel else int8_matmul_serial
            out = product(self.blocks, self._code, *quantize_activations(tokens))
        elif len(tokens) == 1:
            out = (quant_matvec if parallel else quant_matvec_serial)(self.blocks, self._code, tokens[0])
        else:
            out = (quant_matmul if parallel else quant_matmul_serial)(self.blocks, self._code, tokens)
        return out.reshape(*x.shape[:-1], rows)

    def __getitem__(self, index: Any) -> np.ndarray | QuantizedTensor:
        """``W[a:b]`` -> QuantizedTensor of those rows; ``W[ids]`` (integers) -> float32 [*ids.shape, C]."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step != 1:
                raise QuantizedShapeError(f"a QuantizedTensor slices contiguous rows; got step {step}")
            rows = (max(stop - start, 0), self.shape[1])
            return QuantizedTensor(self.blocks[start:stop], self.format, rows, self.activations)
        ids = np.asarray(index)
        if not np.issubdtype(ids.dtype, np.integer):
            raise QuantizedShapeError(f"a QuantizedTensor is indexed by a row slice or integer rows; got {index!r}")
        outside = (ids < 0) | (ids >= self.shape[0])
        if outside.any():
            raise QuantizedShapeError(f"row {ids[outside].flat[0]} is outside the {self.shape[0]} rows of {self!r}")
        picked = self.blocks[ids.reshape(-1)]
        return dequantize(picked, self.format, (len(picked), self.shape[1])).reshape(*ids.shape, self.shape[1])

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.format}, shape={self.shape}, nbytes={self.nbytes})"


def requantize_format(name: str) -> str:
    """A ``quantize=`` option ("q8_0", "Q4_0") -> ggml's spelling; refuses formats refllm cannot quantize to."""
    if name.upper() not in REQUANTIZE_FORMATS:
        raise UnsupportedFormatError(
            f"cannot quantize to {name!r}; choose one of {', '.join(f.lower() for f in REQUANTIZE_FORMATS)}"
        )
    return name.upper()


class RequantizedSource:
    """A ModelSource whose float matrices come out quantized to ``format`` (Q8_0 or Q4_0), one at a time.

    Matrices the source already hands out quantized are passed through, as are vectors (norms,
    biases), which stay float32.
    """

    def __init__(self, source: Any, format: str):
        self.source = source
        self.format = requantize_format(format)
        self.config = source.config
        self.tokenizer = source.tokenizer

    def tensor_names(self) -> list[str]:
        return self.source.tensor_names()

    def tensor(self, name: str) -> np.ndarray | QuantizedTensor:
        tensor = self.source.tensor(name)
        if isinstance(tensor, np.ndarray) and tensor.ndim == 2:
            return QuantizedTensor.quantize(tensor, self.format)
        return tensor

    def where(self, name: str | None) -> str:
        return self.source.where(name)
