"""The header of a GGUF file, read into plain Python values: its metadata and its tensor table.

A GGUF file is (``docs/gguf.md`` in ggml; gguf-py writes it, ``gguf.constants`` names its codes)

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:     key string | value type u32 | value
    tensor table: name string | n_dims u32 | dims u64[n_dims], innermost first | ggml type u32 | offset u64
    padding to ``general.alignment`` (32), then the tensor data, each tensor at data start + offset

where a string is a u64 byte count and UTF-8 bytes, and a value is a scalar, a string, or an
array: item type u32, count u64, the items. Every number is little-endian, or big-endian in a
file written for a big-endian machine (its version then reads as a multiple of 65536).

``gguf.GGUFReader`` turns every value into NumPy views of the file, several per item of an
array. A vocabulary is arrays of one item per token, so for Gemma 3's 262144 tokens that is
over a million small objects, seconds of parsing and hundreds of MB that, freed, leave the
allocator's arenas fragmented by whatever was allocated meanwhile. refllm needs the values,
not views: this reader makes one Python object per value (numeric arrays come out whole,
through ``np.frombuffer``) and gives the same values as the reader's ``contents()``
(tests/io/test_gguf_header.py holds them to it on every file the tests write).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml tensors have at most four dimensions
MAX_ARRAY_DEPTH = 4  # arrays of arrays, nested deeper than any writer nests them, are refused
# The fewest bytes each entry can take, to check a count read from the file before looping over it:
_MIN_VALUE_BYTES = 8 + 4 + 1  # key (an empty string) | value type | a one-byte value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name (empty) | n_dims of 0 | ggml type | offset
_MIN_ITEM_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 4 + 8}  # a string's length; an array's type, count

# Scalar value types as NumPy dtype codes, before the byte order.
_SCALARS = {
    GGUFValueType.UINT8: "u1", GGUFValueType.INT8: "i1", GGUFValueType.UINT16: "u2", GGUFValueType.INT16: "i2",
    GGUFValueType.UINT32: "u4", GGUFValueType.INT32: "i4", GGUFValueType.UINT64: "u8", GGUFValueType.INT64: "i8",
    GGUFValueType.FLOAT32: "f4", GGUFValueType.FLOAT64: "f8", GGUFValueType.BOOL: "?",
}  # fmt: skip


class GGUFHeaderError(ValueError):
    """Bytes that are not the header of a GGUF file refllm can read."""


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table."""

    name: str
    shape: tuple[int, ...]  # outermost first, as NumPy (the file lists dimensions innermost first)
    type: GGMLQuantizationType
    offset: int  # of its first byte, from the start of the file
    nbytes: int

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # key -> int, float, bool, str, or a list of them
    tensors: list[TensorInfo]
    data_offset: int  # where the tensor data starts
    little_endian: bool  # the byte order of every number in the file, tensor data included


def map_file(path: str | os.PathLike[str]) -> tuple[mmap.mmap, GGUFHeader]:
    """A GGUF file mapped read-only, and its header read from the map."""
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return mapped, read_header(mapped)


def read_header(data: np.ndarray | bytes) -> GGUFHeader:
    """The header of the GGUF file whose bytes are ``data`` (a uint8 memory map of it, say).

    Raises GGUFHeaderError, naming the field and its value, for a file that is not GGUF, of a
    version this reader does not know, cut short, or corrupt. Every count, length, dimension and
    offset is checked against the bytes left in the file before anything is allocated for it.
    """
    return _HeaderReader(memoryview(data).cast("B")).read()


class _HeaderReader:
    def __init__(self, data: memoryview):
        self.data = data
        self.position = 0
        self.order = "<"

    def read(self) -> GGUFHeader:
        if len(self.data) < 8 or struct.unpack_from("<I", self.data, 0)[0] != GGUF_MAGIC:
            raise GGUFHeaderError("no GGUF magic at the start")
        version = struct.unpack_from("<I", self.data, 4)[0]
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order = ">"
            version = struct.unpack_from(">I", self.data, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            raise GGUFHeaderError(f"GGUF version {version}; this reader knows {SUPPORTED_VERSIONS}")
        self.position = 8
        num_tensors, num_values = self._unpack("QQ")
        self._check_count(num_values, _MIN_VALUE_BYTES, "metadata entries")
        self._check_count(num_tensors, _MIN_TENSOR_BYTES, "tensors")
        metadata = {}
        for _ in range(num_values):
            key = self._string()
            if key in metadata:
                raise GGUFHeaderError(f"metadata key {key!r} appears twice")
            metadata[key] = self._value(self._value_type(f"metadata key {key!r}"))
        table = [self._tensor_row() for _ in range(num_tensors)]
        names = [row[0] for row in table]
        if len(set(names)) != len(names):
            twice = next(name for name in names if names.count(name) > 1)
            raise GGUFHeaderError(f"tensor {twice!r} appears twice in the tensor table")
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFHeaderError(f"general.alignment is {alignment!r}, not a power of two")
        data_offset = -(-self.position // alignment) * alignment
        tensors = [
            TensorInfo(name, shape, kind, data_offset + offset, self._tensor_bytes(name, shape, kind))
            for name, shape, kind, offset in table
        ]
        end_of_previous, previous = data_offset, None
        for tensor in sorted(tensors, key=lambda t: t.offset):
            if tensor.offset + tensor.nbytes > len(self.data):
                raise GGUFHeaderError(
                    f"tensor {tensor.name!r} ({tensor.nbytes} bytes at byte {tensor.offset}) runs past the end of the"
                    f" file ({len(self.data)} bytes)"
                )
            if tensor.offset < end_of_previous:
                raise GGUFHeaderError(f"tensor {tensor.name!r} overlaps tensor {previous!r} in the file")
            end_of_previous, previous = tensor.offset + tensor.nbytes, tensor.name
        return GGUFHeader(metadata, tensors, data_offset, little_endian=self.order == "<")

    def _unpack(self, formats: str) -> tuple:
        size = struct.calcsize(self.order + formats)
        if self.position + size > len(self.data):
            raise GGUFHeaderError(f"the header is cut short at byte {self.position} (the file has {len(self.data)})")
        values = struct.unpack_from(self.order + formats, self.data, self.position)
        self.position += size
        return values

    def _check_count(self, count: int, min_bytes: int, what: str) -> None:
        """Refuse a count of entries that could not fit in the rest of the file, before looping over it."""
        if count * min_bytes > len(self.data) - self.position:
            raise GGUFHeaderError(
                f"{count} {what} at byte {self.position} cannot fit in the {len(self.data) - self.position} bytes left"
            )

    def _value_type(self, where: str) -> GGUFValueType:
        (code,) = self._unpack("I")
        try:
            return GGUFValueType(code)
        except ValueError:
            raise GGUFHeaderError(f"{where} has value type {code}, which GGUF does not define") from None

    def _string(self) -> str:
        (size,) = self._unpack("Q")
        end = self.position + size
        if end > len(self.data):
            raise GGUFHeaderError(f"a string of {size} bytes at byte {self.position} runs past the end of the file")
        try:
            text = str(self.data[self.position : end], "utf-8")
        except UnicodeDecodeError as error:
            raise GGUFHeaderError(f"the string at byte {self.position} is not UTF-8 ({error.reason})") from None
        self.position = end
        return text

    def _value(self, kind: GGUFValueType, depth: int = 0) -> Any:
        if kind == GGUFValueType.STRING:
            return self._string()
        if kind == GGUFValueType.ARRAY:
            if depth == MAX_ARRAY_DEPTH:
                raise GGUFHeaderError(f"arrays nested more than {MAX_ARRAY_DEPTH} deep at byte {self.position}")
            item_kind = self._value_type(f"the array at byte {self.position}")
            (count,) = self._unpack("Q")
            if item_kind in _SCALARS:
                return self._numbers(item_kind, count).tolist()
            self._check_count(count, _MIN_ITEM_BYTES[item_kind], f"{item_kind.name} items")
            return [self._value(item_kind, depth + 1) for _ in range(count)]
        return self._numbers(kind, 1).tolist()[0]

    def _numbers(self, kind: GGUFValueType, count: int) -> np.ndarray:
        dtype = np.dtype(self.order + _SCALARS[kind])
        if self.position + count * dtype.itemsize > len(self.data):
            raise GGUFHeaderError(f"{count} values at byte {self.position} run past the end of the file")
        numbers = np.frombuffer(self.data, dtype, count, self.position)
        self.position += numbers.nbytes
        return numbers

    def _tensor_row(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        (num_dims,) = self._unpack("I")
        if not 1 <= num_dims <= MAX_DIMS:
            raise GGUFHeaderError(f"tensor {name!r} has n_dims = {num_dims}; GGUF tensors have 1 to {MAX_DIMS}")
        dims = self._unpack("Q" * num_dims)
        if 0 in dims:
            raise GGUFHeaderError(f"tensor {name!r} has a dimension of 0 (dims {list(dims)})")
        code, offset = self._unpack("IQ")
        try:
            kind = GGMLQuantizationType(code)
        except ValueError:
            raise GGUFHeaderError(f"tensor {name!r} has ggml type {code}, which ggml does not define") from None
        return name, tuple(reversed(dims)), kind, offset

    @staticmethod
    def _tensor_bytes(name: str, shape: tuple[int, ...], kind: GGMLQuantizationType) -> int:
        if kind not in GGML_QUANT_SIZES:
            raise GGUFHeaderError(f"tensor {name!r} has ggml type {kind.name}, whose block size gguf does not know")
        block_size, type_size = GGML_QUANT_SIZES[kind]
        elements = math.prod(shape)  # Python integers: a product of four u64 dimensions does not wrap around
        if elements % block_size:
            raise GGUFHeaderError(f"tensor {name!r} of {elements} elements is not whole {kind.name} blocks")
        return elements // block_size * type_size
